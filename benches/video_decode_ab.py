"""Two pixelwire builds decoding the same videos, taking turns: each
decode runs in a fresh process pinned to one CPU, ``decode_video(data,
num_frames=32, threads=1)`` as ``benches/video_decode.py`` times it on one
core, the builds alternating which goes first each round. For a change
whose effect is smaller than the spread between runs of the same build.

A build is a folder that holds the ``pixelwire`` package (``pip install
--no-deps --target DIR dist/pixelwire-*.whl``, or ``python`` of a
checkout built with ``make build-dev``).

Usage::

    python benches/video_decode_ab.py --build before=DIR --build after=DIR
        [--rounds N] [--cpu N] [--json PATH] VIDEO...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

CHILD = """
import os, sys, time
os.sched_setaffinity(0, {{{cpu}}})
import pixelwire
data = open(sys.argv[1], "rb").read()
start = time.perf_counter()
pixelwire.decode_video(data, num_frames=32, threads=1)
print(time.perf_counter() - start)
"""


def decode_seconds(site: Path, video: Path, cpu: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(cpu=cpu), str(video)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("videos", type=Path, nargs="+")
    parser.add_argument("--build", action="append", required=True, help="NAME=DIR, twice")
    parser.add_argument("--rounds", type=int, default=6, help="decodes per build and video")
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)), help="the CPU to pin to")
    parser.add_argument("--json", type=Path, help="write the times here")
    args = parser.parse_args()
    builds = dict(item.split("=", 1) for item in args.build)
    if len(builds) != 2:
        parser.error("name two builds: --build NAME=DIR --build NAME=DIR")
    order = [(name, Path(site)) for name, site in builds.items()]
    times: dict[str, dict[str, list[float]]] = {}
    for video in args.videos:
        per_build: dict[str, list[float]] = {name: [] for name, _ in order}
        for round_ in range(args.rounds):
            for name, site in order if round_ % 2 == 0 else order[::-1]:
                per_build[name].append(decode_seconds(site, video, args.cpu))
        times[video.name] = per_build
    (first, _), (second, _) = order
    print(f"| video | {first} ms | {second} ms | {first} / {second} |")
    print("| --- | ---: | ---: | ---: |")
    for video, per_build in times.items():
        a, b = (statistics.median(per_build[name]) for name in (first, second))
        print(f"| {video} | {a * 1000:,.0f} | {b * 1000:,.0f} | {a / b:.2f}x |")
    if args.json:
        report: dict[str, Any] = {"rounds": args.rounds, "cpu": args.cpu, "builds": builds, "seconds": times}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
