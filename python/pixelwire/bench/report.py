"""report.json, report.md and the PNG charts of `pixelwire bench serve`
(the multi-turn workload's part: ``pixelwire.bench.turns_report``)."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pixelwire.bench.figures import mb_text, ms_text
from pixelwire.bench.inputs import MIXED

CPU_PARTS = ("api_server", "other_vllm", "frontend")
CPU_LABELS = {
    "api_server": "vLLM API server",
    "other_vllm": "other vLLM processes",
    "frontend": "pixelwire frontend",
}
CHARTS = ("latency.png", "cpu.png", "bytes.png", "summary.png")


class Report:
    """The cells of one run and what the tables and charts need from them."""

    def __init__(
        self,
        environment: Mapping[str, Any],
        settings: Mapping[str, Any],
        paths: Mapping[str, str],
        inputs: list[dict[str, Any]],
        cells: list[dict[str, Any]],
        turn_cells: list[dict[str, Any]] | None = None,
    ) -> None:
        self.environment = dict(environment)
        self.settings = dict(settings)
        self.paths = dict(paths)
        self.inputs = inputs
        self.cells = cells
        self.turn_cells = turn_cells or []
        self.path_keys = [p for p in paths if any(c["path"] == p for c in cells)]
        self.workloads = list(dict.fromkeys(c["workload"] for c in cells))
        self.concurrency = sorted({c["concurrency"] for c in cells})
        # The headline workload: mixed when it ran (none when only the multi-turn one did).
        self.main_workload = MIXED if MIXED in self.workloads else next(iter(self.workloads), "")

    def title(self, workload: str) -> str:
        if workload == MIXED:
            return f"mixed (all {len(self.inputs)} inputs in turn)"
        return str(next(i["name"] for i in self.inputs if i["key"] == workload))

    def cell(self, path: str, workload: str, concurrency: int) -> dict[str, Any] | None:
        for c in self.cells:
            if (c["path"], c["workload"], c["concurrency"]) == (path, workload, concurrency):
                return c
        return None

    def pooled(self, path: str, workload: str) -> dict[str, float | None]:
        """CPU ms and NIXL bytes per image over every concurrency of a
        path and workload (totals over images)."""
        chosen = [c for c in self.cells if c["path"] == path and c["workload"] == workload]
        images: int = sum(c["requests"] - c["errors"] for c in chosen)

        def total(get: Callable[[dict[str, Any]], float | None]) -> float | None:
            values: list[tuple[float | None, int]] = [(get(c), c["requests"] - c["errors"]) for c in chosen]
            if not images or any(v is None for v, n in values if n):
                return None
            return sum((v or 0.0) * n for v, n in values) / images

        out: dict[str, float | None] = {
            "api_server": total(lambda c: c["cpu_ms_per_image"]["api_server"]),
            "vllm_all": total(lambda c: c["cpu_ms_per_image"]["vllm_all"]),
            "frontend": total(lambda c: c["cpu_ms_per_image"]["frontend"]),
            "nixl_bytes": total(lambda c: c["nixl_bytes_per_image"]),
            "encoded_bytes": float(chosen[0]["encoded_bytes_per_image"]) if chosen else None,
        }
        api, every = out["api_server"], out["vllm_all"]
        out["other_vllm"] = None if api is None or every is None else max(0.0, every - api)
        return out

    def to_json(self) -> dict[str, Any]:
        from pixelwire.bench.conversation import turn_ratios

        out = {
            "environment": self.environment,
            "settings": self.settings,
            "paths": self.paths,
            "inputs": self.inputs,
            "cells": self.cells,
        }
        if self.turn_cells:
            out["multi_turn"] = {"cells": self.turn_cells, "ratios": turn_ratios(self.turn_cells)}
        return out


def _triple(values: Mapping[str, float | None]) -> str:
    return " / ".join(ms_text(values[k]) for k in ("p50", "p90", "p99"))


def workload_table(report: Report, workload: str) -> list[str]:
    lines = [
        "| path | clients | img/s | latency p50 / p90 / p99 ms | TTFT p50 / p90 / p99 ms "
        "| CPU ms/img: API server | all vLLM | frontend | NIXL MB/img | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for concurrency in report.concurrency:
        for path in report.path_keys:
            c = report.cell(path, workload, concurrency)
            if c is None:
                continue
            cpu = c["cpu_ms_per_image"]
            rate = "-" if c["images_per_s"] is None else f"{c['images_per_s']:.2f}"
            errors = f"{c['errors']}/{c['requests']}"
            lines.append(
                f"| {report.paths[path]} | {concurrency} | {rate} | {_triple(c['latency_ms'])} "
                f"| {_triple(c['ttft_ms'])} | {ms_text(cpu['api_server'])} | {ms_text(cpu['vllm_all'])} "
                f"| {ms_text(cpu['frontend'])} | {mb_text(c['nixl_bytes_per_image'])} | {errors} |"
            )
    return lines


def by_input_table(report: Report) -> list[str]:
    """Per workload and path, over every concurrency: the API server's CPU
    ms per image, and at the highest concurrency, images/s and p50 ms."""
    top = report.concurrency[-1]
    head = " | ".join(report.paths[p] for p in report.path_keys)
    lines = [
        f"| input | {head} |",
        "| --- |" + " ---: |" * len(report.path_keys),
    ]
    for workload in report.workloads:
        cells = []
        for path in report.path_keys:
            pooled = report.pooled(path, workload)
            c = report.cell(path, workload, top)
            rate = "-" if c is None or c["images_per_s"] is None else f"{c['images_per_s']:.2f}"
            p50 = "-" if c is None else ms_text(c["latency_ms"]["p50"])
            cells.append(f"{ms_text(pooled['api_server'])} ms · {rate}/s · {p50} ms")
        lines.append(f"| {report.title(workload)} | " + " | ".join(cells) + " |")
    return lines


def markdown(report: Report) -> str:
    from pixelwire.bench import turns_report

    lines = _header(report)
    if report.cells:
        lines += _image_sections(report)
    if report.turn_cells:
        lines += ["", *turns_report.markdown(report.turn_cells, report.paths, report.settings)]
    errors = sorted({e for c in report.cells + report.turn_cells for e in c["error_samples"]})
    if errors:
        lines += ["", "## Errors seen", "", *(f"- `{e[:300]}`" for e in errors[:20])]
    return "\n".join(lines) + "\n"


def _header(report: Report) -> list[str]:
    env, settings = report.environment, report.settings
    gpus = env["gpus"] if isinstance(env["gpus"], str) else ", ".join(env["gpus"])
    kwargs = ""
    if settings["mm_processor_kwargs"]:
        kwargs = f", `--mm-processor-kwargs {json.dumps(settings['mm_processor_kwargs'])}`"
    ready = []
    if "startup_s" in env:
        ready.append(f"servers ready after {env['startup_s']:.0f} s")
    if "multi_turn_startup_s" in env:
        started = env["multi_turn_startup_s"]
        ready.append(f"the multi-turn servers, a path at a time, after {started:.0f} s in all")
    return [
        "# pixelwire bench serve",
        "",
        f"- Machine: {env['cpu']}, {env['cores']} cores, {env['memory_gib']} GiB, GPUs: {gpus}; "
        f"load average {env['load_average_at_start'][0]:.2f} at the start, "
        f"{env.get('load_average_at_end', [0.0])[0]:.2f} at the end ({env['date']}).",
        f"- Network: {env['network_description']}.",
        f"- Placement: {env['placement']}.",
        f"- vLLM {env['vllm']}, model `{settings['model']}`{kwargs}.",
        f"- Run: {env.get('wall_s', 0):.0f} s in all{', ' if ready else ''}{', '.join(ready)}.",
    ]


def _image_sections(report: Report) -> list[str]:
    env, settings = report.environment, report.settings
    top = report.concurrency[-1]
    lines = [
        f"- Image and video workloads: vLLM flags `{' '.join(settings['vllm_flags'])}`.",
        f"- Inputs: {env['inputs']}; JPEG quality 90 and PNG level 6, at 1920x1080 and 3840x2160, "
        "as data: URLs and as http URLs of a local image server; the video workloads send one video "
        "the same two ways (its frames sampled by the model's video loader).",
        f"- Load: streaming chat completions, one image (or video) and a short prompt each, "
        f"{settings['max_tokens']} tokens generated (ignore_eos), from 1 to {top} concurrent `openai` "
        f"async clients; a cell is up to {settings['duration_s']:g} s of load or {settings['max_requests']} "
        f"requests (those in flight finish), after {settings['warm_up']} unmeasured requests per path "
        "and workload.",
        "- CPU ms per image: CPU time of vLLM's API-server process, of all vLLM processes "
        "(API server, engine core and helpers) and of the frontend during a cell, over its images "
        "(for a video workload: per video); each thread's nanoseconds on a CPU (schedstat), or the "
        "processes' user + system clock ticks where a thread ended in the cell. "
        'NIXL MB per image: the frontend\'s `pixelwire_frontend_pixel_bytes_total{path="nixl"}`, '
        "height x width x channels (RGB crosses NIXL at 4 bytes a pixel: a third more); for videos "
        "`pixelwire_frontend_video_frame_bytes_total` (3 bytes a pixel, as they cross). "
        "TTFT: until the first streamed chunk.",
        "",
        f"## {report.title(report.main_workload)}",
        "",
        *workload_table(report, report.main_workload),
        "",
        f"## By input: API-server CPU ms per image (all concurrencies) · images/s and p50 latency "
        f"at {top} clients",
        "",
        *by_input_table(report),
    ]
    for workload in report.workloads:
        if workload != report.main_workload:
            lines += ["", f"## {report.title(workload)}", "", *workload_table(report, workload)]
    return lines


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only), None without matplotlib."""
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return None
    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")


COLOURS = {
    "loader": "#7f7f7f",
    "frontend": "#1f77b4",
    "frontend-resize": "#2ca02c",
    "frontend-processed": "#9467bd",
    "worker": "#ff7f0e",
}


def _latency_axes(ax: Any, report: Report, workload: str, legend: bool) -> None:
    for path in report.path_keys:
        xs, p50, p99 = [], [], []
        for concurrency in report.concurrency:
            c = report.cell(path, workload, concurrency)
            if c and c["latency_ms"]["p50"] is not None:
                xs.append(concurrency)
                p50.append(c["latency_ms"]["p50"])
                p99.append(c["latency_ms"]["p99"])
        colour = COLOURS.get(path)
        ax.plot(xs, p50, "o-", color=colour, label=f"{report.paths[path]} p50")
        ax.plot(xs, p99, "x--", color=colour, alpha=0.6, label=f"{report.paths[path]} p99")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(report.concurrency, [str(c) for c in report.concurrency])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("request latency, ms")
    ax.set_title(report.title(workload), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if legend:
        ax.legend(fontsize=7)


def _cpu_axes(ax: Any, report: Report, workload: str) -> None:
    """CPU ms per image stacked by process, one bar per path (all concurrencies)."""
    positions = range(len(report.path_keys))
    bottoms = [0.0] * len(report.path_keys)
    for part, shade in zip(CPU_PARTS, ("#d62728", "#9467bd", "#17becf"), strict=True):
        heights = [report.pooled(p, workload)[part] or 0.0 for p in report.path_keys]
        ax.bar(positions, heights, bottom=bottoms, color=shade, label=CPU_LABELS[part])
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_xticks(
        list(positions), [report.paths[p].replace(" + ", "\n+ ") for p in report.path_keys], fontsize=8
    )
    ax.set_ylabel("CPU ms per image")
    ax.set_title(f"CPU per image, {report.title(workload)}", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)


def _bytes_axes(ax: Any, report: Report) -> None:
    """Per input, the bytes per image that reach vLLM: pixels over NIXL for
    the frontend paths, the encoded image for the others."""
    workloads = report.workloads
    width = 0.8 / max(1, len(report.path_keys))
    for n, path in enumerate(report.path_keys):
        heights = []
        for workload in workloads:
            pooled = report.pooled(path, workload)
            nixl = pooled["nixl_bytes"]
            over_nixl = path in ("frontend", "frontend-resize", "frontend-processed")
            heights.append(((nixl if over_nixl else pooled["encoded_bytes"]) or 0.0) / 1e6)
        xs = [i + (n - (len(report.path_keys) - 1) / 2) * width for i in range(len(workloads))]
        ax.bar(xs, heights, width, color=COLOURS.get(path), label=report.paths[path])
    ax.set_yscale("log")
    ax.set_xticks(range(len(workloads)), [report.title(w).replace(" (", "\n(") for w in workloads],
                  fontsize=7, rotation=30, ha="right")  # fmt: skip
    ax.set_ylabel("MB per image into vLLM")
    ax.set_title("bytes per image: NIXL pixels (frontend paths) or the encoded image", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", which="both", alpha=0.3)


def charts(report: Report, folder: Path) -> list[Path]:
    from pixelwire.bench import turns_report

    plt = _pyplot()
    if plt is None:
        return []
    written = []
    if report.turn_cells:
        written += turns_report.charts(plt, report.turn_cells, report.paths, folder, COLOURS)
    if not report.cells:
        return written
    columns = min(3, len(report.workloads))
    rows = -(-len(report.workloads) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 4 * rows), squeeze=False)
    for n, workload in enumerate(report.workloads):
        _latency_axes(axes[n // columns][n % columns], report, workload, legend=n == 0)
    for n in range(len(report.workloads), rows * columns):
        axes[n // columns][n % columns].axis("off")
    fig.suptitle("Latency vs concurrency (p50 solid, p99 dashed)")
    written.append(_save(plt, fig, folder / "latency.png"))

    columns = min(3, len(report.workloads))
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 4 * rows), squeeze=False)
    for n, workload in enumerate(report.workloads):
        _cpu_axes(axes[n // columns][n % columns], report, workload)
    for n in range(len(report.workloads), rows * columns):
        axes[n // columns][n % columns].axis("off")
    written.append(_save(plt, fig, folder / "cpu.png"))

    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(report.workloads) + 2), 4.5))
    _bytes_axes(ax, report)
    written.append(_save(plt, fig, folder / "bytes.png"))

    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    _latency_axes(axes[0], report, report.main_workload, legend=True)
    _cpu_axes(axes[1], report, report.main_workload)
    _bytes_axes(axes[2], report)
    env = report.environment
    fig.suptitle(
        f"pixelwire bench serve: {env['cores']} cores, {env['memory_gib']} GiB, GPUs: "
        f"{env['gpus'] if isinstance(env['gpus'], str) else len(env['gpus'])}, network: {env['network']}",
        fontsize=10,
    )
    written.append(_save(plt, fig, folder / "summary.png"))
    return written


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_all(
    folder: Path,
    *,
    environment: Mapping[str, Any],
    settings: Mapping[str, Any],
    paths: Mapping[str, str],
    inputs: list[dict[str, Any]],
    cells: list[dict[str, Any]],
    turn_cells: list[dict[str, Any]] | None = None,
) -> list[Path]:
    report = Report(environment, settings, paths, inputs, cells, turn_cells)
    written = [folder / "report.json", folder / "report.md"]
    written[0].write_text(json.dumps(report.to_json(), indent=2) + "\n")
    written[1].write_text(markdown(report))
    drawn = charts(report, folder)
    if not drawn:
        print("matplotlib is not installed: no charts (pip install matplotlib)")
    return written + drawn
