"""Sweep of the worker's READ settings (issue #13): `pixelwire bench transfer`
once per variant, each in a fresh process (UCX reads its environment at
start), plus a breakdown of one READ's time. Writes one JSON file.

    python benches/transfer_sweep.py --out sweep.json [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

# name -> environment; every variant sets every knob, so the defaults in
# config.py never decide a row silently.
BASE = {
    "PIXELWIRE_READER_PROGRESS_THREAD": "1",
    "PIXELWIRE_READ_THREADS": "4",
    "PIXELWIRE_READ_SPLIT_MIN_BYTES": str(1 << 20),
    "PIXELWIRE_READ_CHUNK_BYTES": str(4 << 20),
    "PIXELWIRE_HASH_THREADS": "16",
    "PIXELWIRE_READ_INLINE_BYTES": str(256 << 10),
    "PIXELWIRE_READ_INLINE_WAIT": "0.0003",
    "PIXELWIRE_CUDA_STAGING": "pinned",
    "PIXELWIRE_CUDA_CHUNK_BYTES": str(8 << 20),
    "PIXELWIRE_VERIFY": "1",
}
VARIANTS: dict[str, dict[str, str]] = {
    "defaults": {},
    "no hash": {"PIXELWIRE_VERIFY": "0"},
    "hash after the READ (one chunk)": {"PIXELWIRE_READ_CHUNK_BYTES": str(1 << 40)},
    "READ chunk 1 MiB": {"PIXELWIRE_READ_CHUNK_BYTES": str(1 << 20)},
    "READ chunk 2 MiB": {"PIXELWIRE_READ_CHUNK_BYTES": str(2 << 20)},
    "READ chunk 8 MiB": {"PIXELWIRE_READ_CHUNK_BYTES": str(8 << 20)},
    "hash threads 2": {"PIXELWIRE_HASH_THREADS": "2"},
    "hash threads 4": {"PIXELWIRE_HASH_THREADS": "4"},
    "hash threads 8": {"PIXELWIRE_HASH_THREADS": "8"},
    "READ threads 8": {"PIXELWIRE_READ_THREADS": "8"},
    "every read off the loop": {"PIXELWIRE_READ_INLINE_BYTES": "0"},
    "CUDA chunk 1 MiB": {"PIXELWIRE_CUDA_CHUNK_BYTES": str(1 << 20)},
    "CUDA chunk 2 MiB": {"PIXELWIRE_CUDA_CHUNK_BYTES": str(2 << 20)},
    "CUDA chunk 4 MiB": {"PIXELWIRE_CUDA_CHUNK_BYTES": str(4 << 20)},
    "direct CUDA": {"PIXELWIRE_CUDA_STAGING": "direct"},
}


# Chunk sizes of the CUDA reads the breakdown compares in the same process.
CUDA_CHUNKS_MIB = (2, 4, 8, 16)


def bench(env: dict[str, str], repeats: int, sizes: str, naive: bool) -> list[dict[str, Any]]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [sys.executable, "-m", "pixelwire.cli", "bench", "transfer"]
        cmd += ["--repeats", str(repeats), "--json", out.name, "--sizes", sizes]
        if not naive:
            cmd.append("--no-naive")
        subprocess.run(cmd, env={**os.environ, **env}, check=True, timeout=400)
        rows: list[dict[str, Any]] = json.load(open(out.name))
        return rows


async def breakdown(sizes: list[int], n: int) -> list[dict[str, Any]]:
    """Where one READ's time goes (reader defaults, progress thread on): the
    native call on this thread, the same through asyncio.to_thread, the whole
    read_decoded, hash on and off; with CUDA, the READ into registered
    pinned memory alone (``read_into``, no copy; hashed when verifying), the
    same with each chunk copied on to the device (``start_read_to_cuda``
    waited for in place) for several chunk sizes and the whole CUDA
    read_decoded; every CUDA kind is timed until its copies have ended."""
    import pixelwire
    from pixelwire import config
    from pixelwire._native import NativeReader, ReadSignal
    from pixelwire.bench.transfer import cuda_devices, ppm_of_size
    from pixelwire.descriptor import parse_descriptor
    from pixelwire.publisher_process import PublisherProcess

    def med(x: list[float]) -> float:
        return statistics.median(x) * 1e6

    cuda = bool(cuda_devices())
    out = []
    front = PublisherProcess(pool_bytes=8192 << 20, lease=120, region_bytes=256 << 20)
    try:
        for verify in (True, False):
            settings = config.ReaderSettings.from_env()
            async with pixelwire.Reader(settings, verify=verify, pool_bytes=512 << 20) as r:
                # The native reader alone, with the same settings.
                native = NativeReader(r.settings)
                pinned: Any = None
                if cuda:
                    import torch

                    pinned = torch.empty(max(sizes), dtype=torch.uint8, pin_memory=True)
                    native.register(addr=pinned.data_ptr(), size=pinned.numel(), mem_type="Dram", device=0)
                for size in sizes:
                    # kind -> chunk bytes of a native CUDA read
                    to_cuda = {f"pinned_read_to_cuda_{mib}MiB_chunks": mib << 20 for mib in CUDA_CHUNKS_MIB}
                    kinds = ["direct", "threaded", "whole"] + (
                        ["pinned_read_into", *to_cuda, "cuda_alloc", "native_cuda_on_loop", "cuda_whole"]
                        if cuda
                        else []
                    )
                    if cuda:
                        device_out = torch.empty(size, dtype=torch.uint8, device="cuda")
                        stream = torch.cuda.Stream()
                    descs = front.publish_many(ppm_of_size(size), (n + 3) * len(kinds))["descs"]
                    times: dict[str, list[float]] = {k: [] for k in kinds}
                    # Interleaved, one of each kind in turn; the first 3 rounds warm up.
                    for i, d in enumerate(descs):
                        kind = kinds[i % len(kinds)]
                        im = parse_descriptor(d, None)
                        t = time.perf_counter()
                        if kind == "direct":
                            x = native.read(im)
                        elif kind == "threaded":
                            x = await asyncio.to_thread(functools.partial(native.read, im))
                        elif kind == "whole":
                            x = await r.read_decoded(d, output="numpy")
                        elif kind == "pinned_read_into":
                            x = native.read_into(im, local_addr=pinned.data_ptr(), mem_type="Dram", device=0)
                        elif kind in to_cuda:
                            chunk = to_cuda[kind]
                            out_addr = device_out.data_ptr()
                            x = _start_to_cuda(native, pinned, stream, im, out_addr, chunk).wait()
                            stream.synchronize()  # until the copies have ended
                        elif kind == "cuda_alloc":
                            x = torch.empty(size, dtype=torch.uint8, device="cuda")
                        elif kind == "native_cuda_on_loop":
                            # What `read_decoded` does for CUDA, with public
                            # calls: a fresh device tensor, the native read,
                            # the event loop woken by the read's eventfd.
                            x = torch.empty(size, dtype=torch.uint8, device="cuda")
                            signal = ReadSignal()
                            chunk = r.settings.cuda_chunk_bytes
                            ticket = _start_to_cuda(native, pinned, stream, im, x.data_ptr(), chunk, signal)
                            await _readable(signal.fileno())
                            ticket.wait()
                            stream.synchronize()
                        else:
                            x = await r.read_decoded(d, output="torch", device="cuda")
                            torch.cuda.current_stream().synchronize()
                        elapsed = time.perf_counter() - t
                        del x
                        if i >= 3 * len(kinds):
                            times[kind].append(elapsed)
                    row = {"size": size, "verify": verify, **{f"{k}_us": med(v) for k, v in times.items()}}
                    print(row, flush=True)
                    out.append(row)
    finally:
        front.close()
    return out


def _start_to_cuda(
    native: Any, staging: Any, stream: Any, im: Any, device_addr: int, chunk: int, signal: Any = None
) -> Any:
    """A native CUDA read through the bench's registered pinned `staging`,
    copied on to `device_addr`."""
    import torch

    ticket = native.start_read_to_cuda(
        im,
        staging_addr=staging.data_ptr(),
        device=torch.cuda.current_device(),
        stream=stream.cuda_stream,
        chunk_bytes=chunk,
        signal=signal,
    )
    ticket.copy_into(device_addr)
    return ticket


async def _readable(fd: int) -> None:
    """Returns once the event loop sees `fd` readable."""
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
    try:
        await ready
    finally:
        loop.remove_reader(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--sizes", default="0.0625,0.25,1,4,16,24")
    parser.add_argument("--only", help="variant names, |-separated")
    parser.add_argument("--breakdown-only", action="store_true", help="no variants, the breakdown alone")
    parser.add_argument(
        "--breakdown-sizes", default="0.0625,4,16,24", help="the breakdown's image sizes in MiB"
    )
    args = parser.parse_args()
    result: dict[str, Any] = {
        "host": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
        "variants": {},
    }

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    chosen = args.only.split("|") if args.only else list(VARIANTS)
    if args.breakdown_only:
        chosen = []
    for name in chosen:
        env = {**BASE, **VARIANTS[name]}
        print(f"== {name}: {env}", flush=True)
        start = time.perf_counter()
        try:
            rows = bench(env, args.repeats, args.sizes, naive=name.startswith(("before", "defaults")))
            result["variants"][name] = {"env": env, "rows": rows, "seconds": time.perf_counter() - start}
        except (subprocess.SubprocessError, OSError) as error:
            result["variants"][name] = {"env": env, "error": str(error)}
        save()
    sizes = [round(float(mib) * (1 << 20)) for mib in args.breakdown_sizes.split(",")]
    result["breakdown"] = asyncio.run(breakdown(sizes, 20))
    save()


if __name__ == "__main__":
    main()
