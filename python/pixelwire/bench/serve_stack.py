"""The servers of a `pixelwire bench serve` run (:class:`Stack`: the vLLM
servers and the frontends of each path), the flags vLLM starts with, and
the counters read around a cell (:class:`Counters`)."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from pixelwire.bench.serve_settings import Settings

SERVED_MODEL_NAME = "bench"
# Every request's image is loaded and processed again: the comparison is
# about that work, not about vLLM's caches.
NO_CACHES = ["--mm-processor-cache-gb", "0", "--no-enable-prefix-caching"]


class Stack:
    """The vLLM servers and frontends of one run; ``servers[path]`` is
    (vLLM, frontend or None) and ``base_url[path]`` where clients go.
    ``caches``: vLLM's, the frontends' and the plug-in's caches on (the
    multi-turn workloads' servers) or off; ``images``, ``videos``: a
    request's most (``vllm_flags``)."""

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
        videos: int | None = None,
    ) -> None:
        from pixelwire.bench.services import Service, free_port
        from pixelwire.video.sampling import model_video_loader

        self.services: list[Service] = []
        self.servers: dict[str, tuple[Service, Service | None]] = {}
        self.base_url: dict[str, str] = {}
        secret = secrets.token_hex(32)
        kwargs_json = json.dumps(settings.mm_processor_kwargs) if settings.mm_processor_kwargs else None
        host = network.host_address
        flags = vllm_flags(caches=caches, images=images, videos=videos)
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


def vllm_flags(*, caches: bool, images: int, videos: int | None = None) -> list[str]:
    """``images`` images and ``videos`` videos a request; without
    ``caches``, vLLM's processor and prefix caches off, and by default a
    video allowed (the image and video workloads' servers); with them,
    vLLM's caches as they come (on) and by default no video (the
    screenshots' multi-turn workload's; the video one's allow one)."""
    if videos is None:
        videos = 0 if caches else 1
    limit = json.dumps({"image": images, "video": videos})
    return ["--limit-mm-per-prompt", limit, *([] if caches else NO_CACHES)]
