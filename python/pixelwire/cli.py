"""The `pixelwire` command line."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
import time
from pathlib import Path
from typing import Any

from pixelwire import config, frontend_command
from pixelwire._native import PixelwireError, decode_image, probe_image
from pixelwire.cli_arguments import CommandError, HelpFormatter

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


def _selected_bench(argv: list[str]) -> str | None:
    """The benchmark ``argv`` names (``bench serve ...``), if any: only its
    module is imported to add its options."""
    words = [word for word in argv if not word.startswith("-")]
    return words[1] if len(words) > 1 and words[0] == "bench" and words[1] in BENCHES else None


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser for ``argv``: every command, and the options of the one
    benchmark ``argv`` names (the others' modules stay unimported)."""
    parser = argparse.ArgumentParser(prog="pixelwire", description=__doc__, formatter_class=HelpFormatter)
    version = importlib.metadata.version("pixelwire")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version}")
    commands = parser.add_subparsers(dest="command", required=True)
    decode = commands.add_parser(
        "decode",
        help="decode image files and print format, shape and time",
        description="Decodes image files (a folder: the images in it) and prints format, shape and time.",
        formatter_class=HelpFormatter,
    )
    decode.add_argument("files", nargs="+", type=Path, help="image files or folders of them")
    decode.add_argument("--mode", default="RGB", choices=config.DECODED_MODES, help="the mode decoded into")
    demo = commands.add_parser(
        "demo",
        help="frontend and worker processes moving images over NIXL",
        description="A publisher process (what the frontend runs) publishes images over NIXL; this "
        "process reads them as a vLLM worker would, checks every pixel and prints a table. Needs NIXL's "
        "runtime: pip install --no-deps nixl-cu12==1.5.1.",
        formatter_class=HelpFormatter,
    )
    demo.add_argument(
        "paths", nargs="*", type=Path, help="image files or folders of them (default: generated images)"
    )
    demo.add_argument("--per-size", type=int, default=20, help="generated images of each size")
    bench = commands.add_parser("bench", help="benchmarks", formatter_class=HelpFormatter)
    benches = bench.add_subparsers(dest="which", required=True)
    selected = _selected_bench(argv)
    for name, (module_name, summary) in BENCHES.items():
        sub = benches.add_parser(name, help=summary, formatter_class=HelpFormatter)
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
        formatter_class=HelpFormatter,
    )
    frontend_command.add_arguments(front)
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
        return frontend_command.run(args)
    if args.command == "bench":
        module: Any = importlib.import_module(BENCHES[args.which][0])
        return int(module.run(args))
    return 2


if __name__ == "__main__":
    sys.exit(main())
