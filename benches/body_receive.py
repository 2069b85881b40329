"""The event loop's CPU to take in a request body of megabytes, with glibc's
malloc defaults and with the frontend's thresholds.

An aiohttp server (the frontend's web stack) in a process of its own reads
each POSTed body as the frontend does (its chunks joined once) and answers;
it reports its main thread's CPU time. Two servers in the same run, one with
``pixelwire.frontend.allocator.keep_heap_memory()`` called at start, the
other with glibc's defaults, take the same bodies (``--mib`` MiB of base64,
as a resent conversation's ``data:`` URLs are), alternating, ``--rounds``
times each. Printed: the main thread's CPU ms per body for each, and their
ratio.

Usage::

    python benches/body_receive.py [--mib 4] [--bodies 40] [--rounds 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

_SERVER = """
import sys, time
kept = sys.argv[1] == "kept"
if kept:
    from pixelwire.frontend.allocator import keep_heap_memory
    assert keep_heap_memory(), "glibc refused the thresholds"
from aiohttp import web

async def body(request):
    chunks = [chunk async for chunk in request.content.iter_any()]
    raw = b"".join(chunks)
    return web.Response(text=str(len(raw)))

async def cpu(request):
    return web.Response(text=str(time.thread_time()))

app = web.Application(client_max_size=1 << 30)
app.router.add_post("/", body)
app.router.add_get("/cpu", cpu)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=None)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _measure(variant: str, body: bytes, bodies: int) -> float:
    """CPU ms of the server's main thread per body, after a warm-up."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    server = subprocess.Popen([sys.executable, "-c", _SERVER, variant, str(port)], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/cpu", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        def post() -> None:
            with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as answer:
                assert int(answer.read()) == len(body)

        def cpu() -> float:
            return float(urllib.request.urlopen(f"{url}/cpu", timeout=5).read())

        for _ in range(5):
            post()
        before = cpu()
        for _ in range(bodies):
            post()
        return (cpu() - before) / bodies * 1000
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=float, default=4.0, help="MiB of base64 a body")
    parser.add_argument("--bodies", type=int, default=40, help="bodies a measurement")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each variant, alternating")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    size = int(args.mib * (1 << 20))
    body = base64.b64encode(os.urandom(size * 3 // 4 + 3))[:size]
    results: dict[str, list[float]] = {"glibc defaults": [], "frontend thresholds": []}
    for _ in range(args.rounds):
        results["glibc defaults"].append(_measure("default", body, args.bodies))
        results["frontend thresholds"].append(_measure("kept", body, args.bodies))
    medians = {name: statistics.median(values) for name, values in results.items()}
    for name, values in results.items():
        print(f"{name:20} {', '.join(f'{v:.2f}' for v in values)} ms a body (median {medians[name]:.2f})")
    ratio = medians["glibc defaults"] / medians["frontend thresholds"]
    print(f"defaults / thresholds: {ratio:.2f}x")
    if args.json:
        report = {"mib": args.mib, "bodies": args.bodies, "ms_per_body": results, "ratio": ratio}
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
