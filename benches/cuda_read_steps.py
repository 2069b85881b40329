"""Where a read into CUDA memory spends its time, beside the host read it is
compared with. Two processes, as `pixelwire bench transfer`: a frontend
publishing random-pixel PPM images, this process reading them with one
``pixelwire.Reader`` (its own agent, receive pool, staging buffer and
stream: nothing else in the process competes with it).

For each size, kinds interleaved one read each a round (the first 3 rounds
warm up), medians in microseconds:

* ``parse``: ``parse_descriptor`` alone (both reads start with it);
* ``torch_calls``: the PyTorch calls a CUDA ``read_decoded`` makes beside
  its READ (the device tensor in the slot's shape, the caller's current
  stream), alone;
* ``cpu``, ``cuda``: ``Reader.read_decoded`` to numpy, and to a CUDA tensor
  timed until the caller's stream has it (the bench's two columns);
* ``host_native``: the native host read on this thread (READ, hash, slot
  header; no thread hop, no event loop);
* ``staged``: the native READ into the reader's pinned staging buffer on
  this thread in its CUDA chunks, no copy; ``staged_copied``: the same with
  each chunk's copy to the device queued from Python as it lands (the CUDA
  read's steps, timed from here): when each chunk landed and its copy was
  queued, when the call returned (hash and slot header checked), when the
  copies had ended on the device (CUDA events) and when a synchronise
  returned.

Each row also names the differences between kinds that are a step of the
read: ``await_us`` (``cpu`` over ``host_started_spin``: the event loop's
await and the Python around it), ``device_us`` (``cuda_started`` over
``host_started``, both waited by ``wait()``: what the device copies, their
wait and the driver calls add to the native read) and ``cuda_python_us``
(``cuda`` over ``cuda_started``: the Python of a CUDA ``read_decoded``, its
await included).

    python benches/cuda_read_steps.py [--sizes 0.0625,0.25,1,4,24] [--repeats 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pixelwire
from pixelwire.bench.transfer import ppm_of_size
from pixelwire.config import ReaderSettings
from pixelwire.descriptor import parse_descriptor
from pixelwire.publisher_process import PublisherProcess

MiB = 1 << 20
#: Bytes published at once (the frontend's pool is 4 GiB; unread "parse" images hold theirs).
PUBLISHED = 3000 * MiB


def published(front: PublisherProcess, size: int, count: int) -> list[dict[str, Any]]:
    """`count` descriptors of one random image of `size` bytes, published
    in batches."""
    image = ppm_of_size(size)
    descs: list[dict[str, Any]] = []
    while len(descs) < count:
        answer = front.publish_many(image, min(64, count - len(descs)))
        if "descs" not in answer:
            raise RuntimeError(f"the frontend did not publish {count} images of {size} bytes: {answer}")
        descs += answer["descs"]
    return descs


def med_us(values: list[float]) -> float:
    return statistics.median(values) * 1e6


class Copies:
    """Host-to-device copies queued from Python on one stream, each between
    two timing events, so that the device's start and end of each are
    known relative to a start event."""

    def __init__(self, stream: Any) -> None:
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.stream = ctypes.c_void_p(stream.cuda_stream)
        self.events: list[ctypes.c_void_p] = []

    def event(self) -> ctypes.c_void_p:
        ev = ctypes.c_void_p()
        assert self.cu.cuEventCreate(ctypes.byref(ev), 0) == 0
        assert self.cu.cuEventRecord(ev, self.stream) == 0
        self.events.append(ev)
        return ev

    def copy(self, to: int, frm: int, n: int) -> None:
        assert self.cu.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(to), ctypes.c_void_p(frm), n, self.stream) == 0

    def elapsed_us(self, a: ctypes.c_void_p, b: ctypes.c_void_p) -> float:
        ms = ctypes.c_float()
        assert self.cu.cuEventSynchronize(b) == 0
        assert self.cu.cuEventElapsedTime(ctypes.byref(ms), a, b) == 0
        return ms.value * 1e3

    def reset(self) -> None:
        for ev in self.events:
            self.cu.cuEventDestroy_v2(ev)
        self.events.clear()


async def by_size(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    import torch

    settings = dataclasses.replace(ReaderSettings.from_env(), pool_bytes=512 * MiB)
    front = PublisherProcess(pool_bytes=4096 * MiB, lease=120, region_bytes=256 * MiB)
    rows = []
    try:
        async with pixelwire.Reader(settings) as reader:
            native = reader._opened()
            # The reader's own staging buffer and stream, made by a first CUDA read.
            (first,) = published(front, max(sizes), 1)
            await reader.read_decoded(first, output="torch", device="cuda")
            torch.cuda.synchronize()
            staging, _ = reader._cuda_staging[0]
            stream = reader._cuda_streams[0]
            copies = Copies(stream)
            chunk = settings.cuda_chunk_bytes
            for size in sizes:
                dev = torch.empty(size, dtype=torch.uint8, device="cuda")
                kinds = [
                    "parse",
                    "torch_calls",
                    "cpu",
                    "cuda",
                    "host_native",
                    "host_started",
                    "host_started_spin",
                    "cuda_started",
                    "staged",
                    "staged_copied",
                ]
                rounds = min(repeats + 3, max(5, PUBLISHED // size // len(kinds)))
                descs = iter(published(front, size, rounds * len(kinds)))
                times: dict[str, list[float]] = {k: [] for k in kinds}
                steps: dict[str, list[float]] = {}
                for round_ in range(rounds):
                    for kind in kinds:
                        desc = next(descs)
                        marks: list[tuple[str, float]] = []
                        t = time.perf_counter()
                        x: Any = None
                        if kind == "parse":
                            x = parse_descriptor(desc)
                        elif kind == "torch_calls":
                            image = parse_descriptor(desc)
                            t = time.perf_counter()
                            h, w, _ = image.shape
                            cuda0 = torch.device("cuda", 0)
                            x = torch.empty((h, w, image.pixel_bytes), dtype=torch.uint8, device=cuda0)
                            x = (x, torch.cuda.current_stream(0).cuda_stream)
                        elif kind == "cpu":
                            x = await reader.read_decoded(desc, output="numpy")
                        elif kind == "cuda":
                            x = await reader.read_decoded(desc, output="torch", device="cuda")
                            torch.cuda.current_stream(x.device).synchronize()
                        elif kind == "host_native":
                            x = native.read(parse_descriptor(desc))
                        elif kind == "host_started":
                            x = native.start_read(parse_descriptor(desc)).wait()
                        elif kind == "host_started_spin":
                            x = native.start_read(parse_descriptor(desc)).wait(1.0)
                        elif kind == "cuda_started":
                            ticket = native.start_read_to_cuda(
                                parse_descriptor(desc),
                                staging_addr=staging.data_ptr(),
                                device=0,
                                stream=stream.cuda_stream,
                                chunk_bytes=chunk,
                            )
                            ticket.copy_into(dev.data_ptr())
                            x = ticket.wait()
                            stream.synchronize()
                        elif kind == "staged":
                            image = parse_descriptor(desc)
                            t = time.perf_counter()
                            native.read_into(
                                image,
                                local_addr=staging.data_ptr(),
                                mem_type="Dram",
                                device=0,
                                chunk_bytes=chunk,
                                on_chunk=lambda at, n, marks=marks: marks.append(
                                    ("landed", time.perf_counter())
                                ),
                            )
                        else:
                            image = parse_descriptor(desc)
                            t = time.perf_counter()
                            start = copies.event()
                            ends: list[ctypes.c_void_p] = []

                            def on_chunk(
                                at: int,
                                n: int,
                                marks: list[tuple[str, float]] = marks,
                                ends: list[ctypes.c_void_p] = ends,
                                dev: Any = dev,
                            ) -> None:
                                marks.append(("landed", time.perf_counter()))
                                copies.copy(dev.data_ptr() + at, staging.data_ptr() + at, n)
                                ends.append(copies.event())
                                marks.append(("copy_queued", time.perf_counter()))

                            native.read_into(
                                image,
                                local_addr=staging.data_ptr(),
                                mem_type="Dram",
                                device=0,
                                chunk_bytes=chunk,
                                on_chunk=on_chunk,
                            )
                            marks.append(("returned", time.perf_counter()))
                            stream.synchronize()
                            marks.append(("synchronised", time.perf_counter()))
                            device_end = copies.elapsed_us(start, ends[-1])
                            steps.setdefault("device_copies_end", []).append(device_end / 1e6)
                            copies.reset()
                        elapsed = time.perf_counter() - t
                        del x
                        if round_ >= 3:
                            times[kind].append(elapsed)
                            counts: dict[str, int] = {}
                            for name, at in marks:
                                counts[name] = counts.get(name, 0) + 1
                                steps.setdefault(f"{kind}.{name}{counts[name]}", []).append(at - t)
                row = {
                    "size": size,
                    **{f"{k}_us": med_us(v) for k, v in times.items()},
                    "steps_us": {k: round(med_us(v), 1) for k, v in steps.items()},
                }
                row["cuda_vs_cpu"] = row["cpu_us"] / row["cuda_us"]
                row["await_us"] = row["cpu_us"] - row["host_started_spin_us"]
                row["device_us"] = row["cuda_started_us"] - row["host_started_us"]
                row["cuda_python_us"] = row["cuda_us"] - row["cuda_started_us"]
                shown = {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}
                print(json.dumps(shown), flush=True)
                rows.append(row)
    finally:
        front.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="0.0625,0.25,1,4,24", help="image sizes in MiB")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sizes = [round(float(s) * MiB) for s in args.sizes.split(",")]
    rows = asyncio.run(by_size(sizes, args.repeats))
    if args.json:
        settings = dataclasses.asdict(ReaderSettings.from_env())
        args.json.write_text(json.dumps({"settings": settings, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
