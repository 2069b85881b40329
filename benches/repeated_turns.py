"""The frontend's publish cost per turn of a conversation that resends its images.

Turn k of 8 sends k 1080p PNG screenshots (one new each turn, the earlier
ones again, as OpenAI-style clients and agents do), published in one batch
with the tiny Qwen2-VL's resize, the descriptors released at the turn's end
as the frontend does at a request's end. Measured in process, for a
publisher with its cache off and one with it on (same run, same images):
CPU milliseconds (every thread of the process) and wall milliseconds per
turn, and the ratio of turn 8 to turn 1. The first run of each, and one
publish before turn 1 (the pool's first region), are warm-ups.
No vLLM, no HTTP: the part of a turn the frontend's cache saves.

Usage::

    python benches/repeated_turns.py [--turns 8] [--cache-bytes 128MiB]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import pixelwire
from pixelwire.bench.inputs import screenshot
from pixelwire.resize import image_policy_from_config
from pixelwire.sizes import parse_bytes

# The tiny Qwen2-VL's image processor (tests/e2e/tiny_model.py): ~1 MP.
POLICY = image_policy_from_config(
    {
        "image_processor_type": "Qwen2VLImageProcessor",
        "patch_size": 14,
        "merge_size": 2,
        "size": {"shortest_edge": 3136, "longest_edge": 12845056},
        "max_pixels": 1003520,
    }
)


Turns = list[tuple[float, float]]


async def conversation(screens: list[bytes], cache_bytes: int) -> tuple[Turns, dict[str, int]]:
    """(CPU ms, wall ms) of each turn, and the publisher's stats at the end."""
    turns = []
    async with pixelwire.Publisher(cache_bytes=cache_bytes) as publisher:
        # The pool's first region is registered by the first publish: not a turn's cost.
        warm_up = await publisher.decode_and_publish(screenshot(1000), layout="RGBX", resize=POLICY)
        assert isinstance(warm_up, pixelwire.Decoded)
        publisher.release(warm_up)
        for k in range(1, len(screens) + 1):
            cpu, wall = time.process_time(), time.perf_counter()
            published = await publisher.decode_and_publish_many(screens[:k], layout="RGBX", resize=POLICY)
            turns.append(((time.process_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000))
            for decoded in published:
                assert isinstance(decoded, pixelwire.Decoded), decoded
                publisher.release(decoded)
        return turns, publisher.stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--cache-bytes", type=parse_bytes, default=128 << 20)
    args = parser.parse_args()
    screens = [screenshot(seed) for seed in range(args.turns)]
    print(f"screenshots: {[len(s) >> 10 for s in screens]} KiB")
    for _ in range(2):  # the first pass warms up
        off, _ = asyncio.run(conversation(screens, 0))
        on, stats = asyncio.run(conversation(screens, args.cache_bytes))
    print("turn  off CPU ms  off wall ms  on CPU ms  on wall ms")
    for k, ((off_cpu, off_wall), (on_cpu, on_wall)) in enumerate(zip(off, on, strict=True), 1):
        print(f"{k:4d} {off_cpu:11.1f} {off_wall:12.1f} {on_cpu:10.1f} {on_wall:11.1f}")
    ratios = off[-1][0] / off[0][0], on[-1][0] / on[0][0]
    print(f"turn {args.turns} / turn 1, CPU: cache off {ratios[0]:.2f}x, on {ratios[1]:.2f}x")
    print({key: stats[key] for key in ("published", "cache_hits", "cache_misses", "pinned_bytes")})


if __name__ == "__main__":
    main()
