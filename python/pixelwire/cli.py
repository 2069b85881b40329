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
    from pixelwire.resize import ResizePolicy
    from pixelwire.signing import secret_from_env
    from pixelwire.transfer import MiB, _decode_at, _env_float, _env_int, allow_private_from_env

    image_kwargs = args.media_io_kwargs.get("image", {}) if isinstance(args.media_io_kwargs, dict) else {}
    resize = None
    if args.model:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        resize = ResizePolicy.from_pretrained(args.model, args.mm_processor_kwargs)
    config = frontend.FrontendConfig(
        upstream=args.upstream,
        decode_at=_decode_at(args.decode_at),
        pool_bytes=args.pool_bytes or _env_int("PIXELWIRE_POOL_BYTES", 256 * MiB),
        region_bytes=args.region_bytes,
        lease_seconds=args.lease_seconds or _env_float("PIXELWIRE_LEASE_SECONDS", 60.0),
        secret=secret_from_env(),
        image_kwargs=image_kwargs,
        upstream_timeout=args.upstream_timeout,
        allowed_domains=args.allowed_domains,
        allow_private=args.allow_private or allow_private_from_env(),
        check_upstream=not args.no_check_upstream,
        max_request_bytes=args.max_request_bytes,
        max_images_per_request=args.max_images_per_request,
        max_image_bytes_per_request=args.max_image_bytes_per_request,
        max_fetches_per_request=args.max_fetches_per_request,
        resize=resize,
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
    decode.add_argument("--mode", default="RGB", choices=["RGB", "RGBA", "L"])
    demo = commands.add_parser("demo", help="frontend and worker processes moving images over NIXL")
    demo.add_argument("paths", nargs="*", type=Path, help="image files or folders (default: generated)")
    demo.add_argument("--per-size", type=int, default=20, help="generated images of each size")
    bench = commands.add_parser("bench", help="benchmarks")
    benches = bench.add_subparsers(dest="which", required=True)
    bench_transfer = benches.add_parser("transfer", help="frontend-to-worker NIXL transfer, two processes")
    bench_transfer.add_argument("--repeats", type=int, default=50)
    bench_transfer.add_argument("--device", default="cpu")
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
    front.add_argument("--host", default="0.0.0.0")
    front.add_argument("--port", type=int, default=8080)
    front.add_argument(
        "--decode-at",
        choices=["frontend", "worker"],
        default=None,
        help="where images are decoded (default: PIXELWIRE_DECODE_AT, else frontend)",
    )
    front.add_argument("--pool-bytes", type=int, default=None, help="registered pixel pool (default 256 MiB)")
    front.add_argument(
        "--region-bytes",
        type=int,
        default=64 << 20,
        help="the pool grows by registered regions of this size (default 64 MiB; larger images: their own)",
    )
    front.add_argument("--lease-seconds", type=float, default=None)
    front.add_argument(
        "--media-io-kwargs",
        type=json.loads,
        default={},
        help="the same JSON as vLLM's --media-io-kwargs; its 'image' part is used",
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
    front.add_argument("--upstream-timeout", type=float, default=600.0)
    front.add_argument(
        "--max-request-bytes",
        type=int,
        default=64 << 20,
        help="request body cap, 413 above it (default 64 MiB: OpenAI's 50 MB request payload fits)",
    )
    front.add_argument(
        "--max-images-per-request",
        type=int,
        default=32,
        help="images in one request, 400 above it, checked before any fetch (default 32; give it vLLM's "
        "--limit-mm-per-prompt image count when that is lower)",
    )
    front.add_argument(
        "--max-fetches-per-request",
        type=int,
        default=8,
        help="image URLs of one request fetched at once (default 8): one request cannot hold "
        "every connection the others need",
    )
    front.add_argument(
        "--max-image-bytes-per-request",
        type=int,
        default=64 << 20,
        help="encoded image bytes in one request, 400 above it: data: URLs counted before any work, "
        "fetched images as they arrive (default 64 MiB)",
    )
    front.add_argument(
        "--no-check-upstream",
        action="store_true",
        help="do not wait for the upstream to show the pixelwire connector",
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
        from pixelwire.benchmarks import transfer

        transfer(repeats=args.repeats, device=args.device)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
