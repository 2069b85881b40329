"""`pixelwire bench transfer`: frontend-to-worker transfer, two processes.

For each image size: per-image latency (p50/p99) and throughput of
`Reader.read_decoded` (descriptor already in hand, as in serving), against
(a) an in-process memcpy of the same bytes (best of N, between touched
buffers) and (b) the same transfer done with the `nixl` Python API the naive
way: a fresh registration and fresh agent metadata for every image. Where
torch sees a CUDA device, the same images are also READ into CUDA memory in
the same run, beside the card's pinned host-to-device copy of as many bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import pixelwire
from pixelwire.config import ReaderSettings
from pixelwire.publisher_process import PublisherProcess, nixl_python_api

KiB = 1024
MiB = 1024 * KiB
SIZES = [64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 24 * MiB]


def ppm_of_size(size: int, seed: int = 0) -> bytes:
    """A binary PPM whose decoded RGB pixels are exactly `size` bytes."""
    pixels = size // 3
    width = 1
    for w in range(int(pixels**0.5), 0, -1):
        if pixels % w == 0:
            width = w
            break
    height = pixels // width
    body = np.random.default_rng(seed).integers(0, 256, width * height * 3, dtype=np.uint8)
    return f"P6\n{width} {height}\n255\n".encode() + body.tobytes()


@dataclass
class Row:
    size: int
    pixelwire_p50_us: float
    pixelwire_p99_us: float
    pixelwire_gbps: float
    memcpy_us: float
    memcpy_gbps: float
    naive_p50_us: float
    # The same images READ into CUDA memory (nan without a CUDA device).
    cuda_p50_us: float = float("nan")
    cuda_p99_us: float = float("nan")
    cuda_gbps: float = float("nan")
    # The card's own pinned host-to-device copy of as many bytes, best of N.
    h2d_gbps: float = float("nan")

    def line(self) -> str:
        mb = self.size / MiB
        return (
            f"{mb:8.3f} {self.pixelwire_p50_us:9.1f} {self.pixelwire_p99_us:9.1f}"
            f" {self.pixelwire_gbps:7.2f} {self.memcpy_gbps:7.2f}"
            f" {self.pixelwire_gbps / self.memcpy_gbps:7.0%}"
            f" {self.naive_p50_us:9.1f} {self.naive_p50_us / self.pixelwire_p50_us:6.1f}x"
            f" {self.cuda_p50_us:9.1f} {self.cuda_gbps:7.2f} {self.cuda_gbps / self.pixelwire_gbps:6.2f}x"
            f" {self.h2d_gbps:7.2f}"
        )


HEADER = (
    "      MB   cpu p50   cpu p99  cpu GB/s memcpy %memcpy  naive us  speedup  cuda p50 cuda GB/s"
    " cuda/cpu  h2d GB/s\n"
    "  (read_decoded with the descriptor in hand, cpu and cuda reads alternating; cpu: numpy output;\n"
    "   cuda: torch output on the device, timed until the stream using it has the pixels;\n"
    "   memcpy: best of N between touched host buffers; naive: register + metadata per image;\n"
    "   h2d: pinned host-to-device copy of the same bytes, best of N)"
)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _memcpy_seconds(size: int, repeats: int) -> float:
    """Best of `repeats` copies between buffers that are already touched (no
    page faults in the anchor)."""
    src = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(max(repeats, 5)):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return min(times)


def _h2d_seconds(size: int, repeats: int, device: str) -> float:
    """Best of `repeats` pinned host-to-device copies of `size` bytes."""
    import torch

    host = torch.ones(size, dtype=torch.uint8).pin_memory()
    dev = torch.empty(size, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize(device)
    times = []
    for _ in range(max(repeats, 5)):
        start = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


def _naive_seconds(publisher: PublisherProcess, size: int, repeats: int) -> float:
    api = nixl_python_api()
    agent = api.nixl_agent("naive-worker", api.nixl_agent_config(backends=["UCX"]))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        remote = publisher.ask(cmd="naive_prepare", size=size)
        name = agent.add_remote_agent(base64.b64decode(remote["metadata"]))
        dst = np.empty(size, dtype=np.uint8)
        local = agent.register_memory([(dst.ctypes.data, size, 0, "")], mem_type="DRAM")
        handle = agent.initialize_xfer(
            "READ",
            agent.get_xfer_descs([(dst.ctypes.data, size, 0)], "DRAM"),
            agent.get_xfer_descs([(remote["addr"], size, 0)], "DRAM"),
            name,
            b"done",
        )
        state = agent.transfer(handle)
        while state != "DONE":
            state = agent.check_xfer_state(handle)
            if state == "ERR":
                raise pixelwire.TransferError("naive nixl transfer failed")
        agent.release_xfer_handle(handle)
        agent.deregister_memory(local)
        agent.remove_remote_agent(name)
        publisher.ask(cmd="naive_release", id=remote["id"])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def _pixelwire_seconds(
    reader: pixelwire.Reader, publisher: PublisherProcess, size: int, repeats: int, devices: list[str]
) -> dict[str, list[float]]:
    """`repeats` reads of one image to each destination, in rounds (one
    read to each destination a round), so that every destination meets the
    same machine state (a ratio between them is only fair so). A CUDA read
    is timed until the pixels are on the device: the stream that would use
    them is synchronised before the clock stops."""
    image = ppm_of_size(size)
    expected = pixelwire.decode_image(image)
    descs = publisher.publish_many(image, (repeats + 3) * len(devices))["descs"]
    times: dict[str, list[float]] = {device: [] for device in devices}
    if any(device != "cpu" for device in devices):
        import torch
    for i, desc in enumerate(descs):
        device = devices[i % len(devices)]
        start = time.perf_counter()
        if device == "cpu":
            pixels = await reader.read_decoded(desc, output="numpy")
        else:
            pixels = await reader.read_decoded(desc, output="torch", device=device)
            torch.cuda.current_stream(pixels.device).synchronize()
        elapsed = time.perf_counter() - start
        if i < len(devices):
            got = pixels if device == "cpu" else pixels.cpu().numpy()
            np.testing.assert_array_equal(got, expected)
        if i >= 3 * len(devices):  # the first rounds connect and warm the pools
            times[device].append(elapsed)
    return times


def cuda_devices() -> list[str]:
    """["cuda"] when torch sees a CUDA device, else []."""
    try:
        import torch
    except ImportError:
        return []
    return ["cuda"] if torch.cuda.is_available() else []


def transfer(
    sizes: list[int] | None = None,
    repeats: int = 50,
    naive: bool = True,
    devices: list[str] | None = None,
    reader: dict[str, Any] | None = None,
) -> list[Row]:
    """Each size READ to every destination in `devices` (default: the CPU,
    and CUDA where there is one) in one run, with the anchors beside them.
    `reader` overrides the Reader's settings (default: from the environment,
    as the plug-in reads them)."""
    devices = devices or ["cpu", *cuda_devices()]
    cuda = next((d for d in devices if d != "cpu"), None)
    # The CPU read is every row's reference; CUDA reads alternate with it.
    destinations = ["cpu", *([cuda] if cuda is not None else [])]
    settings = {**dataclasses.asdict(ReaderSettings.from_env()), "pool_bytes": 512 * MiB, **(reader or {})}
    rows = []
    publisher = PublisherProcess(pool_bytes=1024 * MiB, lease=120)
    try:

        async def run() -> None:
            async with pixelwire.Reader(**settings) as reader:
                for size in sizes or SIZES:
                    # Publish no more than the publisher's pool holds.
                    n = max(
                        1,
                        min(
                            repeats if size <= 4 * MiB else max(10, repeats // 5),
                            (1024 * MiB // size - 4) // len(destinations) - 3,
                        ),
                    )
                    both = await _pixelwire_seconds(reader, publisher, size, n, destinations)
                    times = both["cpu"]
                    p50 = _percentile(times, 0.5)
                    memcpy = _memcpy_seconds(size, n)
                    naive_s = _naive_seconds(publisher, size, max(5, n // 5)) if naive else float("nan")
                    row = Row(
                        size=size,
                        pixelwire_p50_us=p50 * 1e6,
                        pixelwire_p99_us=_percentile(times, 0.99) * 1e6,
                        pixelwire_gbps=size / p50 / 1e9,
                        memcpy_us=memcpy * 1e6,
                        memcpy_gbps=size / memcpy / 1e9,
                        naive_p50_us=naive_s * 1e6,
                    )
                    if cuda is not None:
                        times = both[cuda]
                        row.cuda_p50_us = _percentile(times, 0.5) * 1e6
                        row.cuda_p99_us = _percentile(times, 0.99) * 1e6
                        row.cuda_gbps = size / row.cuda_p50_us / 1e3
                        row.h2d_gbps = size / _h2d_seconds(size, n, cuda) / 1e9
                    rows.append(row)
                    print(row.line(), flush=True)

        shown = {k: v for k, v in settings.items() if k not in ("pool_bytes", "region_bytes", "max_pixels")}
        print(HEADER + f"\n  destinations: {', '.join(devices)}; reader: {shown}", flush=True)
        asyncio.run(run())
    finally:
        publisher.close()
    return rows


def as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    return [row.__dict__ for row in rows]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`pixelwire bench transfer`'s options."""
    parser.add_argument("--repeats", type=int, default=50, help="reads of each size (default: 50)")
    parser.add_argument(
        "--device",
        default="auto",
        help="read destinations, comma-separated (cpu, cuda[:N]); auto: cpu, and cuda where there is one",
    )
    parser.add_argument(
        "--sizes",
        help="image sizes in MiB, comma-separated (default: " + ",".join(f"{s / MiB:g}" for s in SIZES) + ")",
    )
    parser.add_argument("--no-naive", action="store_true", help="skip the naive nixl Python API baseline")
    parser.add_argument("--json", help="also write the rows to this JSON file (default: none)")


def run(args: argparse.Namespace) -> int:
    devices = None if args.device == "auto" else args.device.split(",")
    sizes = [round(float(s) * MiB) for s in args.sizes.split(",")] if args.sizes else None
    rows = transfer(sizes=sizes, repeats=args.repeats, naive=not args.no_naive, devices=devices)
    if args.json:
        Path(args.json).write_text(json.dumps(as_dicts(rows), indent=2))
    return 0
