"""A request's images published as one batch against one publish per image.

The frontend used to publish a request's N images with N concurrent
``Publisher.decode_and_publish`` calls: N hops to asyncio's worker threads,
each decoding one image. It now makes one ``decode_and_publish_many`` call:
one hop, the N images decoded side by side on the native decode pool. This
times both, in the same run, on the same images and publisher, alternating
the two paths every repetition so that drift affects both alike:

* ``per_image``: ``asyncio.gather`` of N ``decode_and_publish`` calls;
* ``batch``: one ``decode_and_publish_many`` of the N images.

Both publish in the frontend's layout (RGBX) without a resize; every slot is
released after each repetition (outside the timing). The inputs are the
corpus photo scaled to each size and saved as JPEG at quality 90. Times are
medians in milliseconds per request; ``ratio`` is per_image over batch (above
1: the batch is faster).

Usage::

    python benches/publish_batch.py [--quick] [--json PATH] [--source PHOTO]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pixelwire

from bench_common import QUALITY, bench_parser, encoded_photos, environment

# (images in the request, width, height)
CASES: tuple[tuple[int, int, int], ...] = (
    (2, 1024, 768),
    (4, 1024, 768),
    (8, 1024, 768),
    (8, 512, 384),
    (16, 512, 384),
)


async def _timed(publisher: pixelwire.Publisher, publish: Callable[[], Awaitable[Sequence[object]]]) -> float:
    start = time.perf_counter()
    results = await publish()
    seconds = time.perf_counter() - start
    for result in results:
        assert isinstance(result, pixelwire.Decoded), result
        publisher.release(result)
    return seconds


async def measure(images: list[bytes], reps: int, warmup: int) -> dict[str, float]:
    times: dict[str, list[float]] = {"per_image": [], "batch": []}
    async with pixelwire.Publisher(pool_bytes=512 << 20) as publisher:

        def per_image() -> Awaitable[Sequence[object]]:
            return asyncio.gather(*(publisher.decode_and_publish(data, layout="RGBX") for data in images))

        def batch() -> Awaitable[Sequence[object]]:
            return publisher.decode_and_publish_many(images, layout="RGBX")

        for rep in range(warmup + reps):
            for name, publish in (("per_image", per_image), ("batch", batch)):
                seconds = await _timed(publisher, publish)
                if rep >= warmup:
                    times[name].append(seconds)
    per_image_ms = statistics.median(times["per_image"]) * 1e3
    batch_ms = statistics.median(times["batch"]) * 1e3
    return {"per_image_ms": per_image_ms, "batch_ms": batch_ms, "ratio": per_image_ms / batch_ms}


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    reps, warmup = (5, 1) if args.quick else (30, 3)
    sizes = sorted({(width, height) for _, width, height in CASES})
    photos = {
        (w, h): data for _, w, h, data in encoded_photos(args.source, sizes, [("JPEG", {"quality": QUALITY})])
    }
    rows: list[dict[str, Any]] = []
    print(f"{'images':>6} {'size':>10} {'per image ms':>13} {'batch ms':>9} {'ratio':>6}")
    for count, width, height in CASES:
        # Distinct bytes per image, as a real request's would be (one
        # trailing byte after the JPEG's end marker, which decoders ignore).
        images = [photos[(width, height)] + bytes([i]) for i in range(count)]
        row = {
            "images": count,
            "width": width,
            "height": height,
            **asyncio.run(measure(images, reps, warmup)),
        }
        rows.append(row)
        print(
            f"{count:>6} {width:>5}x{height:<4} {row['per_image_ms']:>13.2f} {row['batch_ms']:>9.2f} "
            f"{row['ratio']:>6.2f}"
        )
    if args.json:
        report = {"environment": environment(args.source, reps=reps, warmup=warmup), "results": rows}
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
