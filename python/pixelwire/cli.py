"""The `pixelwire` command line."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import sys
import time
from pathlib import Path

from pixelwire import config
from pixelwire._native import PixelwireError, decode_image, probe_image


def _decode(paths: list[Path], mode: str) -> int:
    failures = 0
    print(f"{'file':40} {'format':6} {'shape':>16} {'decode ms':>10}")
    for path in paths:
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
    return 1 if failures == len(paths) else 0


def _frontend(args: argparse.Namespace) -> int:
    from pixelwire import frontend
    from pixelwire.config import FrontendConfig
    from pixelwire.resize import ResizePolicy, video_resize_policy
    from pixelwire.video.sampling import model_video_loader

    media_io_kwargs = args.media_io_kwargs if isinstance(args.media_io_kwargs, dict) else {}
    image_kwargs = media_io_kwargs.get("image", {})
    video_kwargs = media_io_kwargs.get("video", {})
    resize = video_resize = video_loader = None
    if args.model:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        resize = ResizePolicy.from_pretrained(args.model, args.mm_processor_kwargs)
        video_resize = video_resize_policy(args.model, args.mm_processor_kwargs)
        video_loader = model_video_loader(args.model)
    config = FrontendConfig.from_env(
        args.upstream,
        decode_at=args.decode_at,
        pool_bytes=args.pool_bytes,
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
        upstream_timeout=args.upstream_timeout,
        allowed_domains=args.allowed_domains,
        allow_private=args.allow_private,
        check_upstream=not args.no_check_upstream,
        max_request_bytes=args.max_request_bytes,
        max_images_per_request=args.max_images_per_request,
        max_image_bytes_per_request=args.max_image_bytes_per_request,
        max_pixels_per_request=args.max_pixels_per_request,
        max_fetches_per_request=args.max_fetches_per_request,
        max_json_values=args.max_json_values,
        resize=resize,
        api_keys=args.api_key,
    )
    frontend.run(config, args.host, args.port)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pixelwire", description=__doc__)
    version = importlib.metadata.version("pixelwire")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")
    commands = parser.add_subparsers(dest="command", required=True)
    decode = commands.add_parser("decode", help="decode image files and print format, shape and time")
    decode.add_argument("files", nargs="+", type=Path)
    decode.add_argument("--mode", default="RGB", choices=config.DECODED_MODES)
    demo = commands.add_parser("demo", help="frontend and worker processes moving images over NIXL")
    demo.add_argument("paths", nargs="*", type=Path, help="image files or folders (default: generated)")
    demo.add_argument("--per-size", type=int, default=20, help="generated images of each size")
    bench = commands.add_parser("bench", help="benchmarks")
    benches = bench.add_subparsers(dest="which", required=True)
    from pixelwire.bench import transfer as bench_transfer

    bench_transfer.add_arguments(
        benches.add_parser(
            "transfer",
            help="frontend-to-worker NIXL transfer, two processes",
            description=(bench_transfer.__doc__ or "").split("\n\n")[0],
        )
    )
    from pixelwire.bench import serve as bench_serve

    bench_serve.add_arguments(
        benches.add_parser(
            "serve",
            help="real vLLM servers with and without the frontend under load: latency, CPU, bytes, charts",
            description=(bench_serve.__doc__ or "").split("\n\n")[0],
        )
    )
    front = commands.add_parser("frontend", help="OpenAI-compatible proxy that decodes images for vLLM")
    front.add_argument("--upstream", required=True, help="the vLLM server, e.g. http://127.0.0.1:8000")
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
        type=int,
        default=None,
        help=f"registered pixel pool (default: PIXELWIRE_POOL_BYTES, else {config.POOL_BYTES >> 20} MiB)",
    )
    front.add_argument(
        "--region-bytes",
        type=int,
        default=None,
        help="the pool grows by registered regions of this size (default: PIXELWIRE_REGION_BYTES, else "
        f"{config.REGION_BYTES >> 20} MiB; larger images: their own)",
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
        type=json.loads,
        default={},
        help="the same JSON as vLLM's --media-io-kwargs; its 'image' and 'video' parts are used (a "
        "video is sampled here only when the loader is known: 'video_backend' here, or --model)",
    )
    front.add_argument(
        "--allowed-domains",
        nargs="+",
        default=None,
        help="hosts images may come from ('*.example.com' for subdomains)",
    )
    front.add_argument(
        "--allow-private",
        action="store_true",
        help="let image URLs reach private, loopback and link-local addresses",
    )
    front.add_argument(
        "--model",
        default=None,
        help="the model vLLM serves (a folder or a Hub id): images ship at the size its image processor "
        "resizes to (only its preprocessor_config.json is read)",
    )
    front.add_argument(
        "--mm-processor-kwargs",
        type=json.loads,
        default=None,
        help="the same JSON as vLLM's --mm-processor-kwargs (e.g. '{\"max_pixels\": 1003520}')",
    )
    front.add_argument(
        "--upstream-timeout",
        type=float,
        default=config.UPSTREAM_TIMEOUT,
        help="seconds a forwarded request may take, its answer included "
        f"(default {config.UPSTREAM_TIMEOUT:g})",
    )
    front.add_argument(
        "--max-request-bytes",
        type=int,
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
        type=int,
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
        type=int,
        default=config.MAX_VIDEO_BYTES,
        help=f"encoded bytes of one video, 400 above it (default {config.MAX_VIDEO_BYTES >> 20} MiB)",
    )
    front.add_argument(
        "--max-video-frames",
        type=int,
        default=config.MAX_VIDEO_FRAMES,
        help=f"frames sampled from one video, 400 above it (default {config.MAX_VIDEO_FRAMES})",
    )
    front.add_argument(
        "--max-video-pixels",
        type=int,
        default=config.MAX_VIDEO_PIXELS,
        help=f"pixels of one video frame, 400 above it, from the stream's headers (default "
        f"{config.MAX_VIDEO_PIXELS:,}: 4K UHD)",
    )
    front.add_argument(
        "--max-video-frame-bytes",
        type=int,
        default=config.MAX_VIDEO_FRAME_BYTES,
        help=f"bytes of one video's sampled RGB frames, 400 above it, before any is decoded (default "
        f"{config.MAX_VIDEO_FRAME_BYTES >> 20} MiB, and never more than --pool-bytes)",
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
        "(connector, version, secret, resize, private-address policy)",
    )
    args = parser.parse_args(argv)
    # NIXL logs every connection event at INFO; keep the tables readable.
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    if args.command == "decode":
        return _decode(args.files, args.mode)
    if args.command == "demo":
        from pixelwire import demo as demo_module

        return demo_module.main(args.paths, args.per_size)
    if args.command == "frontend":
        return _frontend(args)
    if args.command == "bench" and args.which == "serve":
        return bench_serve.run(args)
    if args.command == "bench":
        return bench_transfer.run(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
