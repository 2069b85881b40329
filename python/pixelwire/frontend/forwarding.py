"""Requests forwarded to the upstream vLLM and its answers relayed, a
stream included (:class:`Forwarder`): a redirect answered as is, a request
the upstream dropped unanswered on a pooled connection sent once more on a
fresh one, and the plug-in's answer asking for a resend
(:mod:`pixelwire.resend`) raised as :class:`ReadFailed` instead of relayed."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter
from yarl import URL

from pixelwire.frontend.errors import OpenAIError
from pixelwire.frontend.settings import FrontendConfig
from pixelwire.frontend.upstream_watch import UpstreamWatch, short_error
from pixelwire.resend import asks_for_resend

log = logging.getLogger("pixelwire.frontend")

# Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus the
# ones aiohttp recomputes for the new body.
_HOP_HEADERS = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
        "Content-Encoding",
    )
)
# How much of an upstream 400's body is kept to see whether the plug-in refused.
_REFUSAL_HEAD_BYTES = 8192


class Forwarder:
    """The frontend's two sessions to the upstream (pooled connections, and
    a fresh connection for each retry), open from :meth:`start` to
    :meth:`close`; an answer relayed counts in ``requests`` by route and
    status, and a refusal or 401 is told to the handshake's ``watch``."""

    def __init__(
        self,
        config: FrontendConfig,
        url: str,
        registry: CollectorRegistry,
        requests: Counter,
        watch: UpstreamWatch,
    ) -> None:
        self.config = config
        self.url = url
        self.requests = requests
        self.watch = watch
        self.calls = Counter(
            "pixelwire_frontend_upstream_requests",
            "Requests forwarded upstream (a retry on a fresh connection counts once)",
            registry=registry,
        )
        self.retries = Counter(
            "pixelwire_frontend_upstream_retries",
            "Requests sent again on a fresh connection after the upstream closed a pooled one unanswered",
            registry=registry,
        )
        self._session: aiohttp.ClientSession | None = None
        self._fresh_session: aiohttp.ClientSession | None = None

    def start(self) -> aiohttp.ClientSession:
        """Opens the sessions; returns the pooled one (the handshake's too)."""
        timeout = aiohttp.ClientTimeout(
            total=self.config.upstream_timeout, sock_connect=self.config.connect_timeout
        )
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        # A connection of its own for each retry (never a pooled one).
        self._fresh_session = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False, connector=aiohttp.TCPConnector(force_close=True)
        )
        return self._session

    async def close(self) -> None:
        for session in (self._session, self._fresh_session):
            if session is not None:
                await session.close()

    async def forward(
        self,
        request: web.Request,
        body: bytes,
        *,
        route: str,
        path: str | None = None,
        resend: bool = False,
        answered: Callable[[int], Awaitable[None]] | None = None,
    ) -> web.StreamResponse:
        """Sends the request upstream: to ``path`` (the canonical route the
        body was inspected for) when given, else to the path as the client
        spelt it. A redirect is answered as is, never followed. A request
        that fails on a pooled connection before any byte of the answer
        arrived (the upstream closed that connection: after another
        request's failure, uvicorn drops it) is sent once more, on a fresh
        connection; until an answer begins, the upstream has done nothing
        for it. With ``resend``, the plug-in's answer that it could not READ
        an image, or no longer held a resent one, raises :class:`ReadFailed`
        instead of going to the client. ``answered`` gets the status of the
        answer that is relayed, before it is."""
        assert self._session is not None and self._fresh_session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        target = request.raw_path
        if path is not None:
            query = request.rel_url.raw_query_string
            target = path + (f"?{query}" if query else "")
        url = URL(f"{self.url}{target}", encoded=True)
        self.calls.inc()
        try:
            return await self._relay(self._session, request, url, headers, body, route, resend, answered)
        except _StaleConnection as stale:
            log.info("upstream connection closed before answering %s (%s); sending it again", target, stale)
            self.retries.inc()
        try:
            return await self._relay(
                self._fresh_session, request, url, headers, body, route, resend, answered
            )
        except _StaleConnection as stale:
            log.warning("the upstream %s closed a fresh connection too: %s", self.url, stale)
            raise OpenAIError(502, "the upstream closed the connection without answering") from None

    async def _relay(
        self,
        session: aiohttp.ClientSession,
        request: web.Request,
        url: URL,
        headers: dict[str, str],
        body: bytes,
        route: str,
        resend: bool = False,
        answered: Callable[[int], Awaitable[None]] | None = None,
    ) -> web.StreamResponse:
        """One try of :meth:`forward`: raises :class:`_StaleConnection` when
        the connection closed before the answer began, and (with ``resend``)
        :class:`ReadFailed` for the plug-in's READ failure. Errors name
        "the upstream", not its address (the log has it)."""
        response: web.StreamResponse | None = None
        try:
            async with session.request(
                request.method, url, data=body, headers=headers, allow_redirects=False
            ) as upstream:
                head = bytearray()
                if upstream.status == 400:
                    # An error's JSON is small: its head is read before anything
                    # is sent, to tell the plug-in's READ failure.
                    while len(head) < _REFUSAL_HEAD_BYTES and not upstream.content.at_eof():
                        head += await upstream.content.read(_REFUSAL_HEAD_BYTES - len(head))
                    if resend and asks_for_resend(bytes(head)):
                        raise ReadFailed()
                if answered is not None:
                    await answered(upstream.status)
                out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
                if upstream.headers.get("Content-Encoding"):
                    out_headers["Content-Encoding"] = upstream.headers["Content-Encoding"]
                response = web.StreamResponse(
                    status=upstream.status, reason=upstream.reason, headers=out_headers
                )
                await response.prepare(request)
                if head:
                    await response.write(bytes(head))
                # Chunks are written as they arrive: SSE streams pass through live.
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                if upstream.status == 400:
                    self.watch.notice_refusal(bytes(head))
                elif upstream.status == 401:
                    self.watch.notice_unauthorized()
                self.requests.labels(route=route, status=str(upstream.status)).inc()
                return response
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as e:
            if response is not None and response.prepared:
                # Mid-stream: the status is sent, so the connection just ends.
                log.warning(
                    "upstream stream or client connection broke on %s: %s", request.rel_url, short_error(e)
                )
                raise
            if response is None and _closed_before_answering(e):
                raise _StaleConnection(short_error(e)) from None
            if isinstance(e, (TimeoutError, aiohttp.ServerTimeoutError)):
                log.warning("the upstream %s timed out on %s", self.url, request.rel_url)
                raise OpenAIError(504, "the upstream timed out") from None
            log.warning("the upstream %s is unreachable: %s", self.url, short_error(e))
            raise OpenAIError(502, f"the upstream is unreachable: {type(e).__name__}") from None


class _StaleConnection(Exception):
    """The upstream closed a connection before any byte of its answer."""


class ReadFailed(Exception):
    """The plug-in answered that it could not READ one of the request's
    images (:mod:`pixelwire.resend`): the answer was not relayed."""


def _closed_before_answering(error: BaseException) -> bool:
    """Whether ``error`` is a connection the upstream closed (or reset)
    before answering, rather than one that could not be made or a timeout."""
    if isinstance(error, aiohttp.ClientConnectorError):
        return False  # no connection was made: the upstream is down
    return isinstance(error, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError))
