"""The `pixelwire` command line."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import logging
import os
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from pixelwire import config
from pixelwire._native import PixelwireError, decode_image, probe_image

# What `decode` and `demo` take from a folder: the file types pixelwire decodes.
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".ico", ".tga", ".ppm", ".qoi"}
)
# The benchmarks: their module (imported only when that benchmark runs or
# shows its help) and their one-line help.
BENCHES = {
    "transfer": ("pixelwire.bench.transfer", "frontend-to-worker NIXL transfer, two processes"),
    "serve": (
        "pixelwire.bench.serve",
        "real vLLM servers with and without the frontend under load: latency, CPU, bytes, charts",
    ),
}


class CommandError(Exception):
    """A mistake in how a command was called or set up: printed as one line
    (``pixelwire <command>: error: ...``), exit status 2, no traceback."""


def image_files(paths: list[Path]) -> list[Path]:
    """``paths`` with each folder replaced by the image files in it (by
    suffix, sorted; not its subfolders). A path that does not exist, or a
    folder without images, is a :class:`CommandError`."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
            if not found:
                raise CommandError(
                    f"{path} holds no image files (looked for {', '.join(sorted(IMAGE_SUFFIXES))})"
                )
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise CommandError(f"{path}: no such file or folder")
    return files


def _size(text: str) -> int:
    """An argparse type: :func:`pixelwire.config.parse_bytes`, its message kept."""
    try:
        return config.parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object, as vLLM's JSON options take; what is
    wrong with the text is said, with where."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object ({{...}})")
    return value


class _HelpFormatter(argparse.HelpFormatter):
    """Descriptions by paragraph (each filled to the width, a list kept as
    written), and each option's default after its help unless the help
    names it already."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.strip().split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.lstrip().startswith("- ") for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(
                    textwrap.fill(
                        " ".join(paragraph.split()), width, initial_indent=indent, subsequent_indent=indent
                    )
                )
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or "default" in text
            or action.default in (None, False, argparse.SUPPRESS)
        ):
            return text
        shown = ", ".join(map(str, action.default)) if isinstance(action.default, list) else "%(default)s"
        return f"{text} (default: {shown})"


def _decode(paths: list[Path], mode: str) -> int:
    files = image_files(paths)
    failures = 0
    print(f"{'file':40} {'format':6} {'shape':>16} {'decode ms':>10}")
    for path in files:
        data = path.read_bytes()
        try:
            info = probe_image(data)
            start = time.perf_counter()
            pixels = decode_image(data, mode=mode)  # type: ignore[arg-type]
            elapsed = (time.perf_counter() - start) * 1000
        except PixelwireError as error:
            failures += 1
            print(f"{path.name[:40]:40} {type(error).__name__}: {error}")
            continue
        shape = "x".join(str(n) for n in pixels.shape)
        print(f"{path.name[:40]:40} {info['format']:6} {shape:>16} {elapsed:10.2f}")
    if failures:
        print(f"{failures} of {len(files)} files failed to decode", file=sys.stderr)
    return 1 if failures else 0


def _frontend(args: argparse.Namespace) -> int:
    from pixelwire.frontend.allocator import keep_heap_memory

    # Before the first large block: a threshold applies to blocks allocated after it.
    keep_heap_memory()
    from pixelwire import frontend
    from pixelwire.config import FrontendConfig
    from pixelwire.frontend.nixl_interfaces import InterfaceNotFound, listen_devices
    from pixelwire.frontend.upstream_watch import upstream_url
    from pixelwire.processed import patch_layout
    from pixelwire.resize import image_resize_policy, video_resize_policy
    from pixelwire.video.sampling import model_video_loader

    try:
        upstream = upstream_url(args.upstream)
        upstream_metrics = [upstream_url(url, "--upstream-metrics") for url in args.upstream_metrics or []]
    except ValueError as error:
        raise CommandError(str(error)) from None
    media_io_kwargs = args.media_io_kwargs
    image_kwargs = media_io_kwargs.get("image", {})
    video_kwargs = media_io_kwargs.get("video", {})
    resize = video_resize = video_loader = processed = None
    if args.resize_approximate and not args.model:
        raise CommandError("--resize-approximate resizes for the model --model names: give --model")
    if args.model:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            resize = image_resize_policy(
                args.model, args.mm_processor_kwargs, approximate=args.resize_approximate
            )
            video_resize = video_resize_policy(args.model, args.mm_processor_kwargs)
            if args.processed_inputs:
                processed = patch_layout(
                    args.model,
                    args.mm_processor_kwargs,
                    resize,
                    device_normalize=args.mm_device_do_normalize,
                )
            video_loader = model_video_loader(args.model)
        except (OSError, ValueError) as error:
            raise CommandError(f"--model {args.model}: {error}") from None
    bounds = {
        "--max-connections": args.max_connections,
        "--max-connections-per-client": args.max_connections_per_client,
        "--header-timeout": args.header_timeout,
        "--min-body-rate": args.min_body_rate,
    }
    for flag, value in bounds.items():
        if value is not None and value <= 0:
            # Zero would close every connection, or time every body out.
            raise CommandError(f"{flag} must be positive, not {value:g}")
    try:
        nixl_devices = listen_devices(args.nixl_interface, upstream)
    except InterfaceNotFound as error:
        raise CommandError(str(error)) from None
    config = FrontendConfig.from_env(
        upstream,
        upstream_metrics=upstream_metrics,
        nixl_devices=nixl_devices,
        decode_at=args.decode_at,
        pool_bytes=args.pool_bytes,
        cache_bytes=args.cache_bytes,
        region_bytes=args.region_bytes,
        lease_seconds=args.lease_seconds,
        image_kwargs=image_kwargs,
        video_kwargs=video_kwargs,
        video_loader=video_loader,
        video_resize=video_resize,
        max_video_bytes=args.max_video_bytes,
        max_video_frames=args.max_video_frames,
        max_video_pixels=args.max_video_pixels,
        max_video_frame_bytes=args.max_video_frame_bytes,
        max_video_seconds=args.max_video_seconds,
        max_video_decode_pixels=args.max_video_decode_pixels,
        upstream_timeout=args.upstream_timeout,
        drain_seconds=args.drain_seconds,
        allowed_domains=args.allowed_domains,
        allow_private=args.allow_private,
        trust_request_mm_kwargs=args.trust_request_mm_kwargs,
        check_upstream=not args.no_check_upstream,
        max_request_bytes=args.max_request_bytes,
        max_images_per_request=args.max_images_per_request,
        max_image_bytes_per_request=args.max_image_bytes_per_request,
        max_pixels_per_request=args.max_pixels_per_request,
        max_fetches_per_request=args.max_fetches_per_request,
        max_json_values=args.max_json_values,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        header_timeout=args.header_timeout,
        min_body_rate=args.min_body_rate,
        resize=resize,
        processed=processed,
        api_keys=args.api_key,
        access_log=args.access_log or None,
    )
    if config.decode_at == "frontend":
        if config.cache_bytes > config.pool_bytes:
            raise CommandError(
                f"--cache-bytes ({config.cache_bytes}) is over --pool-bytes ({config.pool_bytes}): the "
                "cache keeps published images inside the pool; give a smaller --cache-bytes (or "
                "PIXELWIRE_CACHE_BYTES), or a larger --pool-bytes"
            )
        _load_nixl()
    frontend.run(config, args.host, args.port)
    return 0


def _load_nixl() -> None:
    """NIXL's runtime, loaded before the frontend says it serves: without
    it, one line saying what to install, not a traceback at start-up."""
    from pixelwire.nixl import ensure_nixl

    try:
        ensure_nixl()
    except PixelwireError as error:
        raise CommandError(
            f"{error}; or run the frontend with --decode-at worker, which publishes nothing over NIXL"
        ) from None


def _selected_bench(argv: list[str]) -> str | None:
    """The benchmark ``argv`` names (``bench serve ...``), if any: only its
    module is imported to add its options."""
    words = [word for word in argv if not word.startswith("-")]
    return words[1] if len(words) > 1 and words[0] == "bench" and words[1] in BENCHES else None


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser for ``argv``: every command, and the options of the one
    benchmark ``argv`` names (the others' modules stay unimported)."""
    parser = argparse.ArgumentParser(prog="pixelwire", description=__doc__, formatter_class=_HelpFormatter)
    version = importlib.metadata.version("pixelwire")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")
    commands = parser.add_subparsers(dest="command", required=True)
    decode = commands.add_parser(
        "decode",
        help="decode image files and print format, shape and time",
        description="Decodes image files (a folder: the images in it) and prints format, shape and time.",
        formatter_class=_HelpFormatter,
    )
    decode.add_argument("files", nargs="+", type=Path, help="image files or folders of them")
    decode.add_argument("--mode", default="RGB", choices=config.DECODED_MODES, help="the mode decoded into")
    demo = commands.add_parser(
        "demo",
        help="frontend and worker processes moving images over NIXL",
        description="A publisher process (what the frontend runs) publishes images over NIXL; this "
        "process reads them as a vLLM worker would, checks every pixel and prints a table. Needs NIXL's "
        "runtime: pip install --no-deps nixl-cu12==1.5.1.",
        formatter_class=_HelpFormatter,
    )
    demo.add_argument(
        "paths", nargs="*", type=Path, help="image files or folders of them (default: generated images)"
    )
    demo.add_argument("--per-size", type=int, default=20, help="generated images of each size")
    bench = commands.add_parser("bench", help="benchmarks", formatter_class=_HelpFormatter)
    benches = bench.add_subparsers(dest="which", required=True)
    selected = _selected_bench(argv)
    for name, (module_name, summary) in BENCHES.items():
        sub = benches.add_parser(name, help=summary, formatter_class=_HelpFormatter)
        if name == selected:
            module = importlib.import_module(module_name)
            sub.description = module.__doc__
            module.add_arguments(sub)
    front = commands.add_parser(
        "frontend",
        help="OpenAI-compatible proxy that decodes images for vLLM",
        description="An OpenAI-compatible proxy in front of vLLM: it fetches and decodes each request's "
        "images and hands vLLM's pixelwire plug-in the pixels over NIXL (or, with --decode-at worker, "
        "the images to decode itself).",
        formatter_class=_HelpFormatter,
    )
    front.add_argument(
        "--upstream",
        required=True,
        help="the vLLM server's address, e.g. http://127.0.0.1:8000, without /v1 (required)",
    )
    front.add_argument(
        "--upstream-metrics",
        action="append",
        default=None,
        metavar="URL",
        help="a vLLM server's /metrics page, e.g. http://10.0.0.5:8000/metrics, where the handshake reads "
        "the plug-in's settings, for an --upstream that is a router or load balancer that does not pass "
        "vLLM's /metrics on (repeatable: each server behind it; default: the upstream's /metrics)",
    )
    front.add_argument(
        "--host",
        default="0.0.0.0",
        help="address to listen on (default 0.0.0.0: every interface; without --api-key the frontend "
        "warns at start-up that anyone who reaches it is served)",
    )
    front.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    front.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="a Bearer token clients must send (Authorization) before any fetch, decode or publish, "
        "as vLLM's --api-key (repeatable; default: VLLM_API_KEY, else none); forwarded to vLLM",
    )
    front.add_argument(
        "--decode-at",
        choices=["frontend", "worker"],
        default=None,
        help="where images are decoded (default: PIXELWIRE_DECODE_AT, else frontend)",
    )
    front.add_argument(
        "--pool-bytes",
        type=_size,
        default=None,
        help="registered pixel pool, in bytes or with a unit (512MiB, 1GiB, 2G) (default: "
        f"PIXELWIRE_POOL_BYTES, else {config.POOL_BYTES >> 20}MiB)",
    )
    front.add_argument(
        "--cache-bytes",
        type=_size,
        default=None,
        help="pool bytes of published images kept to serve a repeated image without decoding it again, "
        "within --pool-bytes (evicted first when the pool is full); 0 turns it off (default: "
        f"PIXELWIRE_CACHE_BYTES, else {config.CACHE_BYTES >> 20}MiB, at most half --pool-bytes)",
    )
    front.add_argument(
        "--region-bytes",
        type=_size,
        default=None,
        help="the pool grows by registered regions of this size (default: PIXELWIRE_REGION_BYTES, else "
        f"{config.REGION_BYTES >> 20}MiB; larger images: their own)",
    )
    front.add_argument(
        "--lease-seconds",
        type=float,
        default=None,
        help=f"how long an image waits for its reader (default: PIXELWIRE_LEASE_SECONDS, else "
        f"{config.LEASE_SECONDS:g} s)",
    )
    front.add_argument(
        "--media-io-kwargs",
        type=_json_object,
        default={},
        help="the same JSON as vLLM's --media-io-kwargs; its 'image' and 'video' parts are used (a "
        "video is sampled here only when the loader is known: 'video_backend' here, or --model) "
        "(default: none)",
    )
    front.add_argument(
        "--allowed-domains",
        nargs="+",
        default=None,
        help="hosts images may come from ('*.example.com' for subdomains) (default: any public host)",
    )
    front.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="client connections held open at once; more are closed as they come "
        f"(default {config.MAX_CONNECTIONS})",
    )
    front.add_argument(
        "--max-connections-per-client",
        type=int,
        default=None,
        help="client connections held open from one address (default "
        f"{config.MAX_CONNECTIONS_PER_CLIENT}; behind a load balancer, raise it to its maxconn)",
    )
    front.add_argument(
        "--header-timeout",
        type=float,
        default=None,
        help="seconds a request head may take to arrive, from the connection's opening or its last "
        f"answer; the connection is closed after (default {config.HEADER_TIMEOUT:g})",
    )
    front.add_argument(
        "--min-body-rate",
        type=int,
        default=None,
        help="bytes a second a request body must keep up after the header timeout's grace; slower is "
        f"a 408 (default {config.MIN_BODY_RATE})",
    )
    front.add_argument(
        "--nixl-interface",
        default=None,
        help="the network interfaces the NIXL agent listens on, as UCX_NET_DEVICES names them "
        "(eth0, mlx5_0:1, comma-separated; 'all' for every one); default: lo when the upstream is on "
        "this host, else the interface toward the upstream and every RDMA port "
        "(UCX_NET_DEVICES in the environment wins)",
    )
    front.add_argument(
        "--allow-private",
        action="store_true",
        help="let image URLs reach private, loopback and link-local addresses (also "
        "PIXELWIRE_ALLOW_PRIVATE=1; worker mode: set it on vLLM too)",
    )
    front.add_argument(
        "--trust-request-mm-kwargs",
        action="store_true",
        help="honour a request's own media_io_kwargs and mm_processor_kwargs, as vLLM's flag of that name "
        "(set it on both; default: such a request is refused with vLLM's 400 before any work)",
    )
    front.add_argument(
        "--model",
        default=None,
        help="the model vLLM serves (a folder or a Hub id): images ship at the size its image processor "
        "resizes to (its processor configs are read; default: none, images ship at their decoded size)",
    )
    front.add_argument(
        "--resize-approximate",
        action="store_true",
        help="with --model, also resize for processors that resize the original twice (LLaVA-OneVision: "
        "the grid-size image ships, its tiles exact, its base tile a resize of it); vLLM's plug-in "
        "must allow it too (PIXELWIRE_RESIZE_APPROXIMATE=1) (default: off, those images ship at full size)",
    )
    front.add_argument(
        "--processed-inputs",
        action=argparse.BooleanOptionalAction,
        default=config.PROCESSED_INPUTS,
        help="with --model of a processor pixelwire makes the outputs of (Qwen2-VL, Qwen2.5-VL, "
        "Qwen3-VL), RGB images ship as that processor's output (its patch rows and grid), which "
        "vLLM's plug-in hands the engine as they are: vLLM's API server makes no pass over their pixels "
        "(default: on; --no-processed-inputs ships the resized pixels)",
    )
    front.add_argument(
        "--mm-device-do-normalize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="as vLLM's flag of that name, which the processed inputs follow: on (vLLM's default for the "
        "covered models), the processor's uint8 patch rows; off, its float32 normalised rows, 4 bytes a "
        "value across NIXL (default: on)",
    )
    front.add_argument(
        "--mm-processor-kwargs",
        type=_json_object,
        default=None,
        help="the same JSON as vLLM's --mm-processor-kwargs (e.g. '{\"max_pixels\": 1003520}'; "
        "default: none)",
    )
    front.add_argument(
        "--upstream-timeout",
        type=float,
        default=config.UPSTREAM_TIMEOUT,
        help="seconds a forwarded request may take, its answer included "
        f"(default {config.UPSTREAM_TIMEOUT:g})",
    )
    front.add_argument(
        "--drain-seconds",
        type=float,
        default=config.DRAIN_SECONDS,
        help="after SIGTERM, seconds the frontend keeps serving while /health answers 503 (so a load "
        "balancer takes it out), before it stops listening and lets the requests in flight finish; "
        f"sooner once no request has been in flight or come for {config.DRAIN_IDLE_SECONDS:g} s "
        f"(default {config.DRAIN_SECONDS:g})",
    )
    front.add_argument(
        "--max-request-bytes",
        type=_size,
        default=config.MAX_REQUEST_BYTES,
        help=f"request body cap, 413 above it (default {config.MAX_REQUEST_BYTES >> 20} MiB: OpenAI's "
        "50 MB request payload fits)",
    )
    front.add_argument(
        "--max-images-per-request",
        type=int,
        default=config.MAX_IMAGES_PER_REQUEST,
        help="images in one request, 400 above it, checked before any fetch (default "
        f"{config.MAX_IMAGES_PER_REQUEST}; give it vLLM's --limit-mm-per-prompt image count when that "
        "is lower)",
    )
    front.add_argument(
        "--max-fetches-per-request",
        type=int,
        default=config.MAX_FETCHES_PER_REQUEST,
        help=f"image URLs of one request fetched at once (default {config.MAX_FETCHES_PER_REQUEST}): one "
        "request cannot hold every connection the others need",
    )
    front.add_argument(
        "--max-image-bytes-per-request",
        type=_size,
        default=config.MAX_IMAGE_BYTES_PER_REQUEST,
        help="encoded image bytes in one request, 400 above it: data: URLs counted before any work, "
        f"fetched images as they arrive (default {config.MAX_IMAGE_BYTES_PER_REQUEST >> 20} MiB)",
    )
    front.add_argument(
        "--max-pixels-per-request",
        type=int,
        default=config.MAX_PIXELS_PER_REQUEST,
        help="decoded pixels of one request's images, 400 above it, from their headers before any "
        f"decode (default {config.MAX_PIXELS_PER_REQUEST:,}: 32 photos of 12 MP fit); a request's "
        "images must also fit in the pool at once",
    )
    front.add_argument(
        "--max-video-bytes",
        type=_size,
        default=config.FRONTEND_MAX_VIDEO_BYTES,
        help="encoded bytes of one video, 400 above it "
        f"(default {config.FRONTEND_MAX_VIDEO_BYTES >> 20} MiB)",
    )
    front.add_argument(
        "--max-video-frames",
        type=int,
        default=config.FRONTEND_MAX_VIDEO_FRAMES,
        help=f"frames sampled from one video, 400 above it (default {config.FRONTEND_MAX_VIDEO_FRAMES})",
    )
    front.add_argument(
        "--max-video-pixels",
        type=int,
        default=config.FRONTEND_MAX_VIDEO_PIXELS,
        help=f"pixels of one video frame, 400 above it, from the stream's headers (default "
        f"{config.FRONTEND_MAX_VIDEO_PIXELS:,}: 4K UHD)",
    )
    front.add_argument(
        "--max-video-frame-bytes",
        type=_size,
        default=config.FRONTEND_MAX_VIDEO_FRAME_BYTES,
        help=f"bytes of one video's sampled RGB frames, 400 above it, before any is decoded (default "
        f"{config.FRONTEND_MAX_VIDEO_FRAME_BYTES >> 20} MiB, and never more than --pool-bytes)",
    )
    front.add_argument(
        "--max-video-seconds",
        type=int,
        default=config.FRONTEND_MAX_VIDEO_SECONDS,
        help="length of one video, 400 above it, from its headers before any frame is decoded (default "
        f"{config.FRONTEND_MAX_VIDEO_SECONDS} s)",
    )
    front.add_argument(
        "--max-video-decode-pixels",
        type=int,
        default=config.FRONTEND_MAX_VIDEO_DECODE_PIXELS,
        help="pixels decoded for one video (every frame up to the last sampled one, whatever rate its "
        "header claims), 400 above it, from its headers before any frame memory and as it decodes "
        f"(default {config.FRONTEND_MAX_VIDEO_DECODE_PIXELS:,}: 3 hours of 1080p at 30 fps)",
    )
    front.add_argument(
        "--max-json-values",
        type=int,
        default=config.MAX_JSON_VALUES,
        help=f"JSON values in one request body, 400 above it, bounded before parsing (default "
        f"{config.MAX_JSON_VALUES}; counts every '{{', '[' and ',' byte, so it is an upper bound)",
    )
    front.add_argument(
        "--no-check-upstream",
        action="store_true",
        help="skip the handshake: never refuse image requests for the upstream worker's settings "
        "(connector, version, secret, resize, private-address policy, API key)",
    )
    front.add_argument(
        "--access-log",
        action="store_true",
        help="log a line per request: method, path, status, bytes sent, milliseconds, media count "
        "(never a body or a header; also PIXELWIRE_ACCESS_LOG=1; default: off)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    # NIXL logs every connection event at INFO; keep the tables readable.
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    try:
        return _run(args)
    except CommandError as error:
        print(f"pixelwire {args.command}: error: {error}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    if args.command == "decode":
        return _decode(args.files, args.mode)
    if args.command == "demo":
        from pixelwire import demo as demo_module

        return demo_module.main(image_files(args.paths), args.per_size)
    if args.command == "frontend":
        return _frontend(args)
    if args.command == "bench":
        module: Any = importlib.import_module(BENCHES[args.which][0])
        return int(module.run(args))
    return 2


if __name__ == "__main__":
    sys.exit(main())
