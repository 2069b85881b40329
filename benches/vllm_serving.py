"""Chat completions with one image through real vLLM servers: vLLM's own
loader vs the pixelwire frontend (decoded once, read over NIXL) vs the
frontend in worker mode (the plug-in decodes natively in vLLM).

Runs in the vLLM virtualenv (``make bench-vllm``). Per input it reports the
request latency (p50; p90 in the JSON; ``max_tokens=1``) and the CPU
milliseconds per request of vLLM's API server process (where images are
loaded and preprocessed), of all vLLM processes (the engine core's share
grows with wall time: it polls), and of the frontend — the work pixelwire
moves off the GPU worker's host. vLLM's
multimodal processor cache and prefix caching are off, so every request
loads and processes its image.
"""

from __future__ import annotations

import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
import stack
from bench_common import bench_parser, encoded_photos, environment

SIZES = [(1024, 768), (1920, 1080), (3840, 2160)]
FORMATS: list[tuple[str, dict[str, Any]]] = [("JPEG", {"quality": 90}), ("PNG", {"compress_level": 6})]
NO_CACHES = ("--mm-processor-cache-gb", "0", "--no-enable-prefix-caching")


def _cpu_seconds(pid: int, *, descendants: bool = True) -> float:
    """User + system CPU of a process (and its descendants)."""
    root = psutil.Process(pid)
    total = 0.0
    for p in [root, *(root.children(recursive=True) if descendants else [])]:
        try:
            times = p.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def _request(client: Any, url: str) -> None:
    client.chat.completions.create(
        model="tiny",
        temperature=0,
        max_tokens=1,
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
    )


def _measure(
    client: Any, url: str, reps: int, vllm: stack.Service, frontend: stack.Service | None
) -> dict[str, float]:
    for _ in range(2):
        _request(client, url)

    def front_cpu() -> float:
        return _cpu_seconds(frontend.process.pid) if frontend else 0.0

    def api_cpu() -> float:
        return _cpu_seconds(vllm.process.pid, descendants=False)

    vllm_before, api_before, front_before = _cpu_seconds(vllm.process.pid), api_cpu(), front_cpu()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        _request(client, url)
        times.append(time.perf_counter() - start)
    times.sort()
    return {
        "p50_ms": statistics.median(times) * 1e3,
        "p90_ms": times[min(len(times) - 1, int(0.9 * len(times)))] * 1e3,
        "vllm_cpu_ms": (_cpu_seconds(vllm.process.pid) - vllm_before) / reps * 1e3,
        "api_server_cpu_ms": (api_cpu() - api_before) / reps * 1e3,
        "frontend_cpu_ms": (front_cpu() - front_before) / reps * 1e3,
    }


def main() -> None:
    import openai

    args = bench_parser(__doc__).parse_args()
    reps = 4 if args.quick else 12
    work = Path(tempfile.mkdtemp(prefix="pixelwire-bench-vllm-"))
    images = work / "images"
    images.mkdir()
    inputs = []
    for fmt, width, height, data in encoded_photos(args.source, SIZES, FORMATS):
        name = f"photo_{width}x{height}.{fmt.lower()}"
        (images / name).write_bytes(data)
        mime = "image/jpeg" if fmt == "JPEG" else "image/png"
        inputs.append((fmt, width, height, name, f"data:{mime};base64,{base64.b64encode(data).decode()}"))
    services: list[stack.Service] = []
    results: list[dict[str, Any]] = []
    with stack.image_server(images) as image_base:
        try:
            reference = stack.start_vllm("vllm-reference", work, connector="http", extra_args=NO_CACHES)
            services.append(reference)
            plugged = stack.start_vllm(
                "vllm-pixelwire", work, connector="pixelwire", extra_args=NO_CACHES,
                extra_env={"PIXELWIRE_ALLOW_PRIVATE": "1"},
            )  # fmt: skip
            services.append(plugged)
            guard = ("--allowed-domains", "127.0.0.1", "--allow-private")
            frontend = stack.start_frontend("frontend", work, plugged.url, *guard)
            services.append(frontend)
            worker_mode = stack.start_frontend(
                "frontend-worker", work, plugged.url, *guard, "--decode-at", "worker"
            )
            services.append(worker_mode)
            for service in services:
                service.wait_ready("/health", timeout=600)
            paths = [
                ("vLLM's loader", reference, None),
                ("pixelwire frontend + NIXL", plugged, frontend),
                ("pixelwire worker mode", plugged, worker_mode),
            ]
            for fmt, width, height, name, data_url in inputs:
                for source, url in (("data:", data_url), ("http", f"{image_base}/{name}")):
                    row: dict[str, Any] = {"format": fmt, "size": f"{width}x{height}", "source": source}
                    for label, vllm, front in paths:
                        client = openai.OpenAI(
                            base_url=f"{(front or vllm).url}/v1", api_key="unused", max_retries=0, timeout=120
                        )
                        with client:
                            row[label] = _measure(client, url, reps, vllm, front)
                    results.append(row)
                    _print_row(row, [p[0] for p in paths])
        finally:
            for service in reversed(services):
                service.stop()
    if args.json:
        report = {"environment": environment(args.source), "results": results}
        args.json.write_text(json.dumps(report, indent=2))


def _print_row(row: dict[str, Any], labels: list[str]) -> None:
    if not hasattr(_print_row, "header"):
        _print_row.header = True  # type: ignore[attr-defined]
        print(f"{'input':>22} | " + " | ".join(f"{label:^32}" for label in labels))
        columns = f"{'p50 ms':>8} {'API cpu':>8} {'all cpu':>8} {'front':>6}"
        print(f"{'':>22} | " + " | ".join(columns for _ in labels))
    cells = []
    for label in labels:
        r = row[label]
        cpu = f"{r['api_server_cpu_ms']:8.1f} {r['vllm_cpu_ms']:8.1f} {r['frontend_cpu_ms']:6.1f}"
        cells.append(f"{r['p50_ms']:8.1f} {cpu}")
    print(f"{row['format'] + ' ' + row['size'] + ' ' + row['source']:>22} | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
