"""`pixelwire demo`: a publisher process (what the frontend runs) publishes images over NIXL, this
process reads them as the worker, checks every pixel and prints a table: a row per size of the
generated images, or a row per file given."""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import pixelwire
from pixelwire import nixl_interfaces
from pixelwire.nixl import ensure_nixl
from pixelwire.publisher_process import PublisherProcess

SIZES = [(320, 240), (640, 480), (1280, 720), (1920, 1080), (3840, 2160)]


def generated_image(width: int, height: int, seed: int) -> bytes:
    """A binary PPM with smooth gradients and some noise."""
    y, x = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(seed)
    r = (x * 255 // max(width - 1, 1)).astype(np.uint8)
    g = (y * 255 // max(height - 1, 1)).astype(np.uint8)
    b = ((x + y + seed * 31) % 256).astype(np.uint8) ^ rng.integers(0, 16, (height, width), dtype=np.uint8)
    pixels = np.stack([r, g, b], axis=2)
    return f"P6\n{width} {height}\n255\n".encode() + pixels.tobytes()


@dataclass
class Group:
    label: str
    latencies: list[float] = field(default_factory=list)
    read_seconds: list[float] = field(default_factory=list)
    nbytes: int = 0


def _inputs(files: list[Path], per_size: int, scratch: Path) -> list[tuple[str, Path]]:
    """(label, file) pairs, a row of the table per label: each generated
    size (its images written to `scratch`), or each file given, by name
    (by its path where two share a name)."""
    if not files:
        out = []
        for w, h in SIZES:
            for seed in range(per_size):
                file = scratch / f"{w}x{h}-{seed}.ppm"
                file.write_bytes(generated_image(w, h, seed))
                out.append((f"{w}x{h}", file))
        return out
    names = [p.name for p in files]
    return [(p.name if names.count(p.name) == 1 else str(p), p) for p in files]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _warm_up(reader: pixelwire.Reader, publisher: PublisherProcess, scratch: Path) -> float:
    """One small image published and read before the timed ones: the first
    read sets up the NIXL connection to the publisher (tens of milliseconds),
    which would otherwise land in one size's row. Its pixels are checked
    too. Returns its latency in seconds."""
    file = scratch / "warm-up.ppm"
    file.write_bytes(generated_image(64, 64, seed=99))
    start = time.perf_counter()
    answer = publisher.publish_file(file)
    if "desc" not in answer:
        raise RuntimeError(f"the publisher refused the warm-up image: {answer['error']}: {answer['message']}")
    got = await reader.read_decoded(answer["desc"], output="numpy")
    elapsed = time.perf_counter() - start
    if not np.array_equal(got, pixelwire.decode_image(file.read_bytes())):
        raise RuntimeError("the warm-up image's pixels differ")
    return elapsed


async def _run(
    inputs: list[tuple[str, Path]], publisher: PublisherProcess, scratch: Path
) -> tuple[dict[str, Group], int]:
    groups: dict[str, Group] = {}
    failures = 0
    async with pixelwire.Reader() as reader:
        warm_up = await _warm_up(reader, publisher, scratch)
        print(
            f"warm-up: first image read in {warm_up * 1e3:.1f} ms (NIXL connection set-up; not in the table)"
        )
        for label, path in inputs:
            data = path.read_bytes()
            try:
                expected = pixelwire.decode_image(data)
            except pixelwire.PixelwireError as error:
                print(f"skipped {label}: {type(error).__name__}: {error}")
                continue
            start = time.perf_counter()
            answer = publisher.publish_file(path)
            if "desc" not in answer:
                print(f"{label}: the publisher refused it: {answer['error']}: {answer['message']}")
                failures += 1
                continue
            read_start = time.perf_counter()
            got = await reader.read_decoded(answer["desc"], output="numpy")
            done = time.perf_counter()
            if not np.array_equal(got, expected):
                print(f"{label}: PIXELS DIFFER")
                failures += 1
                continue
            group = groups.setdefault(label, Group(label))
            group.latencies.append(done - start)
            group.read_seconds.append(done - read_start)
            group.nbytes += got.nbytes
    return groups, failures


def main(files: list[Path], per_size: int = 20) -> int:
    """Runs the demo over `files` (image files; none: `per_size` generated
    images of each of SIZES). Without NIXL's runtime it says what to
    install, on one line, and returns 2."""
    try:
        ensure_nixl()  # before the publisher process, which would die of it
    except pixelwire.TransferError as missing:
        print(f"pixelwire demo: error: {missing}", file=sys.stderr)
        return 2
    # Both ends run on this host: their agents (the publisher's, in the
    # child that inherits this, and the reader's) listen on the loopback
    # only, so an interface that comes or goes on the host meanwhile (a
    # container's or a network namespace's veth) is never the one the
    # reader connects to. UCX_NET_DEVICES set by the operator wins.
    nixl_interfaces.apply("lo")
    with tempfile.TemporaryDirectory(prefix="pixelwire-demo-") as scratch:
        inputs = _inputs(files, per_size, Path(scratch))
        print(f"pixelwire {pixelwire.__version__}: {len(inputs)} images, publisher process -> worker, NIXL")
        publisher = PublisherProcess(pool_bytes=512 << 20)
        try:
            groups, failures = asyncio.run(_run(inputs, publisher, Path(scratch)))
            stats = publisher.stats()
        finally:
            publisher.close()
    width = max([14, *(len(label) for label in groups)])
    print(f"\n{'images':>{width}} {'count':>6} {'MB':>9} {'p50 ms':>8} {'p99 ms':>8} {'read GB/s':>10}")
    every = Group("all")
    for group in groups.values():
        every.latencies += group.latencies
        every.read_seconds += group.read_seconds
        every.nbytes += group.nbytes
    for group in [*groups.values(), every]:
        if not group.latencies:
            continue
        print(
            f"{group.label:>{width}} {len(group.latencies):6d} {group.nbytes / 1e6:9.1f}"
            f" {_pct(group.latencies, 0.5) * 1e3:8.2f} {_pct(group.latencies, 0.99) * 1e3:8.2f}"
            f" {group.nbytes / sum(group.read_seconds) / 1e9:10.2f}"
        )
    print(
        "\nlatency: publish request (the publisher reads the file and decodes it into registered"
        " memory) to pixels in the worker;"
        " read GB/s: NIXL READ + checks only."
    )
    verified = sum(len(g.latencies) for g in groups.values())
    print(f"verified {verified} images pixel for pixel; publisher pool after the run: {stats}")
    median = statistics.median(every.latencies) * 1e3 if every.latencies else float("nan")
    print(f"median end-to-end latency {median:.2f} ms; failures: {failures}")
    return 1 if failures or not verified else 0
