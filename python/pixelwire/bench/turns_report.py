"""The multi-turn workloads' part of the `pixelwire bench serve` report:
per workload, a table per turn, the last turn's cost over the first's, and
a chart (turns.png for the screenshots, turns-video.png for the video)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pixelwire.bench.conversation import cell_workload, turn_ratios
from pixelwire.bench.figures import mb_text, ms_text
from pixelwire.bench.inputs import MULTI_TURN, MULTI_TURN_KEYS, MULTI_TURN_VIDEO

CHART = "turns.png"
# The chart of each workload.
CHARTS = {MULTI_TURN: CHART, MULTI_TURN_VIDEO: "turns-video.png"}
# The chart's rows: what a request costs, by turn.
ROWS: dict[str, Callable[[Mapping[str, Any]], float | None]] = {
    "vLLM API server CPU ms per request": lambda c: c["cpu_ms_per_request"]["api_server"],
    "frontend CPU ms per request": lambda c: c["cpu_ms_per_request"]["frontend"],
    "latency p50, ms": lambda c: c["latency_ms"]["p50"],
}


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ordered(cells: Sequence[Mapping[str, Any]], paths: Mapping[str, str]) -> list[Mapping[str, Any]]:
    order = list(paths)
    return sorted(cells, key=lambda c: (c["concurrency"], order.index(c["path"]), c["turn"]))


def by_workload(cells: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The cells of each multi-turn workload, in the order they run."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for workload in MULTI_TURN_KEYS:
        chosen = [c for c in cells if cell_workload(c) == workload]
        if chosen:
            out[workload] = chosen
    return out


def turns_table(cells: Sequence[Mapping[str, Any]], paths: Mapping[str, str]) -> list[str]:
    """A row per path, conversations and turn (of one workload's cells)."""
    lines = [
        "| path | conversations | turn | latency p50 / p90 ms | TTFT p50 / p90 ms "
        "| CPU ms/request: API server | all vLLM | frontend | NIXL MB/request: referred to | read "
        "| errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for c in _ordered(cells, paths):
        cpu = c["cpu_ms_per_request"]
        latency, ttft = c["latency_ms"], c["ttft_ms"]
        lines.append(
            f"| {paths[c['path']]} | {c['concurrency']} | {c['turn']} "
            f"| {ms_text(latency['p50'])} / {ms_text(latency['p90'])} "
            f"| {ms_text(ttft['p50'])} / {ms_text(ttft['p90'])} | {ms_text(cpu['api_server'])} "
            f"| {ms_text(cpu['vllm_all'])} | {ms_text(cpu['frontend'])} "
            f"| {mb_text(c['nixl_pixel_bytes_per_request'])} "
            f"| {mb_text(c['nixl_read_bytes_per_request'])} | {c['errors']}/{c['requests']} |"
        )
    return lines


def ratio_table(cells: Sequence[Mapping[str, Any]], paths: Mapping[str, str]) -> list[str]:
    """Per path and conversations (of one workload's cells): CPU ms per
    request at the first and the last turn, and their ratio, for the API
    server and the frontend."""
    by_key = {(c["path"], c["concurrency"], c["turn"]): c for c in cells}
    order = list(paths)
    ratios = sorted(turn_ratios(cells), key=lambda r: (r["concurrency"], order.index(r["path"])))
    if not ratios:
        return []
    last = ratios[0]["last_turn"]
    lines = [
        f"| path | conversations | API server CPU ms/request: turn 1 → {last} | x "
        f"| frontend CPU ms/request: turn 1 → {last} | x | latency p50 ms: turn 1 → {last} |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in ratios:
        first = by_key[(r["path"], r["concurrency"], r["first_turn"])]
        end = by_key[(r["path"], r["concurrency"], r["last_turn"])]
        api, front = (f"{ms_text(ROWS[row](first))} → {ms_text(ROWS[row](end))}" for row in list(ROWS)[:2])
        latency = f"{ms_text(first['latency_ms']['p50'])} → {ms_text(end['latency_ms']['p50'])}"
        lines.append(
            f"| {paths[r['path']]} | {r['concurrency']} | {api} | {_times(r['cpu_ratio']['api_server'])} "
            f"| {front} | {_times(r['cpu_ratio']['frontend'])} | {latency} |"
        )
    return lines


def markdown(
    cells: Sequence[Mapping[str, Any]], paths: Mapping[str, str], settings: Mapping[str, Any]
) -> list[str]:
    """The report's multi-turn sections, one per workload that ran."""
    rounds = settings["rounds"]
    flags = " ".join(settings["multi_turn_vllm_flags"])
    if settings["multi_turn_caches"]:
        servers = (
            f"Servers of their own, a path's up only for its own turns, every cache on: vLLM flags "
            f"`{flags}` (processor and prefix caches "
            f"on), frontends `--cache-bytes {settings['frontend_cache_bytes']}`, plug-in "
            f"`PIXELWIRE_WORKER_CACHE_BYTES={settings['worker_cache_bytes']}`."
        )
    else:
        servers = (
            f"The image workloads' servers, every cache off (`--multi-turn-caches off`): vLLM flags "
            f"`{flags}`, frontends `--cache-bytes 0`, no worker cache."
        )
    sets = f"{rounds} set{'s' if rounds != 1 else ''} of them a cell"
    titles = {
        MULTI_TURN: f"{settings['turns']} turns, turn k sends k 1080p PNG screenshots",
        MULTI_TURN_VIDEO: f"{settings['turns']} turns about one video, resent with every turn",
    }
    chats = {
        MULTI_TURN: "A conversation is an agent loop: each turn resends the chat so far (every earlier "
        "screenshot as the same `data:` URL, and the answers streamed back) with one new screenshot "
        f"and a short prompt, {settings['max_tokens']} tokens generated. Conversations at once advance "
        f"a turn at a time; {sets}; every conversation has screenshots of its own.",
        MULTI_TURN_VIDEO: "A conversation is a chat about one video (the run's, as a `data:` URL): turn 1 "
        "sends it with a question, each later turn resends the chat so far (the video as the same "
        f"`data:` URL, the answers streamed back) with a new question, {settings['max_tokens']} tokens "
        f"generated. Conversations at once advance a turn at a time; {sets}; every conversation's "
        "video has bytes of its own (an MP4 `free` box appended: the same frames).",
    }
    lines: list[str] = []
    for workload, chosen in by_workload(cells).items():
        lines += [
            f"## Multi-turn: {titles[workload]}",
            "",
            f"- {servers}",
            f"- {chats[workload]}",
            "- CPU ms per request: the processes' CPU time across each turn (each thread's nanoseconds on "
            "a CPU, or their clock ticks where a thread ended in the turn), over its requests. "
            "NIXL MB per request: the pixels its descriptors refer to (the frontend's "
            '`pixelwire_frontend_pixel_bytes_total{path="nixl"}` and '
            '`pixelwire_frontend_video_frame_bytes_total{path="nixl"}`), and those READ over NIXL (the '
            "plug-in's READs, `pixelwire_worker_decode_seconds_count`, times a medium's bytes; a "
            "worker-cache hit reads nothing).",
            "",
            f"### Turn {cells_last_turn(chosen)} over turn 1",
            "",
            *ratio_table(chosen, paths),
            "",
            "### Every turn",
            "",
            *turns_table(chosen, paths),
            "",
        ]
    return lines[:-1]


def cells_last_turn(cells: Sequence[Mapping[str, Any]]) -> int:
    return max((int(c["turn"]) for c in cells), default=0)


def charts(plt: Any, cells: Sequence[Mapping[str, Any]], paths: Mapping[str, str], folder: Path,
           colours: Mapping[str, str]) -> list[Path]:  # fmt: skip
    """A chart per workload that ran (``CHARTS``)."""
    return [
        chart(plt, chosen, paths, folder / CHARTS[workload], colours)
        for workload, chosen in by_workload(cells).items()
    ]


def chart(plt: Any, cells: Sequence[Mapping[str, Any]], paths: Mapping[str, str], written: Path,
          colours: Mapping[str, str]) -> Path:  # fmt: skip
    """One workload's chart: per turn, each row's cost, one line per path,
    a column per number of conversations."""
    concurrency = sorted({int(c["concurrency"]) for c in cells})
    fig, axes = plt.subplots(
        len(ROWS), len(concurrency), figsize=(5.5 * len(concurrency), 3.3 * len(ROWS)), squeeze=False
    )
    for column, conversations in enumerate(concurrency):
        for row, (label, get) in enumerate(ROWS.items()):
            ax = axes[row][column]
            for path in paths:
                chosen = sorted(
                    (c for c in cells if c["path"] == path and c["concurrency"] == conversations),
                    key=lambda c: c["turn"],
                )
                points = [(c["turn"], get(c)) for c in chosen if get(c) is not None]
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, "o-", color=colours.get(path), label=paths[path])
            ax.set_xticks(sorted({int(c["turn"]) for c in cells}))
            ax.set_xlabel("turn")
            ax.set_ylabel(label, fontsize=8)
            ax.set_ylim(bottom=0)
            ax.set_title(
                f"{conversations} conversation{'s' if conversations != 1 else ''} at once", fontsize=9
            )
            ax.grid(True, alpha=0.3)
            if row == 0 and column == 0:
                ax.legend(fontsize=7)
    fig.suptitle("Multi-turn: cost per request by turn")
    fig.tight_layout()
    fig.savefig(written, dpi=110)
    plt.close(fig)
    return written
