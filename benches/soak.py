"""Soak test of the NIXL transfer (`make soak`, not in CI).

One frontend child process (`pixelwire.publisher_process`) decodes and
publishes images of random sizes (64 KiB to 24 MiB of RGB pixels) into its
registered pool; reader child processes (this script with `--worker`, each a
`pixelwire.Reader`) READ them over NIXL/UCX and answer with a SHA-1 of the
pixels, which this process compares with the digest of its own decode of the
same bytes. Two readers run side by side:

* the *steady* reader is never killed, so its RSS and registered bytes show
  whether a long-lived worker leaks;
* the *victim* reader takes a share of the ordinary reads and every read
  picked for a kill (a random `--kill-rate` of the cycles): it is sent the
  descriptor and SIGKILLed a random fraction of (`--kill-delay-ms` +
  `--kill-delay-ms-per-mib` x the image's MiB) later, so before, during or
  just after its READ, then replaced by a fresh process. The slot of a read
  that never notified must come back through the frontend's lease.

Every `--sample-every` cycles it samples both processes' RSS, the frontend's
pool stats and the readers' receive-pool stats. At the end it waits for the
lease, checks that no slot is left in use, and writes `soak.json` and
`soak.png` (RSS, registered bytes, slots in use against the cycle) under
`--out`. Exit status 0 when the run passes: every cycle done, no wrong pixel,
no failed ordinary read or publish, no leaked slot, flat RSS.

    python benches/soak.py                 # 10,000 cycles
    python benches/soak.py --quick         # 500 cycles
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import math
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

KiB = 1024
MiB = 1024 * 1024
MIN_PIXEL_BYTES = 64 * KiB
MAX_PIXEL_BYTES = 24 * MiB
READER_POOL_BYTES = 256 * MiB  # pixelwire.Reader's default receive pool cap
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "target" / "soak"
# "Flat" RSS: a least-squares slope over the second half of the run below this.
FLAT_KIB_PER_1000 = 1024.0


def rss_kib(pid: int | str = "self") -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# --------------------------------------------------------------------------
# The reader child process.


def _say(answer: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()


async def _worker(read_timeout: float, verify: bool) -> None:
    import pixelwire

    loop = asyncio.get_running_loop()
    async with pixelwire.Reader(timeout=read_timeout, verify=verify) as reader:
        _say({"ready": os.getpid()})
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            kind = cmd["cmd"]
            if kind == "exit":
                break
            if kind == "stats":
                _say({"stats": reader.stats(), "rss_kib": rss_kib()})
                continue
            if cmd.get("mark"):
                _say({"reading": True})  # tells a kill that lands after it from one before
            started = time.perf_counter()
            try:
                pixels = await reader.read_decoded(cmd["desc"], output="numpy")
            except Exception as error:  # noqa: BLE001 - every failure is reported by type
                _say({"error": type(error).__name__, "message": str(error)[:400]})
                continue
            read_ms = (time.perf_counter() - started) * 1000
            pixels = np.ascontiguousarray(pixels)
            digest = hashlib.sha1(pixels.data.cast("B")).hexdigest()
            if digest != cmd.get("expect") and cmd.get("dump"):
                np.save(cmd["dump"], pixels)
            shape = list(pixels.shape)
            del pixels  # gives the receive slot back before the next command
            _say({"digest": digest, "shape": shape, "read_ms": read_ms})


# --------------------------------------------------------------------------
# Child process plumbing with bounded waits.


def _read_line(proc: subprocess.Popen[str], timeout: float, what: str) -> dict[str, Any]:
    """One JSON answer line; every exchange is one command, one line, so the
    text wrapper never holds a second line that select() would not see."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise TimeoutError(f"{what}: no answer within {timeout:.0f} s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{what}: the process died (exit {proc.poll()})")
    answer: dict[str, Any] = json.loads(line)
    return answer


def _stop(proc: subprocess.Popen[str]) -> None:
    try:
        if proc.poll() is None and proc.stdin is not None:
            proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
            proc.stdin.flush()
            proc.wait(timeout=20)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=20)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:
                pass


class Worker:
    """A reader child (this script with --worker)."""

    def __init__(self, role: str, stderr: TextIO, read_timeout: float, verify: bool, timeout: float) -> None:
        self.role = role
        self.timeout = timeout
        self.started_at = time.monotonic()
        env = {**os.environ, "NIXL_LOG_LEVEL": os.environ.get("NIXL_LOG_LEVEL", "FATAL")}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                "--read-timeout",
                str(read_timeout),
                "--verify",
                str(int(verify)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        self.ready = False
        self.reads = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self) -> None:
        if not self.ready:
            _read_line(self.proc, self.timeout, f"{self.role} reader start")
            self.ready = True

    def send(self, **cmd: Any) -> None:
        self.wait_ready()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def ask(self, **cmd: Any) -> dict[str, Any]:
        self.send(**cmd)
        return _read_line(self.proc, self.timeout, f"{self.role} reader {cmd['cmd']}")

    def kill(self) -> list[dict[str, Any]]:
        """SIGKILL; then the whole lines it managed to write."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=20)
        lines = []
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout.read().splitlines(keepends=True):
                if line.endswith("\n"):
                    lines.append(json.loads(line))
        except (OSError, ValueError):
            pass
        _stop(self.proc)
        return lines

    def stop(self) -> None:
        _stop(self.proc)


# --------------------------------------------------------------------------
# Inputs.


@dataclass
class Image:
    index: int
    path: Path
    fmt: str
    width: int
    height: int
    encoded_bytes: int
    digest: str  # SHA-1 of pixelwire.decode_image(bytes), what the reader must see
    pillow_agrees: bool

    @property
    def pixel_bytes(self) -> int:
        return self.width * self.height * 3


def _pixels(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """Smooth gradients and waves with a little noise: compresses like a
    photo, decodes fast, and any misplaced block of bytes changes the digest."""
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    out = np.empty((height, width, 3), dtype=np.uint8)
    for c in range(3):
        fx, fy, phase = rng.uniform(1, 12), rng.uniform(1, 12), rng.uniform(0, 6.3)
        wave = 96 * np.sin(fx * 6.283 * x + phase) * np.cos(fy * 6.283 * y)
        ramp = 127 * (x * rng.uniform(-1, 1) + y * rng.uniform(-1, 1))
        noise = rng.integers(-6, 7, (height, width), dtype=np.int16)
        out[:, :, c] = np.clip(128 + wave + ramp + noise, 0, 255).astype(np.uint8)
    return out


def make_images(count: int, seed: int, folder: Path) -> list[Image]:
    """`count` images, pixel sizes log-uniform from 64 KiB to 24 MiB (both
    ends included), aspect ratios 1:2 to 2:1, PNG (level 1) and JPEG (q 90)."""
    from PIL import Image as PILImage

    import pixelwire

    rng = np.random.default_rng(seed)
    lo, hi = math.log(MIN_PIXEL_BYTES), math.log(MAX_PIXEL_BYTES)
    targets = [MIN_PIXEL_BYTES, MAX_PIXEL_BYTES] + [
        math.exp(rng.uniform(lo, hi)) for _ in range(max(0, count - 2))
    ]
    images = []
    for index, target in enumerate(sorted(targets)):
        pixels_wanted = target / 3
        aspect = math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
        width = max(8, round(math.sqrt(pixels_wanted * aspect)))
        height = max(8, round(pixels_wanted / width))
        while width * height * 3 > MAX_PIXEL_BYTES:
            height -= 1
        while width * height * 3 < MIN_PIXEL_BYTES:
            height += 1
        pixels = _pixels(rng, width, height)
        fmt = "PNG" if index % 2 == 0 else "JPEG"
        buf = io.BytesIO()
        if fmt == "PNG":
            PILImage.fromarray(pixels).save(buf, "PNG", compress_level=1)
        else:
            PILImage.fromarray(pixels).save(buf, "JPEG", quality=90)
        data = buf.getvalue()
        decoded = pixelwire.decode_image(data)
        with PILImage.open(io.BytesIO(data)) as opened:
            reference = np.asarray(opened.convert("RGB"))
        path = folder / f"img{index:03d}.{fmt.lower()}"
        path.write_bytes(data)
        images.append(
            Image(
                index=index,
                path=path,
                fmt=fmt,
                width=width,
                height=height,
                encoded_bytes=len(data),
                digest=hashlib.sha1(np.ascontiguousarray(decoded).data.cast("B")).hexdigest(),
                pillow_agrees=bool(np.array_equal(decoded, reference)),
            )
        )
    return images


# --------------------------------------------------------------------------
# The soak.


def _slope_per_1000(cycles: list[int], values: list[float]) -> float:
    if len(cycles) < 3 or len(set(cycles)) < 2:
        return 0.0
    slope = np.polyfit(np.asarray(cycles, float), np.asarray(values, float), 1)[0]
    return float(slope * 1000)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0


def _wrong_pixels(image: Image, dump: Path) -> int:
    import pixelwire

    expected = pixelwire.decode_image(image.path.read_bytes())
    try:
        got = np.load(dump)
    except (OSError, ValueError):
        return image.width * image.height
    if got.shape != expected.shape:
        return image.width * image.height
    return int(np.any(got != expected, axis=2).sum())


def soak(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "wrong").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="pixelwire-soak-"))
    stderr_log = open(out / "readers-stderr.log", "w")
    from pixelwire.publisher_process import PublisherProcess

    front: PublisherProcess | None = None
    steady: Worker | None = None
    victim: Worker | None = None
    started = time.monotonic()
    deadline = started + args.max_minutes * 60

    def new_worker(role: str) -> Worker:
        return Worker(role, stderr_log, args.read_timeout, bool(args.verify), args.timeout)

    try:
        t0 = time.monotonic()
        images = make_images(args.images, args.seed, scratch)
        gen_s = time.monotonic() - t0
        print(
            f"{len(images)} images in {gen_s:.1f} s: {images[0].pixel_bytes / KiB:.0f} KiB to "
            f"{images[-1].pixel_bytes / MiB:.1f} MiB of pixels; "
            f"Pillow agrees on {sum(i.pillow_agrees for i in images)}/{len(images)}",
            flush=True,
        )
        front = PublisherProcess(
            args.pool_mib * MiB,
            args.lease,
            args.acquire,
            region_bytes=64 * MiB,
            answer_timeout=args.timeout,
            cache_bytes=args.cache_mib * MiB,
        )
        steady = new_worker("steady")
        victim = new_worker("victim")
        steady.wait_ready()
        victim.wait_ready()

        rng = random.Random(args.seed)
        counts: Counter[str] = Counter()
        read_errors: Counter[str] = Counter()  # ordinary reads that failed, by type
        publish_errors: Counter[str] = Counter()
        error_messages: list[str] = []
        kills: list[dict[str, Any]] = []
        samples: list[dict[str, Any]] = []
        publish_ms: list[float] = []
        read_ms: list[float] = []
        cycle_ms: list[float] = []
        wrong_pixels = 0
        wrong_images = 0
        pixel_bytes_read = 0
        last_progress = time.monotonic()
        done = 0

        def sample(cycle: int) -> None:
            assert front is not None and steady is not None and victim is not None
            fs = front.stats()
            st = steady.ask(cmd="stats")
            vs = victim.ask(cmd="stats")
            samples.append(
                {
                    "cycle": cycle,
                    "t": round(time.monotonic() - started, 3),
                    "front_rss_kib": front.rss_kib(),
                    "front": fs,
                    "steady_rss_kib": st["rss_kib"],
                    "steady": st["stats"],
                    "victim_rss_kib": vs["rss_kib"],
                    "victim": vs["stats"],
                    "victim_pid": victim.pid,
                    "soak_rss_kib": rss_kib(),
                }
            )

        sample(0)
        for cycle in range(1, args.cycles + 1):
            if time.monotonic() > deadline:
                print(f"stopping at cycle {cycle - 1}: --max-minutes {args.max_minutes} reached", flush=True)
                break
            image = images[rng.randrange(len(images))]
            kill = rng.random() < args.kill_rate
            to_victim = kill or rng.random() < args.victim_share
            kill_window_ms = args.kill_delay_ms + args.kill_delay_ms_per_mib * image.pixel_bytes / MiB
            kill_delay = rng.uniform(0.0, kill_window_ms / 1000) if kill else 0.0
            begun = time.perf_counter()
            answer = front.ask(cmd="publish", path=str(image.path))
            publish_ms.append((time.perf_counter() - begun) * 1000)
            counts["published"] += 1
            if "error" in answer:
                publish_errors[answer["error"]] += 1
                if len(error_messages) < 20:
                    error_messages.append(f"cycle {cycle} publish: {answer['error']}: {answer['message']}")
                done = cycle
                continue
            desc = answer["descs"][0]
            reader = victim if to_victim else steady
            dump = out / "wrong" / f"cycle{cycle}.npy"
            request = {"cmd": "read", "desc": desc, "expect": image.digest, "dump": str(dump)}
            if kill:
                victim_rss = rss_kib(victim.pid)
                victim.send(**request, mark=True)
                time.sleep(kill_delay)
                late = victim.kill()
                counts["killed"] += 1
                outcome = "before the read"
                for line in late:
                    if "reading" in line:
                        outcome = "during the read or the hash"
                    elif "digest" in line:
                        outcome = "after answering"
                        if line["digest"] != image.digest:
                            wrong_images += 1
                            wrong_pixels += _wrong_pixels(image, dump)
                    else:
                        outcome = f"after an error ({line.get('error')})"
                kills.append(
                    {
                        "cycle": cycle,
                        "delay_ms": round(kill_delay * 1000, 2),
                        "pixel_bytes": image.pixel_bytes,
                        "reads_before": victim.reads,
                        "rss_kib": victim_rss,
                        "outcome": outcome,
                    }
                )
                counts[f"killed {outcome}"] += 1
                victim = new_worker("victim")  # starts while the next cycles run
            else:
                reply = reader.ask(**request)
                reader.reads += 1
                if "error" in reply:
                    read_errors[reply["error"]] += 1
                    if len(error_messages) < 20:
                        error_messages.append(
                            f"cycle {cycle} {reader.role} read: {reply['error']}: {reply['message']}"
                        )
                elif reply["digest"] != image.digest:
                    wrong_images += 1
                    wrong_pixels += _wrong_pixels(image, dump)
                    counts["read, wrong pixels"] += 1
                else:
                    counts["read ok"] += 1
                    counts[f"read ok, {reader.role}"] += 1
                    pixel_bytes_read += image.pixel_bytes
                    read_ms.append(reply["read_ms"])
            cycle_ms.append((time.perf_counter() - begun) * 1000)
            done = cycle
            if cycle % args.sample_every == 0 or cycle == args.cycles:
                sample(cycle)
            if cycle % args.progress_every == 0:
                last = samples[-1]
                rate = args.progress_every / max(1e-9, time.monotonic() - last_progress)
                last_progress = time.monotonic()
                print(
                    f"cycle {cycle:6d}  {time.monotonic() - started:7.1f} s  {rate:5.1f}/s  "
                    f"ok {counts['read ok']}  killed {counts['killed']}  "
                    f"read errors {sum(read_errors.values())}  "
                    f"publish errors {sum(publish_errors.values())}  "
                    f"wrong {wrong_images}  | front RSS {last['front_rss_kib'] / KiB:.0f} MiB "
                    f"reg {last['front']['registered_bytes'] / MiB:.0f} MiB "
                    f"slots {last['front']['slots_in_use']}  | steady RSS "
                    f"{last['steady_rss_kib'] / KiB:.0f} MiB "
                    f"reg {last['steady']['registered_bytes'] / MiB:.0f} MiB",
                    flush=True,
                )
        run_s = time.monotonic() - started

        # Let every lease run out, then nothing may be left in use anywhere.
        victim.wait_ready()
        wait_until = time.monotonic() + args.lease * 3 + 10
        time.sleep(args.lease + 1.0)
        final = front.stats()
        # Only what the cache keeps may be left, held by no hand-out.
        while final["slots_in_use"] > final["pinned_slots"] and time.monotonic() < wait_until:
            time.sleep(0.5)
            final = front.stats()
        steady_final = steady.ask(cmd="stats")
        victim_final = victim.ask(cmd="stats")
        sample(done)
        samples[-1]["after_lease"] = True

        return _report(
            args=args,
            out=out,
            images=images,
            gen_s=gen_s,
            run_s=run_s,
            done=done,
            counts=counts,
            read_errors=read_errors,
            publish_errors=publish_errors,
            error_messages=error_messages,
            kills=kills,
            samples=samples,
            publish_ms=publish_ms,
            read_ms=read_ms,
            cycle_ms=cycle_ms,
            wrong_images=wrong_images,
            wrong_pixels=wrong_pixels,
            pixel_bytes_read=pixel_bytes_read,
            final=final,
            steady_final=steady_final,
            victim_final=victim_final,
        )
    finally:
        for child in (victim, steady):
            if child is not None:
                child.stop()
        if front is not None:
            front.close()
        stderr_log.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _report(**r: Any) -> dict[str, Any]:
    args, out, samples, final = r["args"], r["out"], r["samples"], r["final"]
    run = [s for s in samples if not s.get("after_lease")]
    half = r["done"] / 2
    second = [s for s in run if s["cycle"] >= half]

    def series(key: str) -> list[int]:
        return [s[key] for s in run]

    window = max(1, r["done"] // 20)

    def envelope_slope(points: list[tuple[int, int]]) -> float:
        """Slope of the per-window maxima: RSS dips (pages given back) come
        and go, a leak raises the peaks."""
        peaks: dict[int, int] = {}
        for cycle, value in points:
            peaks[cycle // window] = max(peaks.get(cycle // window, value), value)
        return _slope_per_1000([k * window + window // 2 for k in peaks], list(peaks.values()))

    def rss_summary(key: str, pool: str) -> dict[str, Any]:
        values = series(key)
        raw = [(s["cycle"], s[key]) for s in second]
        # RSS less the registered pool (its pages count once touched, and it
        # grows by whole regions up to its cap): what else the process holds,
        # which is where a leak would show.
        beyond = [(s["cycle"], s[key] - s[pool]["registered_bytes"] // KiB) for s in second]
        return {
            "first_kib": values[0],
            "warm_kib": next(s[key] for s in run if s["cycle"] >= r["done"] / 10),
            "last_kib": values[-1],
            "max_kib": max(values),
            "after_lease_kib": samples[-1][key],
            "slope_second_half_kib_per_1000_cycles": round(
                _slope_per_1000([c for c, _ in raw], [v for _, v in raw]), 1
            ),
            "peak_slope_second_half_kib_per_1000_cycles": round(envelope_slope(raw), 1),
            "beyond_registered_first_kib": values[0] - run[0][pool]["registered_bytes"] // KiB,
            "beyond_registered_last_kib": beyond[-1][1],
            "beyond_registered_max_kib": max(s[key] - s[pool]["registered_bytes"] // KiB for s in run),
            "beyond_registered_slope_second_half_kib_per_1000_cycles": round(
                _slope_per_1000([c for c, _ in beyond], [v for _, v in beyond]), 1
            ),
            "beyond_registered_peak_slope_second_half_kib_per_1000_cycles": round(envelope_slope(beyond), 1),
        }

    front_rss = rss_summary("front_rss_kib", "front")
    steady_rss = rss_summary("steady_rss_kib", "steady")
    victim_rss = {
        "max_kib": max(series("victim_rss_kib")),
        "at_kill_median_kib": statistics.median([k["rss_kib"] for k in r["kills"]]) if r["kills"] else None,
        "at_kill_max_kib": max([k["rss_kib"] for k in r["kills"]], default=None),
    }
    registered = {
        "front_first": run[0]["front"]["registered_bytes"],
        "front_last": run[-1]["front"]["registered_bytes"],
        "front_max": max(s["front"]["registered_bytes"] for s in run),
        "front_regions_max": max(s["front"]["regions"] for s in run),
        "steady_reader_max": max(s["steady"]["registered_bytes"] for s in run),
        "steady_reader_last": run[-1]["steady"]["registered_bytes"],
        "victim_reader_max": max(s["victim"]["registered_bytes"] for s in run),
    }
    counts = dict(r["counts"])
    leaked_slots = final["slots_in_use"] - final["pinned_slots"]
    key = "beyond_registered_peak_slope_second_half_kib_per_1000_cycles"
    flat = {
        "frontend": front_rss[key] <= FLAT_KIB_PER_1000,
        "steady_reader": steady_rss[key] <= FLAT_KIB_PER_1000,
    }
    reader_left = {
        "steady_bytes_in_use": r["steady_final"]["stats"]["bytes_in_use"],
        "victim_bytes_in_use": r["victim_final"]["stats"]["bytes_in_use"],
    }
    checks = {
        "all_cycles_done": r["done"] == args.cycles,
        "zero_wrong_pixels": r["wrong_pixels"] == 0 and r["wrong_images"] == 0,
        "zero_leaked_slots": leaked_slots == 0
        and final["bytes_in_use"] == final["pinned_bytes"]
        and final["outstanding_handouts"] == 0,
        "cache_within_budget": final["pinned_bytes"] <= args.cache_mib * MiB,
        "zero_reader_bytes_left": not any(reader_left.values()),
        "no_failed_ordinary_read": not r["read_errors"],
        "no_failed_publish": not r["publish_errors"],
        "every_slot_accounted": final["published"]
        == final["freed_by_notification"]
        + final["reclaimed_by_lease"]
        + final.get("returned", 0)
        + final["freed_by_eviction"]
        + final["pinned_slots"],
        "flat_rss": all(flat.values()),
        "registered_within_caps": registered["front_max"] <= args.pool_mib * MiB
        and registered["steady_reader_max"] <= READER_POOL_BYTES
        and registered["victim_reader_max"] <= READER_POOL_BYTES,
    }
    kill_outcomes = Counter(k["outcome"] for k in r["kills"])
    report = {
        "passed": all(checks.values()),
        "checks": checks,
        "config": {
            k: getattr(args, k)
            for k in (
                "cycles",
                "seed",
                "kill_rate",
                "kill_delay_ms",
                "kill_delay_ms_per_mib",
                "victim_share",
                "images",
                "pool_mib",
                "lease",
                "read_timeout",
                "verify",
                "sample_every",
            )
        },
        "runtime_s": round(r["run_s"], 1),
        "image_generation_s": round(r["gen_s"], 1),
        "cycles_done": r["done"],
        "cycles_per_s": round(r["done"] / r["run_s"], 2),
        "counts": counts,
        "reads_ok": counts.get("read ok", 0),
        "killed": counts.get("killed", 0),
        "kill_outcomes": dict(kill_outcomes),
        "kills_without_notification_expected_by_lease": final["reclaimed_by_lease"],
        "read_errors_by_type": dict(r["read_errors"]),
        "publish_errors_by_type": dict(r["publish_errors"]),
        "error_messages": r["error_messages"],
        "wrong_images": r["wrong_images"],
        "wrong_pixels": r["wrong_pixels"],
        "leaked_slots": leaked_slots,
        "leaked_bytes": final["bytes_in_use"],
        "frontend_final_stats": final,
        "reader_bytes_left": reader_left,
        "rss": {"frontend": front_rss, "steady_reader": steady_rss, "victim_reader": victim_rss},
        "flat_rule": (
            f"per-{window}-cycle peaks of RSS less registered bytes rise by at most "
            f"{FLAT_KIB_PER_1000:.0f} KiB per 1000 cycles over the second half"
        ),
        "registered_bytes": registered,
        "pixel_bytes_read": r["pixel_bytes_read"],
        "latency_ms": {
            "publish_p50": round(_pct(r["publish_ms"], 50), 2),
            "publish_p99": round(_pct(r["publish_ms"], 99), 2),
            "read_p50": round(_pct(r["read_ms"], 50), 2),
            "read_p99": round(_pct(r["read_ms"], 99), 2),
            "cycle_p50": round(_pct(r["cycle_ms"], 50), 2),
            "cycle_p99": round(_pct(r["cycle_ms"], 99), 2),
        },
        "images": [
            {
                "file": i.path.name,
                "width": i.width,
                "height": i.height,
                "pixel_bytes": i.pixel_bytes,
                "encoded_bytes": i.encoded_bytes,
                "pillow_agrees": i.pillow_agrees,
            }
            for i in r["images"]
        ],
        "kills": r["kills"],
        "samples": samples,
    }
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    report["chart"] = _chart(out / "soak.png", samples, r["kills"], args)
    return report


def _chart(path: Path, samples: list[dict[str, Any]], kills: list[dict[str, Any]], args: Any) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install matplotlib)", flush=True)
        return None
    run = [s for s in samples if not s.get("after_lease")]
    x = [s["cycle"] for s in run]
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    ax = axes[0]
    ax.plot(x, [s["front_rss_kib"] / KiB for s in run], label="frontend RSS")
    ax.plot(x, [s["steady_rss_kib"] / KiB for s in run], label="steady reader RSS (never killed)")
    ax.plot(x, [s["victim_rss_kib"] / KiB for s in run], label="victim reader RSS (new at each kill)", lw=0.7)
    for key, pool, label in (
        ("front_rss_kib", "front", "frontend RSS less registered"),
        ("steady_rss_kib", "steady", "steady reader RSS less registered"),
    ):
        less = [(s[key] - s[pool]["registered_bytes"] // KiB) / KiB for s in run]
        ax.plot(x, less, ls="--", lw=0.8, label=label)
    for k in kills:
        ax.axvline(k["cycle"], color="red", alpha=0.15, lw=0.6)
    ax.set_ylabel("MiB")
    ax.set_title(
        f"pixelwire soak: {x[-1]} publish/read cycles, {len(kills)} readers killed (red lines), "
        f"lease {args.lease:g} s"
    )
    ax.legend(loc="lower right", fontsize=8)
    ax.set_ylim(bottom=0)
    ax = axes[1]
    ax.plot(x, [s["front"]["registered_bytes"] / MiB for s in run], label="frontend registered")
    ax.plot(x, [s["steady"]["registered_bytes"] / MiB for s in run], label="steady reader registered")
    ax.plot(x, [s["victim"]["registered_bytes"] / MiB for s in run], label="victim reader registered", lw=0.7)
    ax.set_ylabel("MiB")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_ylim(bottom=0)
    ax = axes[2]
    ax.step(x, [s["front"]["slots_in_use"] for s in run], where="post", label="frontend slots in use")
    ax2 = ax.twinx()
    ax2.plot(x, [s["front"]["bytes_in_use"] / MiB for s in run], color="tab:orange", lw=0.7)
    ax2.set_ylabel("frontend MiB in use", color="tab:orange")
    ax.set_ylabel("slots in use (sampled)")
    ax.set_xlabel("cycle")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--cycles", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="500 cycles (overrides --cycles)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for soak.json and soak.png")
    parser.add_argument("--kill-rate", type=float, default=0.01, help="share of reads whose reader is killed")
    parser.add_argument("--kill-delay-ms", type=float, default=2.0, help="kill window after sending")
    parser.add_argument("--kill-delay-ms-per-mib", type=float, default=0.7, help="kill window per MiB")
    parser.add_argument("--victim-share", type=float, default=0.5, help="victim's share of other reads")
    parser.add_argument("--images", type=int, default=40, help="distinct generated images")
    parser.add_argument("--pool-mib", type=int, default=256, help="frontend pool cap")
    parser.add_argument("--lease", type=float, default=5.0, help="frontend lease, seconds")
    parser.add_argument(
        "--cache-mib",
        type=int,
        default=64,
        help="frontend cache of published images (0: off): the images repeat, so most cycles are "
        "hand-outs of a kept slot, read by both readers and killed mid-read alike",
    )
    parser.add_argument("--acquire", type=float, default=10.0, help="frontend wait for a free slot, seconds")
    parser.add_argument("--read-timeout", type=float, default=30.0)
    parser.add_argument("--verify", type=int, default=1, help="readers check the content hash (1/0)")
    parser.add_argument("--timeout", type=float, default=120.0, help="longest wait for any child's answer")
    parser.add_argument("--sample-every", type=int, default=20)
    parser.add_argument("--progress-every", type=int, default=500)
    parser.add_argument("--max-minutes", type=float, default=120.0, help="stop the cycles after this long")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        asyncio.run(_worker(args.read_timeout, bool(args.verify)))
        return
    if args.quick:
        args.cycles = 500
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up in soak()'s finally
    report = soak(args)
    rss = report["rss"]
    slope = "beyond_registered_peak_slope_second_half_kib_per_1000_cycles"
    print(
        json.dumps(
            {k: report[k] for k in report if k not in ("samples", "kills", "images", "error_messages")},
            indent=1,
        ),
        flush=True,
    )
    print(
        f"\n{'PASSED' if report['passed'] else 'FAILED'}: {report['cycles_done']} cycles in "
        f"{report['runtime_s']:.0f} s; reads ok {report['reads_ok']}, killed {report['killed']}, "
        f"read errors {report['read_errors_by_type']}, publish errors {report['publish_errors_by_type']}, "
        f"wrong pixels {report['wrong_pixels']}, leaked slots {report['leaked_slots']}; "
        f"RSS less registered, peak slope over the 2nd half (KiB/1000 cycles): frontend "
        f"{rss['frontend'][slope]}, steady reader {rss['steady_reader'][slope]}; chart {report['chart']}",
        flush=True,
    )
    sys.exit(0 if report["passed"] else 1)


if __name__ == "__main__":
    main()
