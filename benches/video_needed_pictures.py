"""The least work that gives OpenCV's frames: decoding only the pictures the
sampled frames need, timed against decoding everything and against vLLM's
loader, one core, in the same run.

A sampled frame is OpenCV's frame only if every reference picture decoded
before it since its IDR picture has been decoded (an H.264 picture may refer
to any reference picture of its coded video sequence that came before it).
For an H.264 MP4 this bench takes vLLM's ``opencv`` loader's frame indices
for ``--num-frames`` (pixelwire's, which the bench checks are vLLM's), and
writes the stream as Annex B twice: whole, and with only the access units
those frames need (in each IDR-started GOP, the reference pictures up to the
last sampled frame's access unit, and the sampled frames themselves). Then,
pinned to one CPU, alternating, ``--rounds`` times each:

* ``needed``: the ``ffmpeg`` CLI decoding the needed access units
  (``-threads 1``, to nothing: no conversion to RGB);
* ``every``: the same decoding the whole stream;
* ``opencv``: vLLM's loader (``VIDEO_LOADER_REGISTRY`` ``opencv``) on the MP4,
  when vLLM is importable;
* ``pixelwire``: ``pixelwire.decode_video`` on the MP4, one thread.

OpenCV's median over ``needed``'s is about the most any decoder built on
FFmpeg's H.264 decoder can gain per core with frames identical to OpenCV's
(``needed`` leaves out the 32 conversions to RGB, and vLLM's end-of-stream
check, which OpenCV pays for by decoding the last GOP once more).

Usage, in vLLM's environment, with the ``ffmpeg`` and ``ffprobe`` CLIs::

    python benches/video_needed_pictures.py VIDEO.mp4 [--num-frames 32] [--rounds 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

H264_SLICE, H264_IDR = 1, 5
# NAL unit types that start an access unit when they follow a picture's
# slices: SEI, SPS, PPS, access unit delimiter.
AU_STARTERS = {6, 7, 8, 9}


@dataclass
class AccessUnit:
    data: bytes
    # The first byte of each slice NAL unit: nal_ref_idc and nal_unit_type.
    slice_headers: list[int] = field(default_factory=list)


def annex_b_access_units(stream: bytes) -> list[AccessUnit]:
    """Splits an Annex B H.264 stream into access units: a new one starts at
    an SEI, parameter set or delimiter after a picture's slices, or at a
    slice whose first_mb_in_slice is 0 (its ue(v) is the single bit 1)."""
    starts = []
    at = stream.find(b"\x00\x00\x01")
    while at >= 0:
        starts.append(at)
        at = stream.find(b"\x00\x00\x01", at + 3)
    units: list[AccessUnit] = []
    current: list[bytes] = []
    slice_headers: list[int] = []
    for i, start in enumerate(starts):
        begin = start - 1 if start > 0 and stream[start - 1] == 0 else start
        end = starts[i + 1] if i + 1 < len(starts) else len(stream)
        if i + 1 < len(starts) and stream[end - 1] == 0:
            end -= 1
        header = stream[start + 3]
        nal_type = header & 0x1F
        is_slice = nal_type in (H264_SLICE, H264_IDR)
        first_in_picture = is_slice and bool(stream[start + 4] & 0x80)
        if slice_headers and (nal_type in AU_STARTERS or first_in_picture):
            units.append(AccessUnit(b"".join(current), slice_headers))
            current, slice_headers = [], []
        current.append(stream[begin:end])
        if is_slice:
            slice_headers.append(header)
    if current:
        units.append(AccessUnit(b"".join(current), slice_headers))
    return units


def needed_units(units: list[AccessUnit], ranks: list[int], wanted: set[int]) -> list[bool]:
    """Per access unit in decoding order (``ranks``: each one's frame number):
    whether a decoder must decode it for the ``wanted`` frames."""
    idr = [any(h & 0x1F == H264_IDR for h in u.slice_headers) for u in units]
    reference = [any(h >> 5 for h in u.slice_headers) for u in units]
    bounds = [i for i, is_idr in enumerate(idr) if is_idr] + [len(units)]
    if bounds[0] != 0:
        sys.exit("the stream does not start with an IDR picture")
    keep = [False] * len(units)
    for start, end in itertools.pairwise(bounds):
        last = max((i for i in range(start, end) if ranks[i] in wanted), default=-1)
        for i in range(start, last + 1):
            keep[i] = reference[i] or ranks[i] in wanted
    return keep


def ffmpeg_decode(path: Path) -> None:
    command = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-threads", "1"]
    subprocess.run([*command, "-f", "h264", "-i", str(path), "-f", "null", "-"], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("video", type=Path, help="an H.264 MP4")
    parser.add_argument("--num-frames", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cpu", type=int, help="the CPU to pin to (the lowest one allowed)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu if args.cpu is not None else min(os.sched_getaffinity(0))})

    import pixelwire

    data = args.video.read_bytes()
    indices = list(pixelwire.decode_video(data, num_frames=args.num_frames, threads=1)[1]["frames_indices"])
    try:
        from vllm.multimodal.video import VIDEO_LOADER_REGISTRY
    except ImportError:
        vllm_loader = None
    else:
        vllm_loader = VIDEO_LOADER_REGISTRY.load("opencv")
        assert vllm_loader.load_bytes(data, num_frames=args.num_frames)[1]["frames_indices"] == indices

    with tempfile.TemporaryDirectory() as folder:
        whole = Path(folder) / "every.h264"
        subprocess.run(
            [
                *["ffmpeg", "-v", "error", "-nostdin", "-y", "-i", str(args.video), "-map", "0:v:0"],
                *["-c", "copy", "-bsf:v", "h264_mp4toannexb", "-f", "h264", str(whole)],
            ],
            check=True,
        )
        probe = ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "packet=pts"]
        listed = subprocess.run([*probe, "-of", "csv=p=0", str(args.video)], capture_output=True, text=True)
        pts = [int(line.strip().strip(",")) for line in listed.stdout.split() if line.strip()]
        rank = {p: i for i, p in enumerate(sorted(pts))}
        units = annex_b_access_units(whole.read_bytes())
        if len(units) != len(pts):
            sys.exit(f"{len(units)} access units for {len(pts)} packets: not a stream this bench splits")
        keep = needed_units(units, [rank[p] for p in pts], set(indices))
        needed = Path(folder) / "needed.h264"
        needed.write_bytes(b"".join(u.data for u, k in zip(units, keep, strict=True) if k))

        runs: dict[str, Any] = {
            "needed": lambda: ffmpeg_decode(needed),
            "every": lambda: ffmpeg_decode(whole),
            "pixelwire": lambda: pixelwire.decode_video(data, num_frames=args.num_frames, threads=1),
        }
        if vllm_loader is not None:
            runs["opencv"] = lambda: vllm_loader.load_bytes(data, num_frames=args.num_frames)
        times: dict[str, list[float]] = {name: [] for name in runs}
        for run in runs.values():
            run()  # warm-up
        for round_ in range(args.rounds):
            names = list(runs)
            for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                started = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - started)

    ms = {name: round(statistics.median(t) * 1000, 1) for name, t in times.items()}
    report = {
        "video": args.video.name,
        "indices": indices,
        "access_units": {"needed": sum(keep), "all": len(units)},
        "coded_bytes": {
            "needed": sum(len(u.data) for u, k in zip(units, keep, strict=True) if k),
            "all": sum(len(u.data) for u in units),
        },
        "rounds": args.rounds,
        "ms": ms,
        "ms_each": {name: [round(x * 1000, 1) for x in t] for name, t in times.items()},
    }
    for name, value in ms.items():
        versus = f" ({ms['opencv'] / value:.2f}x OpenCV)" if "opencv" in ms else ""
        print(f"{name:>10}: {value:8.1f} ms{versus}")
    print(f"access units needed {sum(keep)} of {len(units)}; coded bytes {report['coded_bytes']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
