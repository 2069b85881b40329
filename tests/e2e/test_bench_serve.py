"""`pixelwire bench serve --quick` with a tiny load, as a user
runs it: the console command in vLLM's environment, on the tiny model; and
a run stopped with SIGTERM, which must leave nothing running behind.

The report must hold a cell for every path, workload and concurrency, with
every metric, and for the multi-turn workload (2 turns, on the same
servers with every cache off: no second set of vLLM servers) a cell for
every path, number of conversations and turn; report.md must exist and the
charts must be valid PNGs. Nothing here asserts on timings.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import stack

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

PATHS = ["loader", "frontend", "frontend-resize", "frontend-processed", "worker"]
WORKLOADS = ["jpeg-4k-http", "mixed", "video-data"]
CONCURRENCY = [1, 2]
TURNS = [1, 2]
CHARTS = ["latency.png", "cpu.png", "bytes.png", "summary.png", "turns.png"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_quick_run_writes_every_path_metric_and_chart(tmp_path: Path, video_clips: dict[str, bytes]) -> None:
    from PIL import Image

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.fail("matplotlib is missing from vLLM's environment (make test-vllm installs it)")
    results = tmp_path / "results"
    video = tmp_path / "clip.mp4"
    video.write_bytes(video_clips["h264_high_bframes.mp4"])
    argv = [
        sys.executable, "-m", "pixelwire.cli", "bench", "serve", "--quick",
        "--model", str(stack.model_dir()), "--photo", str(stack.CORPUS / "exif_gps_typeerror.jpg"),
        "--results", str(results), "--workloads", *WORKLOADS, "multi-turn", "--video", str(video),
        "--concurrency", *map(str, CONCURRENCY), "--duration", "1", "--max-requests", "3", "--warm-up", "1",
        "--turns", str(TURNS[-1]), "--conversations", *map(str, CONCURRENCY), "--multi-turn-caches", "off",
        "--vllm-args", "--dtype float32 --max-model-len 1024 --enforce-eager --seed 0",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"

    report = json.loads((results / "report.json").read_text())
    assert set(report["paths"]) == set(PATHS)
    assert report["environment"]["network"] in ("netns", "loopback")
    assert report["environment"]["placement"]
    cells = {(c["path"], c["workload"], c["concurrency"]): c for c in report["cells"]}
    assert set(cells) == {(p, w, c) for p in PATHS for w in WORKLOADS for c in CONCURRENCY}
    for (path, workload, concurrency), cell in cells.items():
        where = f"{path} {workload} c={concurrency}"
        assert cell["requests"] >= 1, where
        assert cell["errors"] == 0, (where, cell["error_samples"])
        for key in ("latency_ms", "ttft_ms"):
            assert all(cell[key][q] is not None and cell[key][q] > 0 for q in ("p50", "p90", "p99")), where
        assert cell["images_per_s"] > 0, where
        cpu = cell["cpu_ms_per_image"]
        assert cpu["api_server"] is not None and cpu["vllm_all"] is not None, where
        assert cpu["vllm_all"] >= cpu["api_server"], where
        assert cell["encoded_bytes_per_image"] > 0, where
        if path == "loader":
            assert cpu["frontend"] is None and cell["nixl_bytes_per_image"] is None, where
        else:
            assert cpu["frontend"] is not None, where
            assert cell["nixl_bytes_per_image"] is not None, where
    # What crosses NIXL (not a timing): full-resolution pixels, the resized
    # ones (far fewer), an image's processed rows (the resized pixels,
    # rearranged), none in worker mode.
    for workload in WORKLOADS:
        full = cells[("frontend", workload, 1)]["nixl_bytes_per_image"]
        resized = cells[("frontend-resize", workload, 1)]["nixl_bytes_per_image"]
        assert 0 < resized < full, (workload, resized, full)
        assert cells[("worker", workload, 1)]["nixl_bytes_per_image"] == 0
    processed = cells[("frontend-processed", "jpeg-4k-http", 1)]["nixl_bytes_per_image"]
    assert processed == cells[("frontend-resize", "jpeg-4k-http", 1)]["nixl_bytes_per_image"]

    _check_multi_turn(report)

    markdown = (results / "report.md").read_text()
    assert all(label in markdown for label in report["paths"].values())
    assert f"## Multi-turn: {TURNS[-1]} turns" in markdown
    for name in CHARTS:
        data = (results / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE), name
        with Image.open(results / name) as image:
            image.verify()


def _check_multi_turn(report: dict[str, Any]) -> None:
    """A cell per path, conversations and turn, every figure there; the
    pixels are counts, not timings: turn k's request refers to k images,
    and with every cache off each of them is READ again."""
    cells = {(c["path"], c["concurrency"], c["turn"]): c for c in report["multi_turn"]["cells"]}
    assert set(cells) == {(p, c, t) for p in PATHS for c in CONCURRENCY for t in TURNS}
    for (path, conversations, turn), cell in cells.items():
        where = f"multi-turn {path} c={conversations} turn {turn}"
        assert cell["requests"] == conversations and cell["errors"] == 0, (where, cell["error_samples"])
        assert cell["images_per_request"] == turn, where
        for key in ("latency_ms", "ttft_ms"):
            assert cell[key]["p50"] is not None and cell[key]["p50"] > 0, where
        cpu = cell["cpu_ms_per_request"]
        assert cpu["api_server"] is not None and cpu["vllm_all"] >= cpu["api_server"], where
        if path == "loader":
            assert cpu["frontend"] is None and cell["nixl_pixel_bytes_per_request"] is None, where
        else:
            assert cpu["frontend"] is not None, where
            expected_reads = 0 if path == "worker" else turn
            assert cell["nixl_reads_per_request"] == expected_reads, where
    for path in ("frontend", "frontend-resize", "frontend-processed"):
        one, two = (cells[(path, 1, t)]["nixl_pixel_bytes_per_request"] for t in TURNS)
        assert one > 0 and two == 2 * one, (path, one, two)
        assert cells[(path, 1, 2)]["nixl_read_bytes_per_request"] == two, path
    resized = cells[("frontend-resize", 1, 1)]["nixl_pixel_bytes_per_request"]
    assert 0 < resized < cells[("frontend", 1, 1)]["nixl_pixel_bytes_per_request"]
    assert cells[("worker", 1, 2)]["nixl_pixel_bytes_per_request"] == 0
    ratios = {(r["path"], r["concurrency"]) for r in report["multi_turn"]["ratios"]}
    assert ratios == {(p, c) for p in PATHS for c in CONCURRENCY}


def _alive(pid: int) -> bool:
    """Whether a process still runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _namespaces() -> str:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return listed.stdout


def test_sigterm_stops_every_server_and_removes_the_network(tmp_path: Path) -> None:
    """A run stopped with SIGTERM (a timeout, a supervisor) goes through
    the same cleanup as Ctrl-C: the vLLM server it was starting is gone
    and so is its network namespace, where SIGTERM's default action left
    both behind."""
    from pixelwire.bench.services import descendants

    log = tmp_path / "stderr.log"
    argv = [
        sys.executable, "-m", "pixelwire.cli", "bench", "serve", "--quick", "--paths", "loader",
        "--model", str(stack.model_dir()), "--photo", str(stack.CORPUS / "exif_gps_typeerror.jpg"),
        "--results", str(tmp_path / "results"), "--workloads", "jpeg-4k-http",
        "--vllm-args", "--dtype float32 --max-model-len 1024 --enforce-eager --seed 0",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    with open(log, "wb") as err:
        run = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 120
        servers: list[int] = []
        while time.monotonic() < deadline and run.poll() is None:
            if "servers ..." in log.read_text(errors="replace"):
                servers = descendants(run.pid)
                if servers:
                    break
            time.sleep(0.2)
        assert servers, f"no server started:\n{log.read_text(errors='replace')[-3000:]}"
        time.sleep(2)  # into vLLM's start
        servers = descendants(run.pid)
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=90) == 128 + signal.SIGTERM
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    left = [pid for pid in servers if _alive(pid)]
    namespace = f"pwbench-{run.pid}"
    stranded = namespace in _namespaces()
    # Whatever a failing run left is cleared here, not by the next test.
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if stranded:
        subprocess.run(["ip", "netns", "del", namespace], check=False)
    assert not left, f"still running after the run ended: {left}"
    assert not stranded, f"{namespace} is still there"
