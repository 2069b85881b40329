"""The frontend's half of the start-up handshake: it reads the worker's
settings from vLLM's /metrics (:mod:`pixelwire.handshake` says what must
agree), holds the outcome, logs one line each time it changes, refuses
image requests while the two sides disagree, and shows the state on the
frontend's ``/health`` and metrics.

Checked at start, every ``HANDSHAKE_INTERVAL`` seconds while the sides
agree and every ``HANDSHAKE_RETRY`` while they do not (or vLLM does not
answer), at once when the plug-in refuses a request, and before an image
request that would otherwise be refused, so a fixed worker is seen at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Gauge

from pixelwire import __version__
from pixelwire.config import (
    CONNECTOR_NAME,
    HANDSHAKE_INTERVAL,
    HANDSHAKE_RECHECK_AGE,
    HANDSHAKE_RETRY,
    HANDSHAKE_TIMEOUT,
    FrontendConfig,
)
from pixelwire.frontend.errors import OpenAIError
from pixelwire.handshake import SETTINGS, Mismatch, WorkerSettings, mismatches, worker_settings_in

# The package's one logger: its name is what the frontend's log lines carry.
log = logging.getLogger("pixelwire.frontend")


class UpstreamWatch:
    """The last handshake with the upstream vLLM. Until :meth:`start`, and
    with ``check_upstream`` off, nothing is checked and nothing refused."""

    def __init__(self, config: FrontendConfig, upstream: str, registry: CollectorRegistry) -> None:
        self.config = config
        self.upstream = upstream
        self.enabled = config.check_upstream
        # The last check: whether vLLM answered /metrics, what the worker
        # declared there (None: no plug-in), and where the sides disagree.
        self.reachable = False
        self.worker: WorkerSettings | None = None
        self.mismatches: list[Mismatch] = []
        self.checked_at: float | None = None
        # When the recorded check began (monotonic), and whether vLLM sent
        # any answer to it (a refused or timed-out connection: none).
        self._checked_began = float("-inf")
        self._silent = True
        self._logged: tuple[Any, ...] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._checking: asyncio.Task[None] | None = None
        self._loop: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.agreement = Gauge(
            "pixelwire_frontend_upstream_agreement",
            "1 while the last handshake found the upstream vLLM's pixelwire settings agreeing with this "
            "frontend's (image requests are served); 0 while they disagree or vLLM did not answer",
            registry=registry,
        )
        self.mismatch = Gauge(
            "pixelwire_frontend_upstream_mismatch",
            "1 for each setting the last handshake found the upstream disagreeing on (image requests are "
            "refused with 502 while any is 1): connector, version, secret, unsigned, resize, private",
            ["setting"],
            registry=registry,
        )
        for setting in SETTINGS:
            self.mismatch.labels(setting=setting).set(0)

    @property
    def agrees(self) -> bool:
        return self.reachable and not self.mismatches

    # -- lifecycle -------------------------------------------------------------

    def start(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        if self.enabled:
            self._loop = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        for task in (self._loop, self._checking):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await self.check()
            self._wake.clear()
            try:
                await asyncio.wait_for(
                    self._wake.wait(), HANDSHAKE_INTERVAL if self.agrees else HANDSHAKE_RETRY
                )
            except TimeoutError:
                pass

    # -- checks ----------------------------------------------------------------

    async def check(self, max_age: float = 0.0) -> None:
        """Until the recorded outcome comes from a look at the upstream that
        began at most ``max_age`` seconds before this call. One look at a
        time: concurrent callers share it, and one that began too early
        for a caller is followed by another."""
        wanted = time.monotonic() - max_age
        while self._checked_began < wanted:
            if self._checking is None or self._checking.done():
                self._checking = asyncio.create_task(self._check(time.monotonic()))
            await asyncio.shield(self._checking)

    async def _check(self, began: float) -> None:
        answer = await self._get("/metrics")
        text = answer[1] if answer is not None and answer[0] == 200 else None
        self._silent = answer is None
        self.reachable = text is not None
        self.worker = worker_settings_in(text) if text is not None else None
        self.mismatches = mismatches(self.config, self.worker, __version__) if text is not None else []
        self.checked_at = time.time()
        self._checked_began = began
        self.agreement.set(1 if self.agrees else 0)
        found = {m.setting for m in self.mismatches}
        for setting in SETTINGS:
            self.mismatch.labels(setting=setting).set(1 if setting in found else 0)
        self._log_change()

    async def _get(self, path: str) -> tuple[int, str] | None:
        """(status, body) of GET ``path`` upstream, redirects not followed,
        within the handshake's timeout; None when it does not answer."""
        assert self._session is not None
        try:
            async with self._session.get(
                f"{self.upstream}{path}",
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=HANDSHAKE_TIMEOUT),
            ) as response:
                return response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
            return None

    def _log_change(self) -> None:
        """One line each time the outcome changes, none while it stays."""
        state = (self.reachable, tuple(self.mismatches))
        if state == self._logged:
            return
        first = self._logged is None
        self._logged = state
        if not self.reachable:
            if not first:
                log.warning(
                    "upstream %s does not answer GET /metrics: image requests are refused", self.upstream
                )
            return
        if self.mismatches:
            log.error(
                "upstream %s disagrees with this frontend; image requests are refused (502) until it "
                "agrees: %s",
                self.upstream,
                "; ".join(m.message for m in self.mismatches),
            )
        elif self.worker is not None and self.worker.connector == CONNECTOR_NAME:
            log.info(
                "upstream %s runs the pixelwire media connector and agrees with this frontend",
                self.upstream,
            )
        else:
            log.info("upstream %s answers (no pixelwire plug-in: vLLM fetches URLs itself)", self.upstream)

    def notice_refusal(self, answer_head: bytes) -> None:
        """The upstream answered a request 400: when the plug-in said so (a
        signature, resize or version refusal), check again now rather than
        at the next interval."""
        if self.enabled and b"pixelwire" in answer_head:
            self._wake.set()

    # -- what the frontend answers ---------------------------------------------

    async def admit_images(self) -> None:
        """Raises the answer for a request with media while the sides
        disagree (or vLLM does not answer); a request that would be refused
        checks again first, so a fixed worker is served at once."""
        if not self.enabled or self.agrees:
            return
        await self.check(max_age=HANDSHAKE_RECHECK_AGE)
        if self._silent:
            # vLLM starts listening only once it is ready, so a look begun a
            # moment before this request may have found nothing where vLLM
            # answers now: "unreachable" comes only from a look begun after
            # the request came (a refused connection costs vLLM nothing).
            await self.check()
        if not self.reachable:
            raise OpenAIError(502, "the upstream is unreachable")
        if self.mismatches:
            raise OpenAIError(502, "; ".join(m.message for m in self.mismatches))

    async def health(self) -> tuple[int, dict[str, Any]]:
        """The frontend's GET /health: vLLM's own /health status (502 when
        it does not answer), and the handshake's last outcome."""
        answer = await self._get("/health")
        status = answer[0] if answer is not None else None
        body = {
            "upstream": {"reachable": status is not None, "health_status": status},
            "decode_at": self.config.decode_at,
            "handshake": {
                "checked": self.enabled,
                "checked_at": self.checked_at,
                "metrics_reachable": self.reachable,
                "plugin_seen": self.worker is not None,
                "connector": self.worker.connector if self.worker is not None else None,
                "agreement": self.agrees if self.enabled else None,
                "mismatches": [
                    {"setting": m.setting, "frontend": m.frontend, "worker": m.worker, "message": m.message}
                    for m in self.mismatches
                ],
            },
        }
        return (status if status is not None else 502), body
