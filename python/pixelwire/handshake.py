"""The start-up handshake's content: the settings a worker's plug-in
declares as the labels of ``pixelwire_worker_info`` on vLLM's /metrics, and
how a frontend compares its own settings with them.

What must agree depends on where images are decoded. At the frontend
(references over NIXL): the worker must run the pixelwire connector, the
same pixelwire version (the descriptor and its NIXL metadata are one
release's format), a secret with the same fingerprint (or none on both
sides, with ``PIXELWIRE_ALLOW_UNSIGNED=1`` on the worker), and, when the
frontend resizes (``--model``), the same resize policy (the plug-in's
comes from vLLM's ``--model`` and ``--mm-processor-kwargs``, or
``PIXELWIRE_MODEL``/``PIXELWIRE_MM_PROCESSOR_KWARGS``). At the worker (the
frontend passes URLs on): a frontend that lets private addresses through
(``--allow-private``) needs a plug-in that fetches them too
(``PIXELWIRE_ALLOW_PRIVATE=1``), and a vLLM without the plug-in disagrees:
its own loader would fetch them, outside pixelwire's guard on redirects. In
both modes a vLLM that requires an API key must accept the frontend's
(:func:`api_key_mismatches`), and a /metrics page that is not vLLM's (a
router's or a load balancer's) is named as such (:func:`metrics_problem`).

Image modes and backgrounds are not declared: the plug-in learns vLLM's
``--media-io-kwargs`` per connector, not at start-up, so they stay checked
per image (a 400 naming ``--media-io-kwargs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.parser import text_string_to_metric_families

from pixelwire.config import (
    CONNECTOR_NAME,
    allow_private_from_env,
    allow_unsigned_from_env,
    data_url_memo_bytes,
    secret_from_env,
    worker_cache_bytes_from_env,
)
from pixelwire.signing import secret_fingerprint

if TYPE_CHECKING:
    from pixelwire.frontend.settings import FrontendConfig

INFO_METRIC = "pixelwire_worker_info"
# What a label missing from an older worker's info reads as.
UNKNOWN = "unknown"


@dataclass(frozen=True)
class WorkerSettings:
    """What a worker declares: pixelwire's version, VLLM_MEDIA_CONNECTOR,
    the secret's fingerprint (``"none"`` without one), PIXELWIRE_ALLOW_UNSIGNED
    and PIXELWIRE_ALLOW_PRIVATE (``"1"``/``"0"``), the resize policy's
    identity (``"none"`` when the plug-in has no policy), the identity of
    the processed inputs it takes (``processed``: :mod:`pixelwire.processed`,
    ``"none"`` when it takes none), and whether it
    keeps the ``data:`` URLs it decoded (``memo``: PIXELWIRE_WORKER_CACHE_BYTES
    on), which a worker-mode frontend needs before it sends resent images
    as references to them (:mod:`pixelwire.resent_reference`)."""

    version: str
    connector: str
    secret: str = UNKNOWN
    unsigned: str = UNKNOWN
    private: str = UNKNOWN
    resize: str = UNKNOWN
    memo: str = UNKNOWN
    processed: str = UNKNOWN

    @classmethod
    def declared(cls, version: str, connector: str, resize: str, processed: str) -> WorkerSettings:
        """This process's settings, from its environment (read through
        :mod:`pixelwire.config`), with its resize policy's identity."""
        return cls(
            version=version,
            connector=connector,
            secret=secret_fingerprint(secret_from_env()),
            unsigned=_flag(allow_unsigned_from_env()),
            private=_flag(allow_private_from_env()),
            resize=resize,
            memo=_flag(data_url_memo_bytes(worker_cache_bytes_from_env()) > 0),
            processed=processed,
        )

    def labels(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in INFO_LABELS}

    @classmethod
    def from_labels(cls, labels: dict[str, str]) -> WorkerSettings:
        known = {name: labels[name] for name in INFO_LABELS if name in labels}
        return cls(**{"version": UNKNOWN, "connector": UNKNOWN, **known})


INFO_LABELS = ("version", "connector", "secret", "unsigned", "private", "resize", "memo", "processed")


def _flag(value: bool) -> str:
    return "1" if value else "0"


def worker_settings_in(metrics_text: str) -> WorkerSettings | None:
    """The settings a worker declares in vLLM's /metrics text; None when no
    pixelwire plug-in shows there (not installed in that vLLM). Only the
    info metric's lines are parsed, so nothing else on the page matters."""
    lines = [line for line in metrics_text.splitlines() if INFO_METRIC in line]
    try:
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except ValueError:
        return None
    for family in families:
        for sample in family.samples:
            if sample.name == INFO_METRIC and sample.value == 1:
                return WorkerSettings.from_labels(dict(sample.labels))
    return None


@dataclass(frozen=True)
class Mismatch:
    """One setting the two sides disagree on: its label, each side's value,
    and a message naming the variable or option that would change it."""

    setting: str
    frontend: str
    worker: str
    message: str


NOT_THE_CONNECTOR = (
    "the upstream vLLM does NOT run the pixelwire media connector: start it with pixelwire installed "
    "and VLLM_MEDIA_CONNECTOR=pixelwire (where --upstream is a router in front of vLLM servers that do, "
    "give --upstream-metrics with each one's /metrics URL)"
)
# Worker mode passes URLs on for the plug-in to fetch and decode: a vLLM
# without it would load them with its own loader, which follows redirects
# the frontend never checked and decodes with Pillow.
NOT_THE_CONNECTOR_FOR_URLS = (
    "the upstream vLLM does NOT run the pixelwire media connector, so with --decode-at worker its own "
    "loader would fetch and decode the images this frontend passes on (redirects unchecked by "
    "pixelwire's address guard, no native decode): start it with pixelwire installed and "
    "VLLM_MEDIA_CONNECTOR=pixelwire, or give this frontend --no-check-upstream to pass images to it anyway"
)
# How to point the handshake at vLLM's own /metrics, for every answer that
# is not a vLLM page the frontend can read its worker's settings from.
METRICS_FIX = (
    "--upstream must be a vLLM server's own address (http://HOST:PORT, without /v1); behind a router or "
    "load balancer that does not pass vLLM's /metrics on, give --upstream-metrics with each vLLM "
    "server's /metrics URL (repeatable), or --no-check-upstream to skip the handshake"
)


def metrics_problem(status: int, text: str) -> str | None:
    """Why an answer to GET /metrics (``status``, body ``text``) tells
    nothing about the worker's settings, with the fix; None for a page of
    vLLM's (with or without the plug-in's info: :func:`mismatches` judges
    that). A page without vLLM's own metrics and without the plug-in's
    info is a router's, a load balancer's, or another server's."""
    if status != 200:
        return (
            f"the upstream answers GET /metrics with {status}, so this frontend cannot read the pixelwire "
            f"plug-in's settings there: {METRICS_FIX}"
        )
    if INFO_METRIC not in text and "vllm:" not in text:
        return (
            "the upstream's GET /metrics shows neither vLLM's metrics nor the pixelwire plug-in's settings "
            f"(it is not a vLLM server with pixelwire installed and VLLM_MEDIA_CONNECTOR=pixelwire): "
            f"{METRICS_FIX}"
        )
    return None


def api_key_mismatches(keys: int, refused_without_key: bool, refused_keys: int) -> list[Mismatch]:
    """The API-key disagreement, from GET /v1/models upstream (which vLLM
    guards with its ``--api-key``): a frontend of ``keys`` keys (0: none)
    whose upstream refused a request without a key (``refused_without_key``),
    or ``refused_keys`` of the frontend's keys. A frontend without a key in
    front of a vLLM with one would fetch and decode images for clients
    vLLM then refuses; one whose key vLLM refuses sends no request vLLM
    serves."""
    if keys == 0 and refused_without_key:
        return [
            Mismatch(
                "api_key",
                "none",
                "required",
                "the upstream vLLM requires an API key and this frontend has none, so it would fetch and "
                "decode images for clients vLLM then refuses (401): give the frontend vLLM's key "
                "(--api-key, or VLLM_API_KEY)",
            )
        ]
    if refused_keys:
        which = (
            "this frontend's API key" if keys == 1 else f"{refused_keys} of this frontend's {keys} API keys"
        )
        return [
            Mismatch(
                "api_key",
                "set",
                "refused",
                f"the upstream vLLM refuses {which} (401 to GET /v1/models), so every request sent with it "
                "fails there: give the frontend the same key as vLLM's --api-key (or VLLM_API_KEY)",
            )
        ]
    return []


def mismatches(config: FrontendConfig, worker: WorkerSettings | None, version: str) -> list[Mismatch]:
    """Every setting on which a frontend (``config``, pixelwire ``version``)
    and the worker that declared ``worker`` (None: no plug-in) disagree, in
    the terms of the frontend's ``decode_at``."""
    if config.decode_at == "worker":
        if worker is None or worker.connector != CONNECTOR_NAME:
            selected = "none" if worker is None else worker.connector
            return [
                Mismatch(
                    "connector",
                    CONNECTOR_NAME,
                    selected,
                    f"{NOT_THE_CONNECTOR_FOR_URLS} (its connector: {selected})",
                )
            ]
        if config.allow_private and worker.private != "1":
            return [
                Mismatch(
                    "private",
                    "1",
                    worker.private,
                    "PIXELWIRE_ALLOW_PRIVATE differs: this frontend lets private addresses through "
                    "(--allow-private) but the worker's plug-in refuses them (PIXELWIRE_ALLOW_PRIVATE unset "
                    "on vLLM): set PIXELWIRE_ALLOW_PRIVATE=1 on vLLM, or drop --allow-private",
                )
            ]
        return []
    if worker is None or worker.connector != CONNECTOR_NAME:
        selected = "none" if worker is None else worker.connector
        return [
            Mismatch(
                "connector", CONNECTOR_NAME, selected, f"{NOT_THE_CONNECTOR} (its connector: {selected})"
            )
        ]
    found: list[Mismatch] = []
    if worker.version != version:
        found.append(
            Mismatch(
                "version",
                version,
                worker.version,
                f"pixelwire versions differ: frontend {version}, worker {worker.version}: install the same "
                "pixelwire release on both sides",
            )
        )
    found.extend(_secret_mismatches(config, worker))
    if config.resize is not None and worker.resize != config.resize.identity:
        ours = config.resize.identity
        if worker.resize == "none" and config.resize.approximate:
            message = (
                f"the resize policies differ: this frontend resizes approximately for {ours} "
                "(--resize-approximate) but the worker has no resize policy to check it against: set "
                "PIXELWIRE_RESIZE_APPROXIMATE=1 on vLLM to accept the approximate resize, or start the "
                "frontend without --resize-approximate"
            )
        elif worker.resize == "none":
            message = (
                f"the resize policies differ: this frontend resizes for {ours} (--model, "
                "--mm-processor-kwargs) but the worker has no resize policy to check it against (vLLM's "
                "model has no processor pixelwire resizes for, or the plug-in could not read it: vLLM's "
                "start-up log says why): set PIXELWIRE_MODEL (and PIXELWIRE_MM_PROCESSOR_KWARGS) on vLLM "
                "to its --model (and --mm-processor-kwargs), or start the frontend without --model"
            )
        else:
            message = (
                f"the resize policies differ: this frontend resizes for {ours} (--model, "
                f"--mm-processor-kwargs), the worker for {worker.resize} (vLLM's "
                "--model and --mm-processor-kwargs): give the frontend the same --model and "
                "--mm-processor-kwargs as vLLM"
            )
        found.append(Mismatch("resize", ours, worker.resize, message))
    if config.processed is not None and worker.processed != config.processed.identity:
        ours = config.processed.identity
        if worker.processed == "none":
            message = (
                f"processed inputs differ: this frontend ships images as {ours} (--model, "
                "--mm-processor-kwargs), which the worker does not take (vLLM runs another processor, its "
                "device normalisation is off (--mm-device-do-normalize), or it trusts requests' own "
                "mm_processor_kwargs): start the frontend with --no-processed-inputs, or vLLM with its "
                "defaults for those settings"
            )
        else:
            message = (
                f"processed inputs differ: this frontend ships images as {ours}, the worker takes "
                f"{worker.processed}: give the frontend the same --model and --mm-processor-kwargs as vLLM"
            )
        found.append(Mismatch("processed", ours, worker.processed, message))
    return found


def _secret_mismatches(config: FrontendConfig, worker: WorkerSettings) -> list[Mismatch]:
    ours = secret_fingerprint(config.secret)
    if ours != worker.secret:
        if ours == "none":
            fix = "set the worker's PIXELWIRE_SECRET on the frontend too"
        elif worker.secret == "none":
            fix = "set the frontend's PIXELWIRE_SECRET on vLLM too"
        else:
            fix = "set the same PIXELWIRE_SECRET on both sides"
        return [
            Mismatch(
                "secret",
                ours,
                worker.secret,
                f"PIXELWIRE_SECRET differs: frontend fingerprint {ours}, worker {worker.secret}: {fix}",
            )
        ]
    if ours == "none" and worker.unsigned != "1":
        return [
            Mismatch(
                "unsigned",
                "1",
                worker.unsigned,
                "PIXELWIRE_SECRET is unset on both sides and the worker refuses unsigned references "
                "(PIXELWIRE_ALLOW_UNSIGNED unset on vLLM): set the same PIXELWIRE_SECRET on both sides, or "
                "PIXELWIRE_ALLOW_UNSIGNED=1 on vLLM if every client that can reach it is trusted",
            )
        ]
    return []


# Every setting a mismatch can name, for metrics that show each one.
SETTINGS = ("connector", "version", "secret", "unsigned", "resize", "private", "processed", "api_key")
