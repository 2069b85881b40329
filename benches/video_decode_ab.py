"""Two pixelwire builds decoding the same videos, taking turns: each
decode runs in a fresh process pinned to one CPU, ``decode_video(data,
num_frames=32, threads=1)`` as ``benches/video_decode.py`` times it on one
core, the builds alternating which goes first each round. For a change
whose effect is smaller than the spread between runs of the same build.
Each child prints the decode's wall time and its process CPU time (on a
shared VM the wall time also holds the waits for the CPU). With
``--opencv``, OpenCV takes its turn as a third contestant, timed the same
way: ``benches/video_decode.py``'s ``opencv_as_vllm`` (vLLM's loader's
steps with ``cv2``), over the frame indices pixelwire samples, with the
interpreter that runs this script. With ``--warm-up``, each child decodes
once before the timed decode (for clips so small that first-call costs
would dominate).

A build is a folder that holds the ``pixelwire`` package (``pip install
--no-deps --target DIR dist/pixelwire-*.whl``, or ``python`` of a
checkout built with ``make build-dev``).

Usage::

    python benches/video_decode_ab.py --build before=DIR --build after=DIR
        [--opencv] [--warm-up] [--rounds N] [--cpu N] [--json PATH] VIDEO...
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
if sys.argv[2] == "opencv":
    sys.path.insert(0, sys.argv[3])
    from video_decode import opencv_as_vllm
    indices = list(pixelwire.decode_video(data, num_frames=32, threads=1)[1]["frames_indices"])
    decode = lambda: opencv_as_vllm(data, indices)
else:
    decode = lambda: pixelwire.decode_video(data, num_frames=32, threads=1)
if {warm_up}:
    decode()
start, cpu_start = time.perf_counter(), time.process_time()
decode()
print(time.perf_counter() - start, time.process_time() - cpu_start)
"""

OPENCV = "opencv"


def decode_seconds(site: Path, video: Path, cpu: int, which: str, warm_up: bool) -> tuple[float, float]:
    """(wall, CPU) seconds of one decode in a fresh pinned process."""
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(cpu=cpu, warm_up=warm_up), str(video), which, str(HERE)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    wall, cpu_time = done.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu_time)


HERE = Path(__file__).resolve().parent


def spread(values: list[float]) -> str:
    """Median, and min to max, in ms."""
    ms = sorted(v * 1000 for v in values)
    return f"{statistics.median(ms):,.0f} ({ms[0]:,.0f}-{ms[-1]:,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("videos", type=Path, nargs="+")
    parser.add_argument("--build", action="append", required=True, help="NAME=DIR, twice")
    parser.add_argument("--rounds", type=int, default=6, help="decodes per build and video")
    parser.add_argument("--cpu", type=int, default=max(os.sched_getaffinity(0)), help="the CPU to pin to")
    parser.add_argument("--json", type=Path, help="write the times here")
    parser.add_argument("--opencv", action="store_true", help="time OpenCV's read in the same rounds")
    parser.add_argument("--warm-up", action="store_true", help="decode once in each child before timing")
    args = parser.parse_args()
    builds = dict(item.split("=", 1) for item in args.build)
    if len(builds) != 2:
        parser.error("name two builds: --build NAME=DIR --build NAME=DIR")
    if OPENCV in builds:
        parser.error(f"{OPENCV!r} names OpenCV's turn: call the builds otherwise")
    order = [(name, Path(site), name) for name, site in builds.items()]
    if args.opencv:
        # pixelwire only samples the indices there: either build's.
        order.append((OPENCV, order[0][1], OPENCV))
    times: dict[str, dict[str, dict[str, list[float]]]] = {}
    for video in args.videos:
        per: dict[str, dict[str, list[float]]] = {name: {"wall": [], "cpu": []} for name, _, _ in order}
        for round_ in range(args.rounds):
            turn = order[round_ % len(order) :] + order[: round_ % len(order)]
            for name, site, which in turn:
                wall, cpu_time = decode_seconds(site, video, args.cpu, which, args.warm_up)
                per[name]["wall"].append(wall)
                per[name]["cpu"].append(cpu_time)
        times[video.name] = per
    names = [name for name, _, _ in order]
    (first, second) = names[:2]
    head = " | ".join(f"{n} wall ms | {n} CPU ms" for n in names)
    ratios = [f"{first} / {second} CPU"]
    if args.opencv:
        ratios += [f"OpenCV / {first} CPU", f"OpenCV / {second} CPU"]
    print(f"| video | {head} | {' | '.join(ratios)} |")
    print("| --- |" + " ---: |" * (2 * len(names) + len(ratios)))
    for video, per in times.items():
        cells = " | ".join(f"{spread(per[n]['wall'])} | {spread(per[n]['cpu'])}" for n in names)
        cpu = {n: statistics.median(per[n]["cpu"]) for n in names}
        ratio = f"{cpu[first] / cpu[second]:.2f}x"
        if args.opencv:
            ratio += f" | {cpu[OPENCV] / cpu[first]:.2f}x | {cpu[OPENCV] / cpu[second]:.2f}x"
        print(f"| {video} | {cells} | {ratio} |")
    if args.json:
        report: dict[str, Any] = {
            "rounds": args.rounds,
            "cpu": args.cpu,
            "warm_up": args.warm_up,
            "builds": builds,
            "seconds": times,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
