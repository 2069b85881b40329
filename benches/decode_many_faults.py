"""decode_many against threads calling decode_image, with what each costs
besides the decode: minor page faults, CPU time, context switches and how
busy its threads were.

``4 * threads`` images a call of one real photo, JPEG q90 at 1080p and 4K,
on each of ``--threads`` thread counts (2 by default); with ``--mixed``
also a ``mixed`` batch, one image in four at 4K and the rest at 1080p in a
fixed shuffled order (where the order images start in decides how long
the last one keeps the others waiting): ``threads`` drops
each array as it comes, ``kept`` keeps the batch until the end, ``many`` is
one ``pixelwire.decode_many`` call, which must return the batch whole.
Rounds interleave the three; the ratio is each one's images/s over
``threads``'. Per image: minor faults, user and system CPU ms of the whole
process, voluntary and involuntary context switches; ``busy`` is the CPU
time of the threads that decode (the executor's, or decode_many's native
pool) over their wall time (1.0: never idle), read from ``/proc`` (clock
ticks where the kernel gives no ``schedstat``); ``steal`` the share of the
machine's CPU time the hypervisor gave to others meanwhile. Run it once per build to
compare builds (``PYTHONPATH=DIR`` for another one), alternating them.

    python benches/decode_many_faults.py [--threads 2,4,16] [--rounds N] [--mixed] \
        [--json PATH] [--source PHOTO]
"""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import os
import random
import resource
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from PIL import Image

import pixelwire

from bench_common import DEFAULT_SOURCE

SIZES = ((1920, 1080), (3840, 2160))
TICK = 1 / os.sysconf("SC_CLK_TCK")


def _jpeg(source: Image.Image, size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    source.resize(size, Image.Resampling.LANCZOS).save(out, "JPEG", quality=90)
    return out.getvalue()


def _thread_cpu(prefixes: tuple[str, ...]) -> float:
    """CPU seconds so far of this process's threads whose name starts with
    one of `prefixes` (schedstat's nanoseconds where there are, else stat's
    clock ticks)."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        base = f"/proc/self/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                if not f.read().startswith(prefixes):
                    continue
            try:
                with open(f"{base}/schedstat") as f:
                    total += int(f.read().split()[0]) / 1e9
                    continue
            except (OSError, ValueError, IndexError):
                pass
            with open(f"{base}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * TICK
        except OSError:
            continue  # a thread that ended meanwhile
    return total


def _steal_ticks() -> int:
    """Clock ticks the hypervisor ran something else on this machine's CPUs
    (all of them, /proc/stat's steal column)."""
    with open("/proc/stat") as f:
        fields = f.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def _schedstat_works() -> bool:
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
            return int(f.read().split()[0]) > 0
    except (OSError, ValueError, IndexError):
        return False


def _name_thread() -> None:
    """Names the calling thread for the kernel (Python 3.12 does not), so
    that its CPU time can be told apart in /proc."""
    ctypes.CDLL(None).prctl(15, b"pw-bench-decode", 0, 0, 0)  # PR_SET_NAME


def batches(source: Image.Image, threads: int, mixed: bool) -> list[tuple[str, list[bytes]]]:
    """The batches of one thread count, by name: each size's, and the mixed one."""
    count = 4 * threads
    encoded = {size: _jpeg(source, size) for size in SIZES}
    named = [(f"{w}x{h}", [encoded[(w, h)]] * count) for (w, h) in SIZES]
    if mixed:
        large, small = (encoded[size] for size in reversed(SIZES))
        images = [large if i % 4 == 0 else small for i in range(count)]
        random.Random(49).shuffle(images)
        named.append(("mixed", images))
    return named


def measure(source: Image.Image, threads: int, rounds: int, mixed: bool = False) -> list[dict[str, Any]]:
    pool = ThreadPoolExecutor(threads, initializer=_name_thread)
    rows = []
    for name, batch in batches(source, threads, mixed):

        def per_image(batch: list[bytes] = batch) -> None:
            for array in pool.map(pixelwire.decode_image, batch):
                del array

        def kept(batch: list[bytes] = batch) -> None:
            arrays = list(pool.map(pixelwire.decode_image, batch))
            del arrays

        def many(batch: list[bytes] = batch) -> None:
            arrays = pixelwire.decode_many(batch, threads=threads)
            del arrays

        kinds = {"threads": per_image, "kept": kept, "many": many}
        # Thread names as the kernel keeps them (15 characters).
        workers = {
            "threads": ("pw-bench-decode",),
            "kept": ("pw-bench-decode",),
            "many": ("pixelwire-decod",),
        }
        seconds: dict[str, list[float]] = {kind: [] for kind in kinds}
        measures = ("faults", "user", "system", "voluntary", "involuntary", "busy", "steal")
        totals = {kind: dict.fromkeys(measures, 0.0) for kind in kinds}
        for run in kinds.values():
            run()
        for _ in range(rounds):
            for kind, run in kinds.items():
                before = resource.getrusage(resource.RUSAGE_SELF)
                cpu_before = _thread_cpu(workers[kind])
                steal_before = _steal_ticks()
                start = time.perf_counter()
                run()
                elapsed = time.perf_counter() - start
                steal = (_steal_ticks() - steal_before) * TICK
                cpu = _thread_cpu(workers[kind]) - cpu_before
                after = resource.getrusage(resource.RUSAGE_SELF)
                seconds[kind].append(elapsed)
                t = totals[kind]
                t["faults"] += after.ru_minflt - before.ru_minflt
                t["user"] += after.ru_utime - before.ru_utime
                t["system"] += after.ru_stime - before.ru_stime
                t["voluntary"] += after.ru_nvcsw - before.ru_nvcsw
                t["involuntary"] += after.ru_nivcsw - before.ru_nivcsw
                t["busy"] += cpu / (threads * elapsed)
                t["steal"] += steal / ((os.cpu_count() or 1) * elapsed)
        base = statistics.median(seconds["threads"])
        images = rounds * len(batch)
        cells = []
        for kind, times in seconds.items():
            median = statistics.median(times)
            t = totals[kind]
            row = {
                "size": name,
                "threads": threads,
                "kind": kind,
                "images": len(batch),
                "median_ms": median * 1e3,
                "seconds": times,
                "images_per_s": len(batch) / median,
                "ratio_to_threads": base / median,
                "faults_per_image": t["faults"] / images,
                "user_ms_per_image": t["user"] * 1e3 / images,
                "system_ms_per_image": t["system"] * 1e3 / images,
                "voluntary_switches_per_image": t["voluntary"] / images,
                "involuntary_switches_per_image": t["involuntary"] / images,
                "busy": t["busy"] / rounds,
                "steal": t["steal"] / rounds,
            }
            rows.append(row)
            cells.append(
                f"{kind} {row['images_per_s']:.1f}/s ({row['ratio_to_threads']:.2f}x, "
                f"{row['faults_per_image']:.0f} faults, cpu {row['user_ms_per_image']:.1f}+"
                f"{row['system_ms_per_image']:.1f} ms, busy {row['busy']:.2f}, steal {row['steal']:.0%})"
            )
        print(f"{name}, {threads} threads: " + "; ".join(cells), flush=True)
    pool.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="2", help="thread counts, comma-separated (default: 2)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--mixed", action="store_true", help="also a batch of mixed 1080p and 4K images")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="photo the inputs are made from")
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args()
    source = Image.open(args.source).convert("RGB")
    print(
        f"pixelwire {pixelwire.__version__} ({Path(pixelwire.__file__).parent}), {os.cpu_count()} CPUs, "
        f"thread CPU from {'schedstat' if _schedstat_works() else 'clock ticks'}",
        flush=True,
    )
    rows = []
    for threads in (int(n) for n in args.threads.split(",")):
        rows += measure(source, threads, args.rounds, args.mixed)
    if args.json is not None:
        args.json.write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
