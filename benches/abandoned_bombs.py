"""A victim client's latency while other clients send pixel bombs and hang up.

One ``pixelwire frontend`` (with a model's resize, so that bombs pass the
per-request pixel and pool budgets and are decoded) in front of an upstream
that answers at once. The victim sends one small PNG per request, first
alone (unloaded), then while ``--attackers`` clients each send requests of
``--bombs`` lossless WebPs that decode to 16383 x 3051 (50 MP from 38 bytes)
and hang up after ``--hang-up`` seconds, again and again. Printed: the
victim's p50 and p99 in both phases and their ratio (loaded over unloaded),
the outcome of a request of 32 bombs, the attack requests' outcomes, the
pool after the attack and the frontend's peak RSS.

Usage::

    python benches/abandoned_bombs.py [--victims 200] [--attackers 7] [--bombs 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from PIL import Image

from pixelwire.bench.services import free_port

QWEN2_VL = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 1003520}


def _data_url(image: Image.Image, kind: str, **save: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, kind, **save)
    return f"data:image/{kind.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


def _body(*urls: str) -> bytes:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": parts}]}).encode()


def _upstream(port: int) -> None:
    """Answers every request at once (vLLM's work is not what is measured)."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", answer)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, handle_signals=False)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    loop.run_forever()


def _post(port: int, body: bytes, timeout: float = 120) -> tuple[str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    started = time.perf_counter()
    try:
        connection.request(
            "POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        response.read()
        return str(response.status), time.perf_counter() - started
    except TimeoutError:
        return "hung up", time.perf_counter() - started
    finally:
        connection.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--victims", type=int, default=300, help="victim requests per phase")
    parser.add_argument("--interval", type=float, default=0.03, help="seconds between two victim requests")
    parser.add_argument("--victim-timeout", type=float, default=30.0, help="seconds a victim waits")
    parser.add_argument("--attackers", type=int, default=7)
    parser.add_argument("--bombs", type=int, default=8, help="bombs per attack request")
    parser.add_argument("--hang-up", type=float, default=3.0, help="seconds before an attacker hangs up")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args()

    upstream_port, port = free_port("127.0.0.1"), free_port("127.0.0.1")
    threading.Thread(target=_upstream, args=(upstream_port,), daemon=True).start()
    model = Path(tempfile.mkdtemp(prefix="pixelwire-bench-model-"))
    (model / "preprocessor_config.json").write_text(json.dumps(QWEN2_VL))
    upstream = f"http://127.0.0.1:{upstream_port}"
    argv = [sys.executable, "-m", "pixelwire.cli", "frontend", "--upstream", upstream, "--host", "127.0.0.1",
            "--port", str(port), "--no-check-upstream", "--model", str(model),
            "--cache-bytes", "0"]  # fmt: skip
    frontend = subprocess.Popen(
        argv,
        env={**os.environ, "PIXELWIRE_SECRET": "bench"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        bomb = _data_url(
            Image.new("RGB", (16383, 3051), (9, 9, 9)), "WEBP", lossless=True, quality=0, method=0
        )
        victim = _body(_data_url(Image.new("RGB", (640, 480), (1, 2, 3)), "PNG"))
        deadline = time.monotonic() + 60
        while True:
            try:
                _post(port, victim)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

        def victims() -> list[float]:
            latencies = []
            for _ in range(args.victims):
                outcome, seconds = _post(port, victim, timeout=args.victim_timeout)
                latencies.append(seconds)
                timed_out[0] += outcome == "hung up"
                time.sleep(args.interval)
            return latencies

        timed_out = [0]

        calm = victims()
        status, seconds = _post(port, _body(*[bomb] * 32))
        outcomes: list[str] = []
        stop = threading.Event()

        def attack() -> None:
            body = _body(*[bomb] * args.bombs)
            while not stop.is_set():
                outcomes.append(_post(port, body, timeout=args.hang_up)[0])

        attackers = [threading.Thread(target=attack) for _ in range(args.attackers)]
        for thread in attackers:
            thread.start()
        time.sleep(1)
        hot = victims()
        stop.set()
        for thread in attackers:
            thread.join()
        time.sleep(2)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            metrics = b""
            while chunk := sock.recv(65536):
                metrics += chunk
        in_use = next(
            float(line.split()[-1])
            for line in metrics.decode().splitlines()
            if line.startswith("pixelwire_frontend_pool_bytes_in_use")
        )
        status_file = Path(f"/proc/{frontend.pid}/status").read_text()
        peak_rss = int(status_file.split("VmHWM:")[1].split()[0]) / 1024
    finally:
        frontend.terminate()
        try:
            frontend.wait(10)
        except subprocess.TimeoutExpired:
            # A frontend still decoding abandoned bombs may not stop in time.
            frontend.kill()
            frontend.wait(10)
    result = {
        "victim_unloaded_ms": {"p50": _percentile(calm, 0.5) * 1e3, "p99": _percentile(calm, 0.99) * 1e3},
        "victim_attacked_ms": {"p50": _percentile(hot, 0.5) * 1e3, "p99": _percentile(hot, 0.99) * 1e3},
        "p99_ratio": _percentile(hot, 0.99) / _percentile(calm, 0.99),
        "victims_timed_out": timed_out[0],
        "thirty_two_bombs": {"status": status, "ms": seconds * 1e3},
        "attack_requests": {outcome: outcomes.count(outcome) for outcome in sorted(set(outcomes))},
        "pool_bytes_in_use_after": in_use,
        "frontend_peak_rss_mib": peak_rss,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
