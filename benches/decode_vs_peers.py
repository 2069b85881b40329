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

Single images: megapixels a second from the median of several rounds (each
decoder once a round, the order rotating) after a warm-up (one thread).
Throughput: a batch of images (four per thread) decoded by 1, 4 and
all-cores threads, images a second from the median of several runs; each
decoder runs on a ``ThreadPoolExecutor`` of that many Python threads, and
``pixelwire.decode_many`` (one call, native threads, ``threads=N``) is
timed beside them. The threaded runs drop each array as
it comes, as a server streaming images would; ``pixelwire kept`` keeps the
whole batch until it is done, as ``decode_many`` must, so that the two
compare like for like (fresh output memory costs page faults; the minor
faults per image are recorded in the JSON).

Usage::

    python benches/decode_vs_peers.py [--quick] [--json PATH] [--source PHOTO]
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import simplejpeg  # type: ignore[import-untyped]

import pixelwire

from bench_common import (
    QUALITY,
    bench_parser,
    encoded_photos,
    environment,
    median_seconds,
    pillow_decode,
)

Pixels = npt.NDArray[np.uint8]
Decoder = Callable[[bytes], Pixels]

SIZES: tuple[tuple[int, int], ...] = ((512, 512), (1920, 1080), (3840, 2160))
#: Thread counts of the throughput part: 1, 4 and every core (once each).
THREADS: tuple[int, ...] = tuple(sorted({1, 4, os.cpu_count() or 1}))
#: Images a batch holds per thread.
PER_THREAD = 4


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
    threads: int
    images: int
    median_ms: float
    minor_faults_per_image: float

    @property
    def images_per_s(self) -> float:
        return self.images / (self.median_ms / 1e3)


def make_inputs(source: Path) -> list[Input]:
    formats = [
        ("JPEG", {"quality": QUALITY}),
        ("PNG", {}),
        ("WEBP", {"quality": QUALITY, "lossless": False}),
    ]
    inputs = [Input(fmt, w, h, data) for fmt, w, h, data in encoded_photos(source, SIZES, formats)]
    # The heaviest common JPEG: 4K, no chroma subsampling, high quality.
    ((_, w, h, data),) = encoded_photos(source, [(3840, 2160)], [("JPEG", {"quality": 95, "subsampling": 0})])
    inputs.append(Input("JPEG444", w, h, data))
    return inputs


def decoders_for(fmt: str) -> list[str]:
    return ["pixelwire", "pillow", "simplejpeg"] if fmt.startswith("JPEG") else ["pixelwire", "pillow"]


def rounds_for(megapixels: float, quick: bool) -> int:
    if quick:
        return 3
    return 25 if megapixels < 1 else 15


def max_abs_diff(a: Pixels, b: Pixels) -> int:
    if a.shape != b.shape:
        return -1
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


def run_single(inputs: list[Input], quick: bool) -> list[Row]:
    """Each decoder once per round, the order rotating from round to round,
    so that no decoder always runs first or right after another (CPU clock
    and cache state drift over a run; timing each decoder in its own block
    moved the 4K ratio between 0.89 and 0.99 on the H200 box)."""
    rows: list[Row] = []
    warmup = 1 if quick else 2
    for item in inputs:
        row = Row(item.format, item.label, len(item.data))
        reference = decode_pillow(item.data)
        names = decoders_for(item.format)
        for name in names:
            fn = DECODERS[name]
            row.max_abs_diff_vs_pillow[name] = max_abs_diff(fn(item.data), reference)
            for _ in range(warmup):
                fn(item.data)
        times: dict[str, list[float]] = {name: [] for name in names}
        for round_ in range(rounds_for(item.megapixels, quick)):
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                fn = DECODERS[name]
                start = time.perf_counter()
                fn(item.data)
                times[name].append(time.perf_counter() - start)
        for name in names:
            seconds = statistics.median(times[name])
            row.median_ms[name] = seconds * 1e3
            row.mp_per_s[name] = item.megapixels / seconds
        rows.append(row)
        print(f"  measured {item.format} {item.label}", file=sys.stderr, flush=True)
    return rows


def timed_batch(fn: Callable[[], object], reps: int, images: int) -> tuple[float, float]:
    """Median seconds of ``fn`` and the minor page faults an image it took."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = median_seconds(fn, reps, warmup=1)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    return seconds, faults / ((reps + 1) * images)


def run_threads(inputs: list[Input], quick: bool) -> list[ThreadRow]:
    """Images a second for a batch of ``PER_THREAD * threads`` copies of
    each input, per decoder and thread count; ``decode_many`` is the same
    batch in one call on ``threads`` native threads."""
    rows: list[ThreadRow] = []
    reps = 3 if quick else 7
    targets = [i for i in inputs if (i.format, i.width) in (("JPEG", 1920), ("JPEG", 3840), ("WEBP", 1920))]
    for threads in THREADS:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            for item in targets:
                batch = [item.data] * (PER_THREAD * threads)

                def record(
                    name: str,
                    fn: Callable[[], object],
                    item: Input = item,
                    n: int = len(batch),
                    threads: int = threads,
                ) -> None:
                    seconds, faults = timed_batch(fn, reps, n)
                    rows.append(
                        ThreadRow(
                            item.format,
                            item.label,
                            name,
                            threads,
                            n,
                            seconds * 1e3,
                            faults,
                        )
                    )

                for name in decoders_for(item.format):
                    fn = DECODERS[name]

                    def threaded(fn: Decoder = fn, batch: list[bytes] = batch) -> None:
                        # Each array is dropped as it comes, as a server streaming images would.
                        for _ in pool.map(fn, batch):
                            pass

                    record(name, threaded)

                def kept(batch: list[bytes] = batch) -> None:
                    # The whole batch alive at the end, as decode_many returns it.
                    list(pool.map(decode_pixelwire, batch))

                def many(batch: list[bytes] = batch, threads: int = threads) -> None:
                    pixelwire.decode_many(batch, threads=threads)

                record("pixelwire kept", kept)
                record("decode_many", many)
                print(
                    f"  measured {item.format} {item.label} on {threads} threads",
                    file=sys.stderr,
                    flush=True,
                )
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
    print("\nThroughput, images/s (median; a batch of 4 images a thread; higher is better)")
    names = ["pixelwire", "pixelwire kept", "decode_many", "simplejpeg", "pillow"]
    header = (
        f"{'format':<6} {'size':>9} {'threads':>7} | "
        + " ".join(f"{n:>14}" for n in names)
        + f" | {'pw/sj':>6} {'many/pw':>7} {'many/kept':>9} {'pw/pillow':>9}"
    )
    print(header)
    print("-" * len(header))
    keys = sorted(
        {(t.format, t.size, t.threads) for t in thread_rows},
        key=lambda k: (k[0], k[1], k[2]),
    )
    for fmt, size, threads in keys:
        by = {
            t.decoder: t.images_per_s
            for t in thread_rows
            if (t.format, t.size, t.threads) == (fmt, size, threads)
        }

        def rel(a: str, b: str, by: dict[str, float] = by) -> str:
            return f"{by[a] / by[b]:.2f}x" if a in by and b in by else "-"

        cells = " ".join(f"{by[n]:>14.1f}" if n in by else f"{'-':>14}" for n in names)
        ratios = (
            f"{rel('pixelwire', 'simplejpeg'):>6} {rel('decode_many', 'pixelwire'):>7} "
            f"{rel('decode_many', 'pixelwire kept'):>9} {rel('pixelwire', 'pillow'):>9}"
        )
        print(f"{fmt:<6} {size:>9} {threads:>7} | {cells} | {ratios}")


def main(argv: list[str] | None = None) -> int:
    args = bench_parser(__doc__).parse_args(argv)
    env = environment(args.source, simplejpeg=simplejpeg.__version__)
    print(
        f"pixelwire {env['pixelwire']}, Pillow {env['pillow']} "
        f"(libjpeg-turbo {env['pillow_libjpeg_turbo']}, libwebp {env['pillow_webp']}, "
        f"zlib {env['pillow_zlib']}), simplejpeg {env['simplejpeg']}, numpy {env['numpy']}, "
        f"{env['cpu_count']} CPUs, threads {list(THREADS)}"
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
            "threads": [asdict(t) | {"images_per_s": t.images_per_s} for t in thread_rows],
        }
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
