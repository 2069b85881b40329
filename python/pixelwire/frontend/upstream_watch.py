"""The frontend's half of the start-up handshake: it reads the worker's
settings from vLLM's /metrics (:mod:`pixelwire.handshake` says what must
agree), asks vLLM whether it takes the frontend's API key, holds the
outcome, logs one line each time it changes, refuses image requests while
the two sides disagree (or the upstream cannot be checked), and shows the
state on the frontend's ``/health`` and metrics.

The worker's /metrics is the upstream's own, or the pages
``--upstream-metrics`` names where the upstream is a router or a load
balancer that does not pass vLLM's /metrics on; the API key is asked of
the upstream itself (GET /v1/models, which vLLM guards), the way clients'
requests go.

Checked at start, every ``HANDSHAKE_INTERVAL`` seconds while the sides
agree and every ``HANDSHAKE_RETRY`` while they do not (or vLLM does not
answer), at once when the plug-in refuses a request or vLLM answers 401,
and before an image request that would otherwise be refused, so a fixed
worker is seen at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Gauge
from yarl import URL

from pixelwire import __version__
from pixelwire.config import (
    HANDSHAKE_INTERVAL,
    HANDSHAKE_RECHECK_AGE,
    HANDSHAKE_RETRY,
    HANDSHAKE_TIMEOUT,
)
from pixelwire.frontend.errors import OpenAIError
from pixelwire.frontend.settings import FrontendConfig
from pixelwire.handshake import (
    SETTINGS,
    Mismatch,
    WorkerSettings,
    api_key_mismatches,
    metrics_problem,
    mismatches,
    worker_settings_in,
)

# The package's one logger: its name is what the frontend's log lines carry.
log = logging.getLogger("pixelwire.frontend")

# What vLLM guards with its --api-key (every /v1 route) and answers cheaply.
KEY_PROBE_PATH = "/v1/models"
# The handshake's requests say what they are (in vLLM's access log, say).
USER_AGENT = f"pixelwire-frontend/{__version__} (handshake)"
# How much of an error's text a log line keeps.
_ERROR_CHARS = 160


def upstream_url(url: str, option: str = "--upstream") -> str:
    """``url`` as the frontend uses it, its trailing ``/`` dropped; a
    ``ValueError`` naming ``option`` and the fix for what the frontend
    could not use: no ``http://`` or ``https://`` scheme, no host, a query
    or fragment, or (``--upstream`` only) an OpenAI base URL (a ``/v1`` in
    its path), under which the frontend would forward
    ``/v1/chat/completions`` to ``/v1/v1/chat/completions``."""
    parsed = URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        hint = f": give http://{url}" if "://" not in url else ""
        raise ValueError(f"{option} {url!r} is not an http:// or https:// URL with a host{hint}")
    if parsed.query_string or parsed.fragment:
        raise ValueError(f"{option} {url!r} has a query or fragment: give the server's address only")
    if option == "--upstream" and "v1" in parsed.path.split("/"):
        base = str(parsed.with_path("/")).rstrip("/")
        raise ValueError(
            f"--upstream {url!r} is an OpenAI base URL: give vLLM's server address, {base}, without /v1 "
            "(the frontend forwards each request's own path, /v1/chat/completions, to it)"
        )
    return url.rstrip("/")


def short_error(error: BaseException) -> str:
    """``Type: message`` of ``error``, cut to a log line's share."""
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= _ERROR_CHARS else text[: _ERROR_CHARS - 3] + "..."


@dataclass(frozen=True)
class _Look:
    """One look at one /metrics page: whether it answered (``error`` says
    why not), what the worker declared there, and why the page tells
    nothing of the worker (``problem``: not vLLM's)."""

    url: str
    answered: bool
    worker: WorkerSettings | None = None
    problem: str | None = None
    error: str | None = None


class UpstreamWatch:
    """The last handshake with the upstream vLLM. Until :meth:`start`, and
    with ``check_upstream`` off, nothing is checked and nothing refused."""

    def __init__(self, config: FrontendConfig, upstream: str, registry: CollectorRegistry) -> None:
        self.config = config
        self.upstream = upstream
        self.metrics_urls = [u.rstrip("/") for u in config.upstream_metrics] or [f"{upstream}/metrics"]
        self.enabled = config.check_upstream
        # The last check: whether every /metrics page answered as vLLM's,
        # what the worker declared there (None: no plug-in, or pages that
        # differ), why the upstream could not be checked, and where the
        # sides disagree.
        self.reachable = False
        self.worker: WorkerSettings | None = None
        self.problem: str | None = None
        self.mismatches: list[Mismatch] = []
        self.checked_at: float | None = None
        # When the recorded check began (monotonic), and whether a page sent
        # no answer to it (a refused or timed-out connection).
        self._checked_began = float("-inf")
        self._silent = True
        self._looks: list[_Look] = []
        self._logged: tuple[Any, ...] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._checking: asyncio.Task[None] | None = None
        self._loop: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.agreement = Gauge(
            "pixelwire_frontend_upstream_agreement",
            "1 while the last handshake found the upstream vLLM's pixelwire settings agreeing with this "
            "frontend's (image requests are served); 0 while they disagree, vLLM did not answer, or its "
            "/metrics could not be read",
            registry=registry,
        )
        self.mismatch = Gauge(
            "pixelwire_frontend_upstream_mismatch",
            "1 for each setting the last handshake found the upstream disagreeing on (image requests are "
            "refused with 502 while any is 1): connector, version, secret, unsigned, resize, private, "
            "processed, api_key",
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
        looks, keys = await asyncio.gather(
            asyncio.gather(*(self._look(url) for url in self.metrics_urls)), self._key_mismatches()
        )
        self._looks = list(looks)
        self._silent = any(not look.answered for look in looks)
        self.problem = self._problem(looks)
        self.reachable = self.problem is None
        workers = {look.worker for look in looks}
        self.worker = looks[0].worker if len(workers) == 1 else None
        found: list[Mismatch] = []
        if self.reachable:
            for look in looks:
                found += mismatches(self.config, look.worker, __version__)
            found += keys
        # Several vLLM servers disagreeing alike are one disagreement.
        self.mismatches = list(dict.fromkeys(found))
        self.checked_at = time.time()
        self._checked_began = began
        self.agreement.set(1 if self.agrees else 0)
        settings = {m.setting for m in self.mismatches}
        for setting in SETTINGS:
            self.mismatch.labels(setting=setting).set(1 if setting in settings else 0)
        self._log_change()

    def _problem(self, looks: list[_Look]) -> str | None:
        """Why the worker's settings could not be read (the answer image
        requests get), or None."""
        if any(not look.answered for look in looks):
            return "the upstream is unreachable: it does not answer (vLLM answers once its model is loaded)"
        for look in looks:
            if look.problem is not None:
                return look.problem
        return None

    async def _look(self, url: str) -> _Look:
        try:
            answer = await self._get(url)
        except _NoAnswer as silent:
            return _Look(url, answered=False, error=str(silent))
        status, text = answer
        problem = metrics_problem(status, text)
        worker = worker_settings_in(text) if problem is None else None
        return _Look(url, answered=True, worker=worker, problem=problem)

    async def _key_mismatches(self) -> list[Mismatch]:
        """Whether vLLM takes this frontend's API keys, or wants one where
        the frontend has none: asked of the upstream, as clients' requests
        go. An upstream that does not answer, or answers anything but 401
        (a router without the route: 404), disagrees on nothing here."""
        keys = self.config.api_keys
        headers = [{"Authorization": f"Bearer {key}"} for key in keys] or [{}]
        statuses = await asyncio.gather(
            *(self._status(f"{self.upstream}{KEY_PROBE_PATH}", h) for h in headers)
        )
        refused = sum(1 for status in statuses if status == 401)
        return api_key_mismatches(len(keys), not keys and refused > 0, refused if keys else 0)

    async def _status(self, url: str, headers: dict[str, str]) -> int | None:
        try:
            return (await self._get(url, headers))[0]
        except _NoAnswer:
            return None

    async def _get(self, url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
        """(status, body) of GET ``url``, redirects not followed, within the
        handshake's timeout; :class:`_NoAnswer` when it does not answer."""
        assert self._session is not None
        try:
            async with self._session.get(
                url,
                headers={"User-Agent": USER_AGENT, **(headers or {})},
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=HANDSHAKE_TIMEOUT),
            ) as response:
                return response.status, await response.text(errors="replace")
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _NoAnswer(short_error(error)) from None

    def _log_change(self) -> None:
        """One line each time the outcome changes, none while it stays; the
        first outcome is logged too, so a mistake shows at start."""
        state = (self.problem, tuple(self.mismatches))
        if state == self._logged:
            return
        self._logged = state
        where = ", ".join(look.url for look in self._looks)
        if self._silent:
            errors = "; ".join(f"{look.url}: {look.error}" for look in self._looks if look.error)
            log.warning(
                "the upstream does not answer GET /metrics (%s): image requests are refused (502) until "
                "it does (vLLM answers once its model is loaded)",
                errors,
            )
        elif self.problem is not None:
            log.error("%s: %s; image requests are refused (502) until it is fixed", where, self.problem)
        elif self.mismatches:
            log.error(
                "upstream %s disagrees with this frontend; image requests are refused (502) until it "
                "agrees: %s",
                where,
                "; ".join(m.message for m in self.mismatches),
            )
        else:
            log.info("upstream %s runs the pixelwire media connector and agrees with this frontend", where)

    def notice_refusal(self, answer_head: bytes) -> None:
        """The upstream answered a request 400: when the plug-in said so (a
        signature, resize or version refusal), check again now rather than
        at the next interval."""
        if self.enabled and b"pixelwire" in answer_head:
            self._wake.set()

    def notice_unauthorized(self) -> None:
        """The upstream answered a request 401: its API keys may have
        changed, so check again now."""
        if self.enabled:
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
        if self.problem is not None:
            raise OpenAIError(502, self.problem)
        if self.mismatches:
            raise OpenAIError(502, "; ".join(m.message for m in self.mismatches))

    async def health(self) -> tuple[int, dict[str, Any]]:
        """The frontend's GET /health: vLLM's own /health status (502 when
        it does not answer), and the handshake's last outcome."""
        status = await self._status(f"{self.upstream}/health", {})
        body = {
            "upstream": {"reachable": status is not None, "health_status": status},
            "decode_at": self.config.decode_at,
            "handshake": {
                "checked": self.enabled,
                "checked_at": self.checked_at,
                "metrics_reachable": self.reachable,
                "problem": self.problem,
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


class _NoAnswer(Exception):
    """A GET upstream got no HTTP answer (refused, reset, timed out); the
    message says which, briefly."""
