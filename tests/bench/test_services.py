"""The CPU readings `pixelwire bench serve` takes of its servers
(`python/pixelwire/bench/services.py`): nanoseconds per thread where every
thread is still there, clock ticks where one ended."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from pixelwire.bench.services import CLOCK_TICKS, CpuReading, cpu_seconds


def test_a_reading_counts_every_thread_and_agrees_with_the_ticks() -> None:
    """This process, a thread of it burning CPU between two readings: the
    threads' nanoseconds see it, and agree with the clock ticks to within
    their rounding (a tick at each end)."""
    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("this kernel has no schedstat (the readings then count ticks only)")
    before = cpu_seconds(os.getpid())
    done = threading.Event()

    def burn() -> None:
        total = 0
        while not done.is_set():
            total += sum(range(10_000))

    worker = threading.Thread(target=burn)
    worker.start()
    threading.Event().wait(0.3)
    during = cpu_seconds(os.getpid())
    done.set()
    worker.join()
    assert worker.native_id in during.thread_ns and worker.native_id not in before.thread_ns
    assert before.thread_ns.keys() <= during.thread_ns.keys()
    precise, ticks = during - before, during.seconds - before.seconds
    assert precise > 0
    assert abs(precise - ticks) <= 2 / CLOCK_TICKS + 0.005, (precise, ticks)


def test_a_thread_that_ended_leaves_the_ticks_to_count() -> None:
    """Nanoseconds where the earlier reading's threads all remain (a new one
    counts whole); the ticks where one is gone, or a counter went back (its
    thread id taken by a new thread)."""
    earlier = CpuReading(1.0, {1: 5_000_000, 2: 7_000_000})
    assert CpuReading(1.02, {1: 9_000_000, 2: 7_000_000, 3: 1_000_000}) - earlier == 0.005
    assert CpuReading(1.5, {1: 9_000_000}) - earlier == 0.5
    assert CpuReading(1.5, {1: 9_000_000, 2: 1}) - earlier == 0.5
    # no threads read (no schedstat): the ticks
    assert CpuReading(2.0) - CpuReading(1.0) == 1.0
