"""Video decode throughput: 32 frames sampled as vLLM's ``opencv`` loader
samples them, from a 30 s 1080p H.264 (GOP 250, B-frames), a 2 min 720p
H.264 with a keyframe every 2 s and a 10 s 4K HEVC, on one core and on
all of them, pixelwire against the decoders vLLM and others use, in the
same run.

Decoders, each returning the sampled frames as (T, H, W, 3) uint8 RGB:

* ``pixelwire``:  ``pixelwire.decode_video(data, num_frames=32)``;
* ``opencv``:     vLLM's loader itself (``VIDEO_LOADER_REGISTRY`` ``opencv``)
  when vLLM is importable, else the same steps with ``cv2`` (a
  ``cv2.VideoCapture`` over a ``BytesIO``, ``grab()`` every frame up to the
  last sampled one, ``retrieve()`` and ``cvtColor(BGR2RGB)`` the sampled
  ones);
* ``pyav``:       PyAV (its wheels bundle FFmpeg), frames decoded in order,
  the sampled ones converted with ``to_ndarray(format="rgb24")``;
* ``torchcodec``: vLLM's ``backend="torchcodec"`` when vLLM is importable,
  else ``VideoDecoder(...).get_frames_at(indices)`` (it needs a system
  FFmpeg).

Two gauges, timed like the decoders but returning no frames, say what the
work itself costs with FFmpeg's decoders (the ``ffmpeg`` CLI, its output
thrown away, so nothing is converted):

* ``ffmpeg-every``: every frame of the stream decoded;
* ``ffmpeg-refs``:  only its reference pictures (``-skip_frame noref``):
  what any decoder giving frames identical to OpenCV's must at least
  decode for frames sampled across the whole stream (each sampled frame
  needs every reference picture before it back to its IDR picture). The
  frames after a GOP's last sampled one are decoded here and need not be;
  the sampled non-reference frames, and turning 32 frames into RGB, are
  needed and not done here. OpenCV's time over this gauge's is about the
  most a decoder built on FFmpeg's could gain per core with frames
  identical.

A decoder that cannot be imported is reported as missing, not an error.
Every decoder gets the same frame indices (pixelwire's, which are vLLM's).

One core: each decoder runs in a child process pinned to one CPU
(``sched_setaffinity``, before anything is imported, so OpenCV's own thread
count sees one CPU too) with one decoder thread where it takes a number.
All cores: a child with every CPU and each decoder's default threads
(pixelwire and OpenCV: min(cores, 16)). Each time is the median of
``--rounds`` decodes after a warm-up, decoders taking turns. The all-cores
child also compares every decoder's frames with OpenCV's (pixelwire's when
OpenCV is missing): the same indices, max |d| and mean |d|.

Inputs come from ``--inputs DIR``: ``h264_1080p_30s.mp4``,
``h264_720p_2min_gop2s.mp4`` and ``hevc_4k_10s.mp4``, and with ``--only``
``vp9_720p_10s.webm``, ``mpeg4_720p_10s.mp4`` and ``h264_vfr_720p.mp4``
(10 s of 720p in the codecs pixelwire cannot skip frames of, and 12 s of
variable frame rate H.264); missing ones are made there with the
``ffmpeg`` CLI (libx264, libx265, libvpx-vp9, mpeg4; ``--make-inputs``
makes them and stops), about 49 MB for the first three and 14 MB for the
others, so a folder can be carried to a machine without the CLI.

Usage::

    python benches/video_decode.py [--inputs DIR] [--rounds N] [--json PATH]
        [--decoders pixelwire,opencv,pyav,torchcodec,ffmpeg-every,ffmpeg-refs]
        [--only INPUT,...] [--video PATH ...] [--pieces] [--make-inputs]

``--pieces`` adds, for each input and child, where one more pixelwire read's
time went: its capture's open, the pieces the read is split into (at IDR
pictures; one piece when not split) and, for each piece, its sampled
frames, decoder threads, packets decoded, its capture's open, the time
from its read's start to its first kept frame, its decoding and its
colour conversion (``VideoCapture.read_times``), next to the read's wall
time.

``--video`` adds videos of one's own (``--only ''`` leaves the made ones
out), e.g. the 10 s clip ``pixelwire bench serve`` sends, which it leaves
in its results folder as ``images/video.mp4``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

Frames = npt.NDArray[np.uint8]
Decoder = Callable[[bytes, list[int], int], Frames]

NUM_FRAMES = 32
DECODERS = ("pixelwire", "opencv", "pyav", "torchcodec", "ffmpeg-every", "ffmpeg-refs")
# Timed, returning no frames (see above).
GAUGES = ("ffmpeg-every", "ffmpeg-refs")

# name -> ffmpeg CLI arguments. A moving test pattern under temporal noise,
# so that inter prediction has real residuals to code (a clean pattern
# decodes far faster than camera content), at bit rates of real uploads.
SOURCE = "testsrc2=size={size}:rate={rate},noise=alls=14:allf=t+u"
INPUTS: dict[str, list[str]] = {
    "h264_1080p_30s.mp4": [
        *["-f", "lavfi", "-i", SOURCE.format(size="1920x1080", rate=25), "-t", "30"],
        *["-c:v", "libx264", "-preset", "fast", "-pix_fmt", "yuv420p", "-g", "250", "-bf", "3"],
        *["-b:v", "5M", "-maxrate", "6M", "-bufsize", "10M"],
    ],
    # A longer upload with streaming-style keyframes (one every 2 s): most
    # of its GOPs hold no sampled frame.
    "h264_720p_2min_gop2s.mp4": [
        *["-f", "lavfi", "-i", SOURCE.format(size="1280x720", rate=25), "-t", "120"],
        *["-c:v", "libx264", "-preset", "fast", "-pix_fmt", "yuv420p", "-g", "50", "-bf", "3"],
        *["-b:v", "1M", "-maxrate", "1500k", "-bufsize", "2M"],
    ],
    "hevc_4k_10s.mp4": [
        *["-f", "lavfi", "-i", SOURCE.format(size="3840x2160", rate=25), "-t", "10"],
        *["-c:v", "libx265", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-tag:v", "hvc1"],
        *["-x265-params", "log-level=none:keyint=250:bframes=4", "-b:v", "12M"],
    ],
    # The codecs that pixelwire cannot skip frames of (VP9, MPEG-4 Part 2)
    # and a variable frame rate H.264, measured with --only.
    "vp9_720p_10s.webm": [
        *["-f", "lavfi", "-i", SOURCE.format(size="1280x720", rate=25), "-t", "10"],
        *["-c:v", "libvpx-vp9", "-deadline", "good", "-cpu-used", "5", "-row-mt", "1"],
        *["-b:v", "1500k", "-g", "125"],
    ],
    "mpeg4_720p_10s.mp4": [
        *["-f", "lavfi", "-i", SOURCE.format(size="1280x720", rate=25), "-t", "10"],
        *["-c:v", "mpeg4", "-q:v", "5", "-bf", "2", "-g", "125"],
    ],
    # 6 of every 10 frames kept, and every 7th: 197 frames over 11.84 s.
    "h264_vfr_720p.mp4": [
        *["-f", "lavfi", "-i", SOURCE.format(size="1280x720", rate=25), "-t", "12"],
        *["-vf", "select='lt(mod(n\\,10)\\,6)+eq(mod(n\\,7)\\,0)'", "-fps_mode", "vfr"],
        *["-c:v", "libx264", "-preset", "fast", "-g", "250", "-bf", "3", "-b:v", "1500k"],
    ],
}
# Measured unless --only names others.
DEFAULT_INPUTS = ["h264_1080p_30s.mp4", "h264_720p_2min_gop2s.mp4", "hevc_4k_10s.mp4"]


def make_inputs(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        out = folder / name
        if out.exists():
            continue
        ffmpeg = shutil.which("ffmpeg")
        if ffmpeg is None:
            sys.exit(f"{out} is missing and there is no ffmpeg CLI to make it: copy the inputs folder here")
        print(f"making {out} ...", file=sys.stderr, flush=True)
        tmp = out.with_suffix(".part" + out.suffix)
        subprocess.run(
            [ffmpeg, "-hide_banner", "-loglevel", "error", "-y", *INPUTS[name], str(tmp)], check=True
        )
        tmp.rename(out)


# -- decoders ------------------------------------------------------------------


def decode_pixelwire(data: bytes, indices: list[int], threads: int) -> Frames:
    import pixelwire

    frames, metadata = pixelwire.decode_video(data, num_frames=NUM_FRAMES, threads=threads)
    assert metadata["frames_indices"] == indices, "pixelwire sampled other frames"
    return frames


def decode_opencv(data: bytes, indices: list[int], threads: int) -> Frames:
    """vLLM's loader when vLLM is here; its steps with cv2 otherwise.
    ``threads`` is not passed: vLLM passes none (one core is the affinity)."""
    try:
        from vllm.multimodal.video import VIDEO_LOADER_REGISTRY
    except ImportError:
        return opencv_as_vllm(data, indices)
    frames, metadata = VIDEO_LOADER_REGISTRY.load("opencv").load_bytes(data, num_frames=NUM_FRAMES)
    assert metadata["frames_indices"] == indices, "vLLM sampled other frames than pixelwire"
    return np.asarray(frames)


def opencv_as_vllm(data: bytes, indices: list[int]) -> Frames:
    import cv2

    # OpenCV keeps no reference to the stream it reads: it must outlive the
    # capture (a temporary BytesIO is freed under it and crashes release()).
    stream = BytesIO(data)
    cap = cv2.VideoCapture(stream, cv2.CAP_FFMPEG, [])
    if not cap.isOpened():
        raise RuntimeError("OpenCV cannot open the video")
    # vLLM's get_video_metadata: the end-of-stream seek that checks the
    # header's frame count (OpenCV decodes from the last keyframe to get
    # there; pixelwire's loader does the same).
    if int(cap.get(cv2.CAP_PROP_FRAME_COUNT)) > 0 and cap.set(cv2.CAP_PROP_POS_AVI_RATIO, 1.0):
        cap.get(cv2.CAP_PROP_POS_FRAMES)
        cap.grab()
        cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
    wanted = set(indices)
    out = []
    for index in range(max(indices) + 1):
        if not cap.grab():
            break
        if index in wanted:
            ok, frame = cap.retrieve()
            if ok:
                out.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
    cap.release()
    del stream
    return np.stack(out)


def decode_pyav(data: bytes, indices: list[int], threads: int) -> Frames:
    import av

    wanted = set(indices)
    last = max(indices)
    out = []
    with av.open(BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        stream.thread_count = threads
        for index, frame in enumerate(container.decode(stream)):
            if index in wanted:
                out.append(frame.to_ndarray(format="rgb24"))
            if index >= last:
                break
    return np.stack(out)


def decode_torchcodec(data: bytes, indices: list[int], threads: int) -> Frames:
    try:
        from vllm.multimodal.video import VIDEO_LOADER_REGISTRY
    except ImportError:
        from torchcodec.decoders import VideoDecoder

        decoder = VideoDecoder(data, num_ffmpeg_threads=threads)
        return decoder.get_frames_at(indices).data.permute(0, 2, 3, 1).contiguous().numpy()
    loader = VIDEO_LOADER_REGISTRY.load("opencv")
    frames, metadata = loader.load_bytes(
        data, num_frames=NUM_FRAMES, backend="torchcodec", num_ffmpeg_threads=threads
    )
    assert metadata["frames_indices"] == indices, "vLLM's torchcodec path sampled other frames"
    return np.asarray(frames)


_GAUGE_FILES: dict[tuple[int, bytes, bytes], str] = {}


def gauge_file(data: bytes) -> str:
    """The video as a file the ``ffmpeg`` CLI can seek in (an MP4's index
    may come last), written once, at the warm-up."""
    key = (len(data), data[:4096], data[-4096:])
    if key not in _GAUGE_FILES:
        import atexit
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".video", delete=False) as file:
            file.write(data)
        atexit.register(os.unlink, file.name)
        _GAUGE_FILES[key] = file.name
    return _GAUGE_FILES[key]


def ffmpeg_gauge(*skip: str) -> Decoder:
    """The ``ffmpeg`` CLI decoding the video's first video stream to nothing
    with ``threads`` decoder threads (0: its default), ``skip`` before the
    input; returns no frames."""

    def decode(data: bytes, indices: list[int], threads: int) -> Frames:
        command = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-threads", str(threads)]
        command += [*skip, "-i", gauge_file(data), "-map", "0:v:0", "-f", "null", "-"]
        subprocess.run(command, check=True, capture_output=True)
        return np.empty((0, 0, 0, 3), np.uint8)

    return decode


IMPLEMENTATIONS: dict[str, tuple[str, Decoder]] = {
    "pixelwire": ("pixelwire", decode_pixelwire),
    "opencv": ("cv2", decode_opencv),
    "pyav": ("av", decode_pyav),
    "torchcodec": ("torchcodec", decode_torchcodec),
    "ffmpeg-every": ("ffmpeg", ffmpeg_gauge()),
    "ffmpeg-refs": ("ffmpeg", ffmpeg_gauge("-skip_frame", "noref")),
}


def available(name: str) -> str | None:
    """None when the decoder can run, else why not."""
    module = IMPLEMENTATIONS[name][0]
    if name in GAUGES:
        return None if shutil.which(module) else f"no {module} CLI on PATH"
    try:
        __import__(module)
    except Exception as e:  # noqa: BLE001 - a wheel without its system FFmpeg raises OSError, RuntimeError
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return None


# -- one child: one core or all ----------------------------------------------


def sampled_indices(data: bytes, threads: int) -> list[int]:
    import pixelwire

    return list(pixelwire.decode_video(data, num_frames=NUM_FRAMES, threads=threads)[1]["frames_indices"])


def child(args: argparse.Namespace) -> dict[str, Any]:
    one_core = args.child == "one"
    threads = 1 if one_core else 0
    names = [n for n in args.decoders if available(n) is None]
    result: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "inputs": {}}
    for path in input_paths(args):
        data = path.read_bytes()
        indices = sampled_indices(data, threads)
        times: dict[str, list[float]] = {n: [] for n in names}
        errors: dict[str, str] = {}
        # The warm-up, which also compares the frames with the reference's
        # (OpenCV's, else pixelwire's), decoded first; only those are kept.
        reference = next((n for n in ("opencv", "pixelwire") if n in names), None)
        ref_frames: Frames | None = None
        differences: dict[str, Any] = {}
        for name in sorted(names, key=lambda n: n != reference):
            try:
                got = IMPLEMENTATIONS[name][1](data, indices, threads)
            except Exception as e:  # noqa: BLE001 - reported in the table, the others still run
                errors[name] = f"{type(e).__name__}: {e}"[:300]
                continue
            if name == reference:
                ref_frames = got
            elif ref_frames is not None and name not in GAUGES:
                differences[name] = difference(got, ref_frames)
        running = [n for n in names if n not in errors]
        for round_ in range(args.rounds):
            order = running[round_ % len(running) :] + running[: round_ % len(running)] if running else []
            for name in order:
                started = time.perf_counter()
                IMPLEMENTATIONS[name][1](data, indices, threads)
                times[name].append(time.perf_counter() - started)
        entry: dict[str, Any] = {
            "indices": indices,
            "ms": {n: round(statistics.median(t) * 1000, 1) for n, t in times.items() if t},
            "errors": errors,
        }
        if args.pieces and "pixelwire" in running:
            entry["pieces"] = pieces_breakdown(data, indices, threads)
        if not one_core:
            entry["versus"], entry["differences"] = reference, differences
        result["inputs"][path.name] = entry
    return result


def pieces_breakdown(data: bytes, indices: list[int], threads: int) -> dict[str, Any]:
    """Where one pixelwire read of ``indices`` spent its time, piece by piece."""
    from pixelwire._native import VideoCapture

    started = time.perf_counter()
    capture = VideoCapture(data, threads=threads)
    opened = time.perf_counter()
    decoder_threads = capture.info()["threads"]
    plan = capture.read_plan(indices)
    planned = time.perf_counter()
    capture.read(indices)
    done = time.perf_counter()
    times = capture.read_times()

    def ms(seconds: float) -> float:
        return round(seconds * 1000, 1)

    return {
        "threads": decoder_threads,
        "open_ms": ms(opened - started),
        "plan_ms": ms(planned - opened),
        "read_ms": ms(done - planned),
        "wall_ms": ms(done - started),
        "piece_frames": [len(piece) for piece in plan],
        "pieces": [{k: ms(v / 1000) if isinstance(v, float) else v for k, v in t.items()} for t in times],
    }


def pieces_table(report: dict[str, Any]) -> str:
    lines = []
    for child_name in ("one_core", "all_cores"):
        for name, entry in report[child_name]["inputs"].items():
            b = entry.get("pieces")
            if not b:
                continue
            lines.append(
                f"{child_name} {name}: threads {b['threads']}, open {b['open_ms']} ms, "
                f"plan {b['plan_ms']} ms, read {b['read_ms']} ms, wall {b['wall_ms']} ms"
            )
            lines.append("  frames threads packets open_ms first_frame_ms decode_ms convert_ms")
            for t in b["pieces"]:
                lines.append(
                    f"  {t['frames']:6} {t['threads']:7} {t['packets']:7} {t['open_ms']:7} "
                    f"{t['first_frame_ms']:14} {t['decode_ms']:9} {t['convert_ms']:10}"
                )
    return "\n".join(lines)


def difference(got: Frames, ref: Frames) -> dict[str, Any]:
    if got.shape != ref.shape:
        return {"shape": list(got.shape), "reference_shape": list(ref.shape)}
    d = np.abs(got.astype(np.int16) - ref.astype(np.int16))
    return {"max_abs_diff": int(d.max()), "mean_abs_diff": round(float(d.mean()), 4)}


def input_paths(args: argparse.Namespace) -> list[Path]:
    return [args.inputs / name for name in args.only] + list(args.video)


def run_child(args: argparse.Namespace, which: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", which, "--inputs", str(args.inputs)]
    cmd += [arg for video in args.video for arg in ("--video", str(video))]
    cmd += [
        "--rounds",
        str(args.rounds),
        "--decoders",
        ",".join(args.decoders),
        "--only",
        ",".join(args.only),
    ]
    if args.pieces:
        cmd.append("--pieces")
    env = dict(os.environ)
    if which == "one":
        # Pinned before the interpreter imports anything (OpenCV counts the
        # CPUs it may use once, at start-up).
        cpu = min(os.sched_getaffinity(0))
        cmd = [sys.executable, "-c", PIN.format(cpu=cpu), *cmd[1:]]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the {which}-core run failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


PIN = (
    "import os, runpy, sys; os.sched_setaffinity(0, {{{cpu}}}); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


def table(report: dict[str, Any]) -> str:
    lines = [
        "| input | decoder | 1 core ms | all cores ms | 1 core vs OpenCV | vs reference: max, mean abs d |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    one, every = report["one_core"]["inputs"], report["all_cores"]["inputs"]
    for name in sorted(set(one) | set(every)):
        ms1, msn = one.get(name, {}).get("ms", {}), every.get(name, {}).get("ms", {})
        diffs = every.get(name, {}).get("differences", {})
        ref = every.get(name, {}).get("versus")
        for decoder in report["decoders"]:
            if decoder in report["missing"]:
                lines.append(f"| {name} | {decoder} | - | - | - | missing: {report['missing'][decoder]} |")
                continue
            errors = {**one.get(name, {}).get("errors", {}), **every.get(name, {}).get("errors", {})}
            if decoder in errors:
                lines.append(f"| {name} | {decoder} | - | - | - | failed: {errors[decoder][:120]} |")
                continue
            speedup = ms1.get("opencv", 0) / ms1[decoder] if ms1.get(decoder) else 0
            diff = diffs.get(decoder)
            if decoder in GAUGES:
                text = "gauge: no frames"
            elif decoder == ref:
                text = "reference"
            elif diff is None:
                text = ""
            elif "max_abs_diff" in diff:
                text = f"{diff['max_abs_diff']}, {diff['mean_abs_diff']}"
            else:
                text = f"shape {diff}"
            lines.append(
                f"| {name} | {decoder} | {ms1.get(decoder, '-')} | {msn.get(decoder, '-')} | "
                f"{f'{speedup:.2f}x' if speedup else '-'} | {text} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--inputs", type=Path, default=Path("target/bench-video"), help="folder of the inputs"
    )
    parser.add_argument("--make-inputs", action="store_true", help="make the missing inputs and stop")
    parser.add_argument("--rounds", type=int, default=3, help="timed decodes a decoder, after a warm-up")
    parser.add_argument("--decoders", type=lambda s: s.split(","), default=list(DECODERS))
    parser.add_argument(
        "--only",
        type=lambda s: [name for name in s.split(",") if name],
        default=DEFAULT_INPUTS,
        help=f"the inputs to measure (default: {', '.join(DEFAULT_INPUTS)}; known: {', '.join(INPUTS)})",
    )
    parser.add_argument(
        "--video", type=Path, action="append", default=[], help="a video file to measure too (repeatable)"
    )
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument(
        "--pieces", action="store_true", help="add where one pixelwire read's time went, piece by piece"
    )
    parser.add_argument("--child", choices=["one", "all"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = set(args.decoders) - set(DECODERS)
    if unknown:
        parser.error(f"unknown decoders {sorted(unknown)}; known: {DECODERS}")
    unknown = set(args.only) - set(INPUTS)
    if unknown:
        parser.error(f"unknown inputs {sorted(unknown)}; known: {list(INPUTS)}")
    if args.child:
        print(json.dumps(child(args)))
        return
    make_inputs(args.inputs, args.only)
    if args.make_inputs:
        for path in sorted(args.inputs.iterdir()):
            print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")
        return
    missing = {n: why for n in args.decoders if (why := available(n)) is not None}
    report: dict[str, Any] = {
        "decoders": args.decoders,
        "missing": missing,
        "rounds": args.rounds,
        "inputs": {path.name: path.stat().st_size for path in input_paths(args)},
        "environment": environment(),
        "one_core": run_child(args, "one"),
        "all_cores": run_child(args, "all"),
    }
    print(table(report))
    if args.pieces:
        print(pieces_table(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


def environment() -> dict[str, Any]:
    versions = {}
    for name, module in (("numpy", "numpy"), ("opencv", "cv2"), ("pyav", "av"), ("torchcodec", "torchcodec")):
        try:
            versions[name] = getattr(__import__(module), "__version__", "?")
        except Exception:  # noqa: BLE001 - missing or broken: no version
            versions[name] = None
    try:
        import vllm

        versions["vllm"] = vllm.__version__
    except Exception:  # noqa: BLE001 - missing or broken: no version
        versions["vllm"] = None
    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "versions": versions,
    }


if __name__ == "__main__":
    main()
