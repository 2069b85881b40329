"""The CPU readings `pixelwire bench serve` takes of its servers
(`python/pixelwire/bench/services.py`): nanoseconds per thread where every
thread is still there, clock ticks where one ended. (Ticks and nanoseconds
need not agree: the kernel holds the ticks it reports from going back, so
they can lag the nanoseconds by tens of milliseconds.)"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from pixelwire.bench.services import CpuReading, cpu_seconds


def test_a_reading_counts_each_threads_own_cpu_clock() -> None:
    """A thread of this process burns CPU, notes its own CPU clock
    (CLOCK_THREAD_CPUTIME_ID) and waits: the reading taken then holds that
    thread's nanoseconds (the same counter, to within the few instructions
    between noting it and waiting), and a reading minus one taken before
    the thread began counts all of them."""
    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("this kernel has no schedstat (the readings then count ticks only)")
    before = cpu_seconds(os.getpid())
    noted, release = threading.Event(), threading.Event()
    spent: list[int] = []

    def burn() -> None:
        total = 0
        while time.thread_time_ns() < 200_000_000:
            total += sum(range(10_000))
        spent.append(time.thread_time_ns())
        noted.set()
        release.wait()

    worker = threading.Thread(target=burn)
    worker.start()
    try:
        assert noted.wait(60)
        during = cpu_seconds(os.getpid())
    finally:
        release.set()
        worker.join()
    assert worker.native_id not in before.thread_ns
    assert abs(during.thread_ns[worker.native_id] - spent[0]) < 1_000_000, (during.thread_ns, spent)
    if before.thread_ns.keys() <= during.thread_ns.keys():
        assert during - before >= spent[0] / 1e9


def test_a_thread_that_began_and_ended_between_two_readings_is_counted() -> None:
    """A thread that burns CPU and ends between two readings is in neither
    one's threads, but its time is in the process's ticks: the difference
    counts it (a video decoder's threads live and die within one request)."""
    before = cpu_seconds(os.getpid())
    spent: list[int] = []

    def burn() -> None:
        total = 0
        while time.thread_time_ns() < 300_000_000:
            total += sum(range(10_000))
        spent.append(time.thread_time_ns())

    worker = threading.Thread(target=burn)
    worker.start()
    worker.join()
    after = cpu_seconds(os.getpid())
    assert after - before >= spent[0] / 1e9 - 0.02


def test_a_thread_that_ended_leaves_the_ticks_to_count() -> None:
    """Nanoseconds where the earlier reading's threads all remain (a new one
    counts whole); the ticks where one is gone, or a counter went back (its
    thread id taken by a new thread)."""
    earlier = CpuReading(1.0, {1: 5_000_000, 2: 7_000_000})
    assert CpuReading(1.02, {1: 9_000_000, 2: 7_000_000, 3: 1_000_000}) - earlier == 0.005
    assert CpuReading(1.5, {1: 9_000_000}) - earlier == 0.5
    assert CpuReading(1.5, {1: 9_000_000, 2: 1}) - earlier == 0.5
    # every thread kept, but the ticks grew by more than they can be off
    # (a tick per process per reading): a thread came and went between
    assert CpuReading(1.5, {1: 9_000_000, 2: 7_000_000}) - earlier == 0.5
    # no threads read (no schedstat): the ticks
    assert CpuReading(2.0) - CpuReading(1.0) == 1.0
