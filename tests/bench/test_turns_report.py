"""The multi-turn part of the bench serve report
(`python/pixelwire/bench/turns_report.py`, through `report.write_all`): a
run of the multi-turn workload alone gives report.json with its cells and
ratios, and report.md with a row per path, conversations and turn. No
servers: the cells are made up."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from pixelwire.bench import report
from pixelwire.bench.conversation import turn_cell
from pixelwire.bench.load import Outcome
from pixelwire.bench.serve_settings import PATHS

ENVIRONMENT = {
    "date": "2026-12-05T09:00:00",
    "cpu": "test CPU",
    "cores": 2,
    "memory_gib": 24.0,
    "gpus": "none",
    "load_average_at_start": [1.0, 1.0, 1.0],
    "load_average_at_end": [2.0, 2.0, 2.0],
    "network_description": "loopback",
    "network": "loopback",
    "placement": "not pinned",
    "vllm": "0.32.0",
    "inputs": "generated",
    "wall_s": 60.0,
    "multi_turn_startup_s": 20.0,
}
SETTINGS = {
    "model": "tiny",
    "mm_processor_kwargs": None,
    "max_tokens": 8,
    "turns": 2,
    "rounds": 1,
    "frontend_cache_bytes": 1 << 29,
    "worker_cache_bytes": 1 << 29,
    "multi_turn_caches": True,
    "vllm_flags": ["--mm-processor-cache-gb", "0"],
    "multi_turn_vllm_flags": ["--limit-mm-per-prompt", '{"image": 2, "video": 0}'],
}


def _cells(workload: str = "multi-turn") -> list[dict[str, Any]]:
    video = workload == "multi-turn-video"
    cells = []
    for path in PATHS:
        for concurrency in (1, 4):
            for turn in (1, 2):
                has_frontend = path != "loader"
                usage = {
                    "api_server": 0.01 * turn * concurrency,
                    "vllm_all": 0.05 * turn * concurrency,
                    "frontend": 0.02 * concurrency if has_frontend else 0.0,
                    "pixel_bytes": 1000.0 * turn * concurrency if has_frontend else 0.0,
                    "nixl_reads": float(concurrency) if has_frontend else 0.0,
                }
                outcomes = [Outcome(0.1 * turn, 0.05, None)] * concurrency
                cells.append(
                    turn_cell(
                        path=path,
                        concurrency=concurrency,
                        turn=turn,
                        outcomes=outcomes,
                        usage=usage,
                        has_frontend=has_frontend,
                        workload=workload,
                        media={"video": 1} if video else {"image": turn},
                    )
                )
    return cells


def test_a_multi_turn_run_alone_writes_its_cells_ratios_and_tables(tmp_path: Path) -> None:
    """No image cells: report.json carries the turn cells and a ratio per
    path and concurrency; report.md the ratio table and a row per turn."""
    cells = _cells()
    written = report.write_all(
        tmp_path,
        environment=ENVIRONMENT,
        settings=SETTINGS,
        paths=PATHS,
        inputs=[],
        cells=[],
        turn_cells=cells,
    )
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["cells"] == []
    assert data["multi_turn"]["cells"] == cells
    ratios = {(r["path"], r["concurrency"]): r["cpu_ratio"] for r in data["multi_turn"]["ratios"]}
    assert set(ratios) == {(p, c) for p in PATHS for c in (1, 4)}
    assert ratios[("loader", 1)] == {"api_server": pytest.approx(2.0), "frontend": None}
    assert ratios[("worker", 4)]["frontend"] == pytest.approx(1.0)

    markdown = (tmp_path / "report.md").read_text()
    assert "## Multi-turn: 2 turns" in markdown
    assert "### Turn 2 over turn 1" in markdown
    assert "| vLLM's loader | 1 | 10.0 → 20.0 | 2.00x | - → - | - |" in markdown
    for label in PATHS.values():
        assert sum(line.startswith(f"| {label} | ") for line in markdown.splitlines()) == 2 + 4
    # matplotlib is in vLLM's environment, where bench serve runs; not always here.
    if importlib.util.find_spec("matplotlib") is not None:
        assert tmp_path / "turns.png" in written
        assert (tmp_path / "turns.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_both_multi_turn_workloads_get_a_section_and_a_chart_each(tmp_path: Path) -> None:
    """Screenshots and the video chats in one run: a ratio per workload,
    path and concurrency in report.json; in report.md the video's own
    section (its title, ratio rows of its cells), and turns-video.png."""
    cells = _cells() + _cells("multi-turn-video")
    written = report.write_all(
        tmp_path,
        environment=ENVIRONMENT,
        settings={**SETTINGS, "multi_turn_vllm_flags": ["--limit-mm-per-prompt", '{"image": 2, "video": 1}']},
        paths=PATHS,
        inputs=[],
        cells=[],
        turn_cells=cells,
    )
    data = json.loads((tmp_path / "report.json").read_text())
    keys = [(r["workload"], r["path"], r["concurrency"]) for r in data["multi_turn"]["ratios"]]
    assert sorted(keys) == sorted(
        (w, p, c) for w in ("multi-turn", "multi-turn-video") for p in PATHS for c in (1, 4)
    )

    markdown = (tmp_path / "report.md").read_text()
    screenshots = markdown.index("## Multi-turn: 2 turns, turn k sends k 1080p PNG screenshots")
    video = markdown.index("## Multi-turn: 2 turns about one video, resent with every turn")
    assert screenshots < video
    assert markdown.count("### Turn 2 over turn 1") == 2
    # Each section: a ratio row and 4 turn rows (2 turns, 2 concurrencies) per path.
    for label in PATHS.values():
        rows = [line for line in markdown[video:].splitlines() if line.startswith(f"| {label} | ")]
        assert len(rows) == 2 + 4
    if importlib.util.find_spec("matplotlib") is not None:
        assert {tmp_path / "turns.png", tmp_path / "turns-video.png"} <= set(written)
