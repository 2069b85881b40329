"""The `pixelwire` command line."""

from __future__ import annotations

import argparse
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pixelwire", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    decode = commands.add_parser("decode", help="decode image files and print format, shape and time")
    decode.add_argument("files", nargs="+", type=Path)
    decode.add_argument("--mode", default="RGB", choices=["RGB", "RGBA", "L"])
    demo = commands.add_parser("demo", help="frontend and worker processes moving images over NIXL")
    demo.add_argument("paths", nargs="*", type=Path, help="image files or folders (default: generated)")
    demo.add_argument("--per-size", type=int, default=20, help="generated images of each size")
    bench = commands.add_parser("bench", help="benchmarks")
    bench.add_argument("which", choices=["transfer"])
    bench.add_argument("--repeats", type=int, default=50)
    bench.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    # NIXL logs every connection event at INFO; keep the tables readable.
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    if args.command == "decode":
        return _decode(args.files, args.mode)
    if args.command == "demo":
        from pixelwire import demo as demo_module

        return demo_module.main(args.paths, args.per_size)
    if args.command == "bench":
        from pixelwire.benchmarks import transfer

        transfer(repeats=args.repeats, device=args.device)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
