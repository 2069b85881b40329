"""What this worker's plug-in is set to: the served model's resize,
checked and logged at start-up, the settings it declares for the
handshake (:mod:`pixelwire.handshake`) and the metrics that carry them."""

from __future__ import annotations

import functools
import logging
import sys
import threading

from prometheus_client import REGISTRY

from pixelwire import __version__
from pixelwire.caches.worker_images import worker_image_cache
from pixelwire.config import (
    CONNECTOR_NAME,
    allow_unsigned_from_env,
    resize_approximate_from_env,
    secret_from_env,
)
from pixelwire.handshake import WorkerSettings
from pixelwire.metrics import MediaMetrics, worker_metrics
from pixelwire.resize import ResizePolicy, image_resize_policy
from pixelwire.signing import signing_policy
from pixelwire.transfer import default_reader
from pixelwire.vllm.media_settings import VllmMediaSettings
from pixelwire.vllm.served_model import from_command_line as served_model_from_command_line
from pixelwire.vllm.served_model import same_model, served_model
from pixelwire.vllm.worker_layouts import worker_patch_layout

_metrics_lock = threading.Lock()
_metrics: MediaMetrics | None = None

log = logging.getLogger("pixelwire.vllm")


@functools.cache
def worker_resize_policy() -> ResizePolicy | None:
    """The model-aware resize of the model this vLLM serves
    (:func:`pixelwire.vllm.served_model.served_model`: vLLM's ``--model`` and
    ``--mm-processor-kwargs``, or PIXELWIRE_MODEL and
    PIXELWIRE_MM_PROCESSOR_KWARGS). None when the model is unknown or its
    processor config cannot be read (a model vLLM was started with may have
    none: a text model); a PIXELWIRE_MODEL that cannot be read raises."""
    served = served_model(sys.argv)
    if served.model is None:
        return None
    try:
        return image_resize_policy(
            served.model, served.mm_processor_kwargs, approximate=resize_approximate_from_env()
        )
    except (OSError, ValueError) as error:
        if served.explicit:
            raise
        log.info("no model-aware resize for %s (from %s): %s", served.model, served.source, error)
        return None


def url_resize_allowed() -> bool:
    """Whether images and videos the plug-in decodes from URLs itself
    (worker mode) may be resized for the served model: not where vLLM
    trusts a request's own ``mm_processor_kwargs`` (--trust-request-mm-kwargs),
    which never reach a media connector, so a resize for the served
    settings could differ from what vLLM's processor makes with the
    request's; those URLs are decoded at full size, as vLLM's loader gives
    them. (References are resized by the frontend, which sees the request.)"""
    return not served_model(sys.argv).trusts_request_kwargs


def check_resize_setting(argv: list[str]) -> None:
    """At start-up: a PIXELWIRE_MODEL must name the model vLLM was started
    with, else the plug-in's checks would compare against another model's
    processor; logs the resize policy and where its model came from."""
    served, started = served_model(argv), served_model_from_command_line(argv)
    if served.explicit and served.model and started.model and not same_model(served.model, started.model):
        log.error(
            "PIXELWIRE_MODEL=%s but vLLM serves %s: unset PIXELWIRE_MODEL (the plug-in reads vLLM's "
            "--model), or frontend-resized images will be checked against the wrong processor",
            served.model,
            started.model,
        )
    policy = worker_resize_policy()
    if policy is not None:
        log.info(
            "pixelwire model-aware resize: %s (%s, from %s)", policy.identity, served.model, served.source
        )
        if served.trusts_request_kwargs:
            log.info(
                "images and videos decoded here from URLs (worker mode) keep their size: vLLM trusts a "
                "request's own mm_processor_kwargs (--trust-request-mm-kwargs), which the plug-in cannot see"
            )
    else:
        log.info(
            "pixelwire model-aware resize: off (model %s, from %s); frontend-resized images are refused",
            served.model or "unknown",
            served.source,
        )
    layout = worker_patch_layout(policy)
    if layout is not None:
        log.info("pixelwire processed inputs: %s", layout.identity)
    else:
        log.info(
            "pixelwire processed inputs: off (a processor pixelwire makes the outputs of needs Qwen2-VL, "
            "Qwen2.5-VL, Qwen3-VL or GLM-4.1V/4.5V, the torchvision backend and no "
            "--trust-request-mm-kwargs); frontends ship pixels"
        )


def check_media_cache_setting() -> None:
    """At start-up: VLLM_MEDIA_CACHE is not used by the plug-in (docs/architecture.md,
    "Differences from vLLM"); says so when it is set."""
    if VllmMediaSettings.from_env().media_cache:
        log.warning(
            "VLLM_MEDIA_CACHE is set, but the pixelwire connector does not use vLLM's media cache: "
            "bytes cached by URL would be handed out without the address guard's check"
        )


def check_signing_setting() -> None:
    """At start-up: logs how descriptor references are checked; an error
    when they are all refused (neither a secret nor the trusted-network
    setting), a warning when they are not checked."""
    policy = signing_policy()
    if secret_from_env() is not None:
        log.info("pixelwire descriptor references: %s", policy)
    elif allow_unsigned_from_env():
        log.warning("pixelwire descriptor references: %s", policy)
    else:
        log.error(
            "pixelwire descriptor references: %s; set PIXELWIRE_SECRET to the frontend's secret, "
            "or PIXELWIRE_ALLOW_UNSIGNED=1 if every client that can reach this vLLM is trusted",
            policy,
        )


def _reader_bytes_in_use() -> float:
    reader = default_reader()
    return float(reader.stats()["bytes_in_use"]) if reader.is_open else 0.0


def _reader_frontends() -> float:
    reader = default_reader()
    return float(reader.remote_count)


def install_metrics(selected: str) -> MediaMetrics:
    """``pixelwire_worker_*`` in prometheus_client's default registry, which
    vLLM's API server serves at /metrics. ``pixelwire_worker_info`` is the
    worker's half of the start-up handshake: its labels are the settings a
    frontend must agree with (:mod:`pixelwire.handshake`)."""
    global _metrics
    with _metrics_lock:
        if _metrics is None:
            _metrics = worker_metrics(
                REGISTRY,
                declared_settings(selected).labels(),
                pool_bytes_in_use=_reader_bytes_in_use,
                pool_bytes_capacity=_reader_pool_capacity,
                frontends=_reader_frontends,
                cache_stats=lambda: worker_image_cache().stats(),
            )
        return _metrics


def declared_settings(selected: str) -> WorkerSettings:
    """The settings this worker declares. When the plug-in is not the
    connector, a PIXELWIRE_MODEL that cannot be read is no reason to stop
    vLLM (nothing here resizes): its resize reads as unreadable. The resize
    comes from :func:`worker_resize_policy`, the same source as the checks."""
    try:
        policy = worker_resize_policy()
    except (OSError, ValueError):
        if selected == CONNECTOR_NAME:
            raise
        return WorkerSettings.declared(__version__, selected, "unreadable", "none")
    layout = worker_patch_layout(policy)
    return WorkerSettings.declared(
        __version__, selected, policy.identity if policy else "none", layout.identity if layout else "none"
    )


def _reader_pool_capacity() -> float:
    return float(default_reader().settings.pool_bytes)
