"""Cross-host transfer over TCP, two network namespaces joined by a veth pair
(issue #13): the frontend in one, the reader in the other, UCX on TCP only,
beside raw TCP throughput (one stream, Python sockets) on the same link.
Needs root (ip netns); cleans up after itself.

    python benches/transfer_netns.py [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

A, B = "pwbenchA", "pwbenchB"
ADDR_A, ADDR_B = "10.77.0.1", "10.77.0.2"
MiB = 1 << 20


def sh(*args: str) -> None:
    subprocess.run(args, check=True)


def setup() -> None:
    teardown()
    sh("ip", "netns", "add", A)
    sh("ip", "netns", "add", B)
    sh("ip", "link", "add", "pwvA", "netns", A, "type", "veth", "peer", "name", "pwvB", "netns", B)
    for ns, dev, addr in ((A, "pwvA", ADDR_A), (B, "pwvB", ADDR_B)):
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")


def teardown() -> None:
    for ns in (A, B):
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, check=False)


def raw_tcp(total: int = 2048 * MiB, block: int = 4 * MiB) -> float:
    """GB/s of one TCP stream from A to B (best of 3)."""
    server = (
        "import socket,sys\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('{ADDR_B}', 5201)); s.listen(1)\n"
        "print('ready', flush=True)\n"
        "for _ in range(3):\n"
        "    c,_=s.accept(); buf=bytearray(4<<20); v=memoryview(buf); n=0\n"
        "    while True:\n"
        "        k=c.recv_into(v)\n"
        "        if not k: break\n"
        "        n+=k\n"
        "    c.sendall(str(n).encode()); c.close()\n"
    )
    client = (
        "import socket,time\n"
        f"best=0\n"
        "for _ in range(3):\n"
        f"    c=socket.create_connection(('{ADDR_B}', 5201)); data=bytes({block}); t=time.perf_counter()\n"
        f"    for _ in range({total // block}): c.sendall(data)\n"
        "    c.shutdown(socket.SHUT_WR); got=int(c.recv(64)); el=time.perf_counter()-t; c.close()\n"
        "    best=max(best, got/el/1e9)\n"
        "print(best)\n"
    )
    srv = subprocess.Popen(
        ["ip", "netns", "exec", B, sys.executable, "-c", server], stdout=subprocess.PIPE, text=True
    )
    assert srv.stdout is not None and srv.stdout.readline().strip() == "ready"
    out = subprocess.run(
        ["ip", "netns", "exec", A, sys.executable, "-c", client], capture_output=True, text=True, check=True
    )
    srv.wait(timeout=60)
    return float(out.stdout.strip())


def pixelwire_side(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    """Runs in namespace B: the frontend is started in namespace A."""
    import pixelwire
    import pixelwire.publisher_process as fp
    from pixelwire.bench.transfer import ppm_of_size

    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as wrapper:
        wrapper.write(f'#!/bin/sh\nexec ip netns exec {A} {sys.executable} "$@"\n')
    os.chmod(wrapper.name, 0o755)
    real = sys.executable
    sys.executable = wrapper.name  # PublisherProcess starts `sys.executable -m ...`
    try:
        front = fp.PublisherProcess(pool_bytes=1024 * MiB, lease=120, env={"UCX_NET_DEVICES": "pwvA"})
    finally:
        sys.executable = real
        os.unlink(wrapper.name)
    rows = []
    try:

        async def run() -> None:
            async with pixelwire.Reader(pool_bytes=512 * MiB) as reader:
                for size in sizes:
                    n = repeats if size <= 4 * MiB else max(5, repeats // 3)
                    descs = front.publish_many(ppm_of_size(size), n + 2)["descs"]
                    times = []
                    for i, desc in enumerate(descs):
                        t = time.perf_counter()
                        await reader.read_decoded(desc, output="numpy")
                        if i >= 2:
                            times.append(time.perf_counter() - t)
                    p50 = statistics.median(times)
                    rows.append({"size": size, "p50_us": p50 * 1e6, "gbps": size / p50 / 1e9})
                    print(rows[-1], flush=True)

        asyncio.run(run())
    finally:
        front.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--sizes", default="0.0625,1,4,16")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [round(float(s) * MiB) for s in args.sizes.split(",")]
    if args.inside:
        print(json.dumps(pixelwire_side(sizes, args.repeats)))
        return
    setup()
    try:
        tcp = raw_tcp()
        print(f"raw TCP, one stream, {A} -> {B}: {tcp:.2f} GB/s", flush=True)
        env = {**os.environ, "UCX_TLS": "tcp", "UCX_NET_DEVICES": "pwvB", "NIXL_LOG_LEVEL": "FATAL"}
        cmd = ["ip", "netns", "exec", B, sys.executable, __file__, "--inside"]
        cmd += ["--sizes", args.sizes, "--repeats", str(args.repeats)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, timeout=600)
        rows = json.loads(out.stdout.strip().splitlines()[-1])
        for row in rows:
            row["raw_tcp_gbps"] = tcp
            row["vs_raw_tcp"] = row["gbps"] / tcp
            print(
                f"{row['size'] / MiB:8.3f} MiB  p50 {row['p50_us']:9.1f} us  {row['gbps']:6.2f} GB/s"
                f"  {row['vs_raw_tcp']:5.0%} of raw TCP",
                flush=True,
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"raw_tcp_gbps": tcp, "rows": rows}, f, indent=1)
    finally:
        teardown()


if __name__ == "__main__":
    main()
