"""Decode throughput of pixelwire against the decoders it replaces.

All decoders read the same encoded bytes, generated once at start-up from a
real photograph of the test corpus, scaled with Pillow's LANCZOS filter and
centre-cropped to each size:

* JPEG, quality 90 (Pillow's default 4:2:0 subsampling),
* PNG, Pillow's default compression,
* WebP, lossy, quality 90.

Decoders timed, each producing an (H, W, 3) uint8 numpy array:

* ``pixelwire``:  ``pixelwire.decode_image(data)``;
* ``pillow``:     vLLM's loader: ``Image.open``, ``load``, ``convert("RGB")``
  only when the mode differs, then ``numpy.asarray``;
* ``simplejpeg``: libjpeg-turbo through ``simplejpeg.decode_jpeg`` with the
  accurate settings Pillow uses (``fastdct=False, fastupsample=False``);
  JPEG only.

Throughput is megapixels a second from the median of several timed runs after
a warm-up. A second part decodes two 1080p images on two threads and compares
with decoding them one after the other on one thread; a decoder that releases
the GIL for the whole decode approaches 2x on two free cores.

Usage::

    python benches/decode_vs_peers.py [--quick] [--json PATH] [--source PHOTO]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import simplejpeg  # type: ignore[import-untyped]

import pixelwire

from bench_common import QUALITY, bench_parser, encoded_photos, environment, median_seconds, pillow_decode

Pixels = npt.NDArray[np.uint8]
Decoder = Callable[[bytes], Pixels]

SIZES: tuple[tuple[int, int], ...] = ((512, 512), (1920, 1080), (3840, 2160))
THREADS = 2


def decode_pixelwire(data: bytes) -> Pixels:
    return pixelwire.decode_image(data)


def decode_pillow(data: bytes) -> Pixels:
    """vLLM's path: Pillow open, load, convert, then the array."""
    return pillow_decode(data)


def decode_simplejpeg(data: bytes) -> Pixels:
    pixels: Pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False, fastupsample=False)
    return pixels


DECODERS: dict[str, Decoder] = {
    "pixelwire": decode_pixelwire,
    "pillow": decode_pillow,
    "simplejpeg": decode_simplejpeg,
}


@dataclass
class Input:
    format: str
    width: int
    height: int
    data: bytes

    @property
    def megapixels(self) -> float:
        return self.width * self.height / 1e6

    @property
    def label(self) -> str:
        return f"{self.width}x{self.height}"


@dataclass
class Row:
    format: str
    size: str
    encoded_bytes: int
    mp_per_s: dict[str, float] = field(default_factory=dict)
    median_ms: dict[str, float] = field(default_factory=dict)
    max_abs_diff_vs_pillow: dict[str, int] = field(default_factory=dict)


@dataclass
class ThreadRow:
    format: str
    size: str
    decoder: str
    sequential_ms: float
    threaded_ms: float

    @property
    def speedup(self) -> float:
        return self.sequential_ms / self.threaded_ms


def make_inputs(source: Path) -> list[Input]:
    formats = [("JPEG", {"quality": QUALITY}), ("PNG", {}), ("WEBP", {"quality": QUALITY, "lossless": False})]
    return [Input(fmt, w, h, data) for fmt, w, h, data in encoded_photos(source, SIZES, formats)]


def decoders_for(fmt: str) -> list[str]:
    return ["pixelwire", "pillow", "simplejpeg"] if fmt == "JPEG" else ["pixelwire", "pillow"]


def reps_for(megapixels: float, quick: bool) -> int:
    if quick:
        return 3
    return 25 if megapixels < 1 else 11 if megapixels < 4 else 7


def max_abs_diff(a: Pixels, b: Pixels) -> int:
    if a.shape != b.shape:
        return -1
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


def run_single(inputs: list[Input], quick: bool) -> list[Row]:
    rows: list[Row] = []
    warmup = 1 if quick else 2
    for item in inputs:
        row = Row(item.format, item.label, len(item.data))
        reference = decode_pillow(item.data)
        for name in decoders_for(item.format):
            fn = DECODERS[name]
            row.max_abs_diff_vs_pillow[name] = max_abs_diff(fn(item.data), reference)

            def once(fn: Decoder = fn, data: bytes = item.data) -> None:
                fn(data)

            seconds = median_seconds(once, reps_for(item.megapixels, quick), warmup)
            row.median_ms[name] = seconds * 1e3
            row.mp_per_s[name] = item.megapixels / seconds
        rows.append(row)
        print(f"  measured {item.format} {item.label}", file=sys.stderr, flush=True)
    return rows


def run_threads(inputs: list[Input], quick: bool) -> list[ThreadRow]:
    rows: list[ThreadRow] = []
    reps = 5 if quick else 15
    targets = [i for i in inputs if (i.width, i.height) == (1920, 1080) and i.format != "WEBP"]
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        for item in targets:
            batch = [item.data] * THREADS
            for name in decoders_for(item.format):
                fn = DECODERS[name]

                def sequential(fn: Decoder = fn, batch: list[bytes] = batch) -> None:
                    for data in batch:
                        fn(data)

                def threaded(fn: Decoder = fn, batch: list[bytes] = batch) -> None:
                    list(pool.map(fn, batch))

                seq = median_seconds(sequential, reps, warmup=2)
                par = median_seconds(threaded, reps, warmup=2)
                rows.append(ThreadRow(item.format, item.label, name, seq * 1e3, par * 1e3))
    return rows


def ratio(row: Row, num: str, den: str) -> str:
    if num in row.mp_per_s and den in row.mp_per_s:
        return f"{row.mp_per_s[num] / row.mp_per_s[den]:.2f}x"
    return "-"


def mps(row: Row, name: str) -> str:
    return f"{row.mp_per_s[name]:.1f}" if name in row.mp_per_s else "-"


def print_tables(rows: list[Row], thread_rows: list[ThreadRow]) -> None:
    header = (
        f"{'format':<6} {'size':>9} {'bytes':>9} | {'pixelwire':>9} {'pillow':>9} "
        f"{'simplejpeg':>10} | {'pw/pillow':>9} {'pw/sj':>7} | max|d| vs pillow"
    )
    print("\nDecode throughput, MP/s (median; higher is better)")
    print(header)
    print("-" * len(header))
    for row in rows:
        diffs = " ".join(f"{name}={d}" for name, d in row.max_abs_diff_vs_pillow.items() if name != "pillow")
        print(
            f"{row.format:<6} {row.size:>9} {row.encoded_bytes:>9} | "
            f"{mps(row, 'pixelwire'):>9} {mps(row, 'pillow'):>9} {mps(row, 'simplejpeg'):>10} | "
            f"{ratio(row, 'pixelwire', 'pillow'):>9} {ratio(row, 'pixelwire', 'simplejpeg'):>7} | "
            f"{diffs}"
        )
    print(f"\n{THREADS} images on {THREADS} threads vs one after the other on one thread")
    header = (
        f"{'format':<6} {'size':>9} {'decoder':<10} | {'sequential ms':>13} "
        f"{'threaded ms':>11} | {'speedup':>7}"
    )
    print(header)
    print("-" * len(header))
    for t in thread_rows:
        print(
            f"{t.format:<6} {t.size:>9} {t.decoder:<10} | {t.sequential_ms:>13.2f} "
            f"{t.threaded_ms:>11.2f} | {t.speedup:>6.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(__doc__).parse_args(argv)
    env = environment(args.source, simplejpeg=simplejpeg.__version__)
    print(
        f"pixelwire {env['pixelwire']}, Pillow {env['pillow']} "
        f"(libjpeg-turbo {env['pillow_libjpeg_turbo']}, libwebp {env['pillow_webp']}, "
        f"zlib {env['pillow_zlib']}), simplejpeg {env['simplejpeg']}, numpy {env['numpy']}, "
        f"{env['cpu_count']} CPUs"
    )
    print(f"source photo: {args.source}")
    inputs = make_inputs(args.source)
    rows = run_single(inputs, args.quick)
    thread_rows = run_threads(inputs, args.quick)
    print_tables(rows, thread_rows)

    if args.json is not None:
        payload = {
            "environment": env,
            "quick": args.quick,
            "decode": [asdict(r) for r in rows],
            "threads": [asdict(t) | {"speedup": t.speedup, "threads": THREADS} for t in thread_rows],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
