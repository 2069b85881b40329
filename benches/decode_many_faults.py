"""decode_many against threads calling decode_image, with the minor page
faults each costs: the cost of fresh output memory.

8 images a call (4 a thread) of one real photo, JPEG q90 at 1080p and 4K, on
``--threads`` threads (2 by default): ``threads`` drops each array as it
comes, ``kept`` keeps the batch until the end, ``many`` is one
``pixelwire.decode_many`` call, which must return the batch whole. Rounds
interleave the three; the ratio is each one's images/s over ``threads``'.
Run it once per build to compare builds (``PYTHONPATH=DIR`` for another
one), alternating them.

    python benches/decode_many_faults.py [--threads N] [--rounds N]
"""

from __future__ import annotations

import argparse
import io
import resource
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from PIL import Image

import pixelwire

from bench_common import DEFAULT_SOURCE


def _jpeg(source: Image.Image, size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    source.resize(size, Image.Resampling.LANCZOS).save(out, "JPEG", quality=90)
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    source = Image.open(DEFAULT_SOURCE).convert("RGB")
    pool = ThreadPoolExecutor(args.threads)
    for size in ((1920, 1080), (3840, 2160)):
        batch = [_jpeg(source, size)] * (4 * args.threads)

        def threads(batch: list[bytes] = batch) -> None:
            for array in pool.map(pixelwire.decode_image, batch):
                del array

        def kept(batch: list[bytes] = batch) -> None:
            arrays = list(pool.map(pixelwire.decode_image, batch))
            del arrays

        def many(batch: list[bytes] = batch) -> None:
            arrays = pixelwire.decode_many(batch, threads=args.threads)
            del arrays

        kinds = {"threads": threads, "kept": kept, "many": many}
        seconds: dict[str, list[float]] = {kind: [] for kind in kinds}
        faults = dict.fromkeys(kinds, 0)
        for run in kinds.values():
            run()
        for _ in range(args.rounds):
            for kind, run in kinds.items():
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                run()
                seconds[kind].append(time.perf_counter() - start)
                faults[kind] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        base = statistics.median(seconds["threads"])
        cells = []
        for kind, times in seconds.items():
            median = statistics.median(times)
            per_image = faults[kind] / args.rounds / len(batch)
            rate = len(batch) / median
            cells.append(f"{kind} {rate:.1f}/s ({base / median:.2f}x, {per_image:.0f} faults/image)")
        print(f"{size[0]}x{size[1]}, {args.threads} threads: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
