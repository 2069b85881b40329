"""What the Python benchmark scripts share: inputs made from a real photo,
median timing, the environment line and the command-line options."""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import PIL
from PIL import Image, ImageOps, features

import pixelwire

DEFAULT_SOURCE = (
    Path(__file__).resolve().parents[2] / "shared" / "corpus" / "pillow" / "exif_gps_typeerror.jpg"
)
QUALITY = 90


def encoded_photos(
    source: Path, sizes: Sequence[tuple[int, int]], formats: Sequence[tuple[str, dict[str, Any]]]
) -> list[tuple[str, int, int, bytes]]:
    """The photo scaled (Lanczos, cropped to fill) to each size and encoded
    in each (Pillow format, save options): (format, width, height, bytes)."""
    with Image.open(source) as photo:
        photo.load()
        rgb = photo.convert("RGB")
    out = []
    for width, height in sizes:
        scaled = ImageOps.fit(rgb, (width, height), method=Image.Resampling.LANCZOS)
        for fmt, params in formats:
            buf = io.BytesIO()
            scaled.save(buf, format=fmt, **params)
            out.append((fmt, width, height, buf.getvalue()))
    return out


def pillow_decode(data: bytes) -> np.ndarray:
    """vLLM's ``ImageMediaIO.load_bytes`` followed by the array conversion."""
    image: Image.Image = Image.open(io.BytesIO(data))
    image.load()
    if image.mode != "RGB":
        image = image.convert("RGB")
    return np.asarray(image)


def median_seconds(fn: Callable[[], object], reps: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times: list[float] = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def environment(source: Path, **extra: Any) -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "pixelwire": pixelwire.__version__,
        "pillow": PIL.__version__,
        "pillow_libjpeg_turbo": features.version("libjpeg_turbo"),
        "pillow_webp": features.version("webp"),
        "pillow_zlib": features.version("zlib"),
        "numpy": np.__version__,
        "source": str(source),
        **extra,
    }


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0] if doc else None)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results as JSON")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="photo the inputs are made from")
    return parser
