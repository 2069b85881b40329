"""`pixelwire bench transfer`: frontend-to-worker transfer, two processes.

For each image size: per-image latency (p50/p99) and throughput of
`Reader.read_decoded` (descriptor already in hand, as in serving), against
(a) an in-process memcpy of the same bytes and (b) the same transfer done with
the `nixl` Python API the naive way: a fresh registration and fresh agent
metadata for every image.
"""

from __future__ import annotations

import asyncio
import base64
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import pixelwire
from pixelwire.frontend_process import FrontendProcess, nixl_python_api

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

    def line(self) -> str:
        mb = self.size / MiB
        return (
            f"{mb:8.3f} {self.pixelwire_p50_us:10.1f} {self.pixelwire_p99_us:10.1f}"
            f" {self.pixelwire_gbps:8.2f}"
            f" {self.memcpy_gbps:8.2f} {self.pixelwire_gbps / self.memcpy_gbps:7.0%}"
            f" {self.naive_p50_us:10.1f} {self.naive_p50_us / self.pixelwire_p50_us:7.1f}x"
            f" {max(self.pixelwire_p50_us - self.memcpy_us, 0.0):10.1f}"
        )


HEADER = (
    "      MB    p50 us     p99 us    GB/s  memcpy  %memcpy   naive us  speedup  overhead us\n"
    "  (pixelwire: read_decoded, numpy output; naive: register + metadata per image)"
)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _memcpy_seconds(size: int, repeats: int) -> float:
    src = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _naive_seconds(frontend: FrontendProcess, size: int, repeats: int) -> float:
    api = nixl_python_api()
    agent = api.nixl_agent("naive-worker", api.nixl_agent_config(backends=["UCX"]))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        remote = frontend.ask(cmd="naive_prepare", size=size)
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
        frontend.ask(cmd="naive_release", id=remote["id"])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def _pixelwire_seconds(
    reader: pixelwire.Reader, frontend: FrontendProcess, size: int, repeats: int, device: str
) -> list[float]:
    image = ppm_of_size(size)
    expected = pixelwire.decode_image(image)
    descs = frontend.publish_many(image, repeats + 3)["descs"]
    times = []
    for i, desc in enumerate(descs):
        start = time.perf_counter()
        if device == "cpu":
            pixels = await reader.read_decoded(desc, output="numpy")
        else:
            pixels = await reader.read_decoded(desc, output="torch", device=device)
        elapsed = time.perf_counter() - start
        if i == 0:
            got = pixels if device == "cpu" else pixels.cpu().numpy()
            np.testing.assert_array_equal(got, expected)
        if i >= 3:  # the first reads connect and warm the pools
            times.append(elapsed)
    return times


def transfer(
    sizes: list[int] | None = None, repeats: int = 50, naive: bool = True, device: str = "cpu"
) -> list[Row]:
    rows = []
    frontend = FrontendProcess(pool_bytes=1024 * MiB, lease=120)
    try:

        async def run() -> None:
            async with pixelwire.Reader(pool_bytes=512 * MiB) as reader:
                for size in sizes or SIZES:
                    # Publish no more than the frontend's pool holds.
                    n = min(repeats if size <= 4 * MiB else max(10, repeats // 5), 1024 * MiB // size - 4)
                    times = await _pixelwire_seconds(reader, frontend, size, n, device)
                    p50 = _percentile(times, 0.5)
                    memcpy = _memcpy_seconds(size, n)
                    naive_s = _naive_seconds(frontend, size, max(5, n // 5)) if naive else float("nan")
                    rows.append(
                        Row(
                            size=size,
                            pixelwire_p50_us=p50 * 1e6,
                            pixelwire_p99_us=_percentile(times, 0.99) * 1e6,
                            pixelwire_gbps=size / p50 / 1e9,
                            memcpy_us=memcpy * 1e6,
                            memcpy_gbps=size / memcpy / 1e9,
                            naive_p50_us=naive_s * 1e6,
                        )
                    )
                    print(rows[-1].line(), flush=True)

        print(HEADER + f"\n  destination: {device}", flush=True)
        asyncio.run(run())
    finally:
        frontend.close()
    return rows


def as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    return [row.__dict__ for row in rows]
