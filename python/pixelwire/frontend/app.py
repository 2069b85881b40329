"""The aiohttp application: routes, authentication, the answers the
frontend makes itself (``/metrics``, ``GET /health``), the frontend's
metrics, and :func:`run`; requests go on to the upstream vLLM, and its
answers come back, through :mod:`~pixelwire.frontend.forwarding`, and a
request sent again is counted in :mod:`~pixelwire.frontend.resend_record`. Image requests pass the handshake
(:class:`~pixelwire.frontend.upstream_watch.UpstreamWatch`) first.

Chat-shaped routes (:data:`~pixelwire.frontend.inspect.REWRITTEN_ROUTES`)
have their media handled by a :class:`~pixelwire.frontend.pipeline.MediaPipeline`
before the request goes on; every other route passes through, once its body
is known to hold no medium and no descriptor.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import logging
from time import perf_counter
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from pixelwire.config import ACCEPT_BATCH, LISTEN_BACKLOG
from pixelwire.fetch import Fetcher
from pixelwire.fetch.addresses import DEPLOYMENT_PRIVATE_HINT
from pixelwire.frontend import nixl_interfaces
from pixelwire.frontend.accept import FairAccept
from pixelwire.frontend.access_log import access_log, note_media
from pixelwire.frontend.connections import (
    BodyTooSlow,
    ConnectionGuard,
    ConnectionLimits,
    make_room_for_connections,
)
from pixelwire.frontend.drain import Drain
from pixelwire.frontend.errors import OpenAIError
from pixelwire.frontend.forwarding import Forwarder, ReadFailed
from pixelwire.frontend.inspect import (
    REWRITTEN_ROUTES,
    RequestBody,
    canonical_path,
    check_caps,
    check_request_kwargs,
    dump_json,
    inspect_chat,
    inspect_foreign,
    scan_body,
)
from pixelwire.frontend.pipeline import MediaPipeline
from pixelwire.frontend.resend_record import ResendRecord
from pixelwire.frontend.settings import FrontendConfig
from pixelwire.frontend.upstream_watch import UpstreamWatch
from pixelwire.metrics import CacheMetrics, MediaMetrics
from pixelwire.publisher import Publisher

# The package's one logger: its name is what the frontend's log lines carry.
log = logging.getLogger("pixelwire.frontend")

# Request seconds, from the request's arrival to the end of its answer.
_REQUEST_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Frontend:
    """The proxy's state: one Publisher, one upstream session, metrics."""

    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.upstream = config.upstream.rstrip("/")
        self.registry = CollectorRegistry()
        self.fetcher = Fetcher(
            allowed_domains=config.allowed_domains,
            allow_private=config.allow_private,
            private_hint=DEPLOYMENT_PRIVATE_HINT,
        )
        self.publisher = Publisher(config.publisher, fetcher=self.fetcher)
        self.cache_metrics = CacheMetrics(self.registry, self._pool_stats)
        self.metrics = MediaMetrics(
            "frontend", self.registry, self._pool_bytes_in_use, lambda: float(config.publisher.pool_bytes)
        )
        self.pool_regions = Gauge(
            "pixelwire_frontend_pool_regions",
            "Registered regions in the frontend's pixel pool (it grows and gives way by regions)",
            registry=self.registry,
        )
        self.pool_regions.set_function(lambda: float(self._pool_stats().get("regions", 0)))
        self.requests = Counter(
            "pixelwire_frontend_requests",
            "Requests answered, by route and status (the upstream's status for a forwarded request)",
            ["route", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "pixelwire_frontend_request_seconds",
            "Seconds from a request's arrival to the end of its answer (a stream's last byte), by route",
            ["route"],
            buckets=_REQUEST_SECONDS,
            registry=self.registry,
        )
        self.refused_upstream = Counter(
            "pixelwire_frontend_images_refused_upstream",
            "Images sent upstream in requests the upstream answered 4xx (the worker refused them, or "
            "the whole request: either way they went unused), by path as in pixelwire_frontend_images",
            ["path"],
            registry=self.registry,
        )
        # Shown at 0 from the start, for alerts on its rate to have a series.
        for path in ("nixl", "passthrough"):
            self.refused_upstream.labels(path=path)
        self.released = Counter(
            "pixelwire_frontend_released_at_request_end",
            "Images still held when their request ended (freed then, not by a notification)",
            registry=self.registry,
        )
        self.resend = ResendRecord(config, self.registry)
        connections_closed = Counter(
            "pixelwire_frontend_connections_closed",
            "Client connections the frontend closed itself, by reason: over max_connections or "
            "max_connections_per_client (at once), header_timeout (no request head in time), "
            "body_too_slow (a body under min_body_rate: answered 408)",
            ["reason"],
            registry=self.registry,
        )
        self.connections = ConnectionGuard(
            ConnectionLimits(
                max_connections=config.max_connections,
                max_connections_per_client=config.max_connections_per_client,
                header_timeout=config.header_timeout,
                min_body_rate=config.min_body_rate,
            ),
            on_closed=lambda reason: connections_closed.labels(reason=reason).inc(),
        )
        open_connections = Gauge(
            "pixelwire_frontend_connections", "Client connections open now", registry=self.registry
        )
        open_connections.set_function(lambda: float(self.connections.open_connections))
        self._api_key_digests = [hashlib.sha256(key.encode()).digest() for key in config.api_keys]
        self.watch = UpstreamWatch(config, self.upstream, self.registry)
        self.forwarder = Forwarder(config, self.upstream, self.registry, self.requests, self.watch)
        self.drain = Drain(config.drain_seconds)
        draining = Gauge(
            "pixelwire_frontend_draining",
            "1 from SIGTERM on: /health answers 503 and the frontend stops once its requests finish",
            registry=self.registry,
        )
        draining.set_function(lambda: float(self.drain.draining))

    def _pool_stats(self) -> dict[str, int]:
        if not self.publisher.is_open:  # worker mode never opens it
            return {}
        return self.publisher.stats()

    def _pool_bytes_in_use(self) -> float:
        return float(self._pool_stats().get("bytes_in_use", 0))

    # -- lifecycle -------------------------------------------------------------

    def app(self) -> web.Application:
        # The access log outermost: it sees every answer as sent, a 401 too.
        logged = [access_log] if self.config.access_log else []
        app = web.Application(
            client_max_size=self.config.max_request_bytes,
            middlewares=[self._timed_heads, *logged, _json_errors, self._authenticate],
        )
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/health", self.health)
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        app.on_response_prepare.append(self._close_while_draining)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        # First: a publisher that cannot open leaves no session unclosed.
        await asyncio.to_thread(self.publisher.open)
        self.watch.start(self.forwarder.start())
        self.connections.start()

    async def _stop(self, _app: web.Application) -> None:
        await self.connections.stop()
        await self.watch.stop()
        await self.forwarder.close()
        await self.publisher.close()
        await self.fetcher.close()

    # -- routes ----------------------------------------------------------------

    @web.middleware
    async def _timed_heads(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """A request's head has arrived: its connection's head deadline is
        off until the answer is out (pixelwire.frontend.connections), and
        it is in flight for the drain, unless it is the frontend's own
        /health or /metrics (a load balancer's probes keep no drain going)."""
        own = request.method == "GET" and request.path in ("/metrics", "/health")
        self.connections.request_started(request.transport)
        if not own:
            self.drain.request_started()
        try:
            answer: web.StreamResponse = await handler(request)
            return answer
        finally:
            self.connections.request_ended(request.transport)
            if not own:
                self.drain.request_ended()

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """With API keys set, a request without one of them as its Bearer
        token is answered 401 before its body is read: an unauthenticated
        client costs no fetch, decode or slot. The frontend's own /metrics,
        a GET of /health (load balancers' probes) and OPTIONS are exempt."""
        keys = self._api_key_digests
        exempt = request.method == "OPTIONS" or (
            request.method == "GET" and request.path in ("/metrics", "/health")
        )
        if keys and not exempt:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            digest = hashlib.sha256(token.encode()).digest()
            matched = False
            for key in keys:
                matched |= hmac.compare_digest(digest, key)
            if scheme.lower() != "bearer" or not matched:
                self.requests.labels(route="unauthenticated", status="401").inc()
                response = OpenAIError(
                    401, "a valid API key is required (Authorization: Bearer ...)"
                ).response()
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
        answer: web.StreamResponse = await handler(request)
        return answer

    async def _close_while_draining(self, _request: web.Request, response: web.StreamResponse) -> None:
        """While draining, every answer closes its connection (decided as
        its headers go out): a client or load balancer sends its next
        request elsewhere."""
        if self.drain.draining:
            response.force_close()
            response.headers["Connection"] = "close"

    async def metrics_page(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(self, _request: web.Request) -> web.Response:
        """Answered here, not forwarded: vLLM's own /health status (so a
        probe sees what it saw before), with the handshake's state as JSON;
        503 ``{"draining": true}`` once SIGTERM started a drain."""
        if self.drain.draining:
            return web.json_response({"draining": True}, status=503)
        status, body = await self.watch.health()
        return web.json_response(body, status=status)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        if not request.raw_path.startswith("/"):
            # An absolute-form target (GET http://host/x) is for a forward
            # proxy, which this is not.
            refused = OpenAIError(400, "the request target must be a path (this is not a forward proxy)")
            return refused.response()
        path = canonical_path(request.raw_path)
        route = REWRITTEN_ROUTES.get(path)
        if route is not None and request.method == "POST":
            return await self.rewrite(request, path, route)
        if request.method == "OPTIONS":
            return await self.options(request)
        return await self.passthrough(request, path)

    async def options(self, request: web.Request) -> web.StreamResponse:
        """An OPTIONS request (a CORS preflight; exempt from the API key)
        goes on without its body, which is never read: when it declares one,
        the connection closes once the answer is written, instead of taking
        the body in."""
        started = perf_counter()
        try:
            response = await self.forwarder.forward(request, b"", route="other")
        except OpenAIError as e:
            self.requests.labels(route="other", status=str(e.status)).inc()
            response = e.response()
            await response.prepare(request)
            await response.write_eof()
        finally:
            self.request_seconds.labels(route="other").observe(perf_counter() - started)
        if request.body_exists:
            # The answer is written: closing flushes it, and reads nothing more.
            request.protocol.force_close()
        return response

    async def _read(self, request: web.Request) -> RequestBody:
        """The body, within --max-request-bytes (413 naming the limit) and
        --max-json-values (400)."""
        limit = self.config.max_request_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise OpenAIError(
                413, f"request body of {length} bytes is over the limit of {limit} bytes (max_request_bytes)"
            )
        # Gathered and joined once: aiohttp's request.read() grows a
        # bytearray and copies it into bytes again, two passes over a body
        # of megabytes of base64.
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in self.connections.body(request.content):
                size += len(chunk)
                if size > limit:
                    raise OpenAIError(
                        413, f"request body is over the limit of {limit} bytes (max_request_bytes)"
                    )
                chunks.append(chunk)
        except BodyTooSlow as slow:
            raise OpenAIError(408, str(slow), close=True) from None
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        # The scan is native: only the body's size sends it off the loop.
        read: RequestBody = await self._off_loop(RequestBody(raw, 0), scan_body, raw)
        values = read.values
        if values > self.config.max_json_values:
            raise OpenAIError(
                400,
                f"request body has up to {values} JSON values, over the limit of "
                f"{self.config.max_json_values} (max_json_values)",
            )
        return read

    async def _off_loop(self, body: RequestBody, work: Any, *args: Any) -> Any:
        """``work(*args)`` in a thread when the body belongs off the loop
        (:attr:`RequestBody.off_loop`), else here."""
        if body.off_loop:
            return await asyncio.to_thread(work, *args)
        return work(*args)

    async def passthrough(self, request: web.Request, path: str) -> web.StreamResponse:
        started = perf_counter()
        try:
            body = await self._read(request)
            where = await self._off_loop(body, inspect_foreign, body.raw)
            if where is not None:
                raise OpenAIError(
                    400,
                    f"{where}: media are accepted only on the routes this frontend rewrites "
                    f"({', '.join(sorted(REWRITTEN_ROUTES))}), not on {path}; pixelwire descriptors are "
                    "minted by the frontend, not sent by clients",
                    param=where,
                )
            return await self.forwarder.forward(request, body.raw, route="other")
        except OpenAIError as e:
            self.requests.labels(route="other", status=str(e.status)).inc()
            return e.response()
        finally:
            self.request_seconds.labels(route="other").observe(perf_counter() - started)

    async def rewrite(self, request: web.Request, path: str, route: str) -> web.StreamResponse:
        started = perf_counter()
        pipelines: list[MediaPipeline] = []
        try:
            read = await self._read(request)
            answer: web.StreamResponse | None = None
            # A second try only after the plug-in's READ failure (pixelwire.resend).
            for last_try in (False, True):
                body, parts = await self._off_loop(read, inspect_chat, read)
                note_media(len(parts))
                check_caps(self.config, parts)
                pipeline: MediaPipeline | None = None
                if parts:
                    check_request_kwargs(self.config, body)
                    # Refused while the worker's settings disagree with ours.
                    await self.watch.admit_images()
                    pipeline = MediaPipeline(
                        self.config,
                        self.fetcher,
                        self.publisher,
                        self.metrics,
                        body,
                        parts,
                        sent=None if last_try else self.resend.for_request(self.watch.worker),
                        client=request.remote or "?",
                    )
                    pipelines.append(pipeline)
                    await pipeline.run()
                    payload: bytes = await self._off_loop(read, dump_json, body, read)
                else:
                    payload = read.raw  # nothing rewritten: the client's bytes, as sent
                resend = pipeline is not None and not last_try
                digests = self.resend.digests(pipeline, self.watch.worker) if pipeline is not None else None
                try:
                    answer = await self.forwarder.forward(
                        request,
                        payload,
                        route=route,
                        path=path,
                        resend=resend,
                        answered=functools.partial(self.resend.answered, pipeline, digests),
                    )
                except ReadFailed:
                    assert pipeline is not None
                    self.resend.resending(pipeline, path)
                    self._release(pipeline)
                    continue
                if pipeline is not None and 400 <= answer.status < 500:
                    self._count_refused(pipeline)
                break
            assert answer is not None
            return answer
        except OpenAIError as e:
            self.requests.labels(route=route, status=str(e.status)).inc()
            return e.response()
        finally:
            self.request_seconds.labels(route=route).observe(perf_counter() - started)
            # The request is over (answered, failed or its client went away):
            # whatever its worker did not read is freed now, not at lease end.
            for pipeline in pipelines:
                self._release(pipeline)

    def _release(self, pipeline: MediaPipeline) -> None:
        for decoded in pipeline.published:
            if self.publisher.release(decoded):
                self.released.inc()
        pipeline.published.clear()

    def _count_refused(self, pipeline: MediaPipeline) -> None:
        """The upstream answered 4xx to a request whose images went with it:
        they count as refused, by the path they went."""
        images = sum(1 for part in pipeline.parts if part.kind == "image")
        published = len(pipeline.published)
        if published:
            self.refused_upstream.labels(path="nixl").inc(published)
        if images > published:
            self.refused_upstream.labels(path="passthrough").inc(images - published)


@web.middleware
async def _json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Every answer the frontend makes itself is OpenAI's error JSON, an
    unexpected failure too (aiohttp's own would be a plain-text 500)."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return OpenAIError(e.status, e.reason).response()
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.raw_path[:200])
        return OpenAIError(500, "internal error in the frontend").response()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(config: FrontendConfig, host: str, port: int) -> None:
    """Serves until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    devices = nixl_interfaces.apply(config.nixl_devices)
    make_room_for_connections(config.max_connections)
    frontend = Frontend(config)
    log.info(
        "pixelwire frontend on http://%s:%d -> %s (decode at %s, signing %s, resize %s)",
        host,
        port,
        config.upstream,
        config.decode_at,
        "on" if config.secret else "off",
        config.resize.identity if config.resize else "off",
    )
    log.info("NIXL listens on %s (UCX_NET_DEVICES)", devices or "every network device")
    if config.upstream_metrics:
        log.info("the handshake reads the worker's settings from %s", ", ".join(config.upstream_metrics))
    if config.decode_at == "frontend":
        loader = config.video_kwargs.get("video_backend") or config.video_loader
        if loader is None:
            log.info(
                "videos: handed on to vLLM's loader as their bytes (the frontend cannot tell how vLLM "
                "samples this model's videos: give it --model, or --media-io-kwargs "
                '\'{"video": {"video_backend": ...}}\' as vLLM\'s)'
            )
        else:
            log.info("videos: sampled and decoded here as vLLM's %s loader samples them", loader)
    if not config.secret and config.decode_at == "frontend":
        log.warning(
            "PIXELWIRE_SECRET is unset: this frontend mints UNSIGNED descriptor references, which the "
            "vLLM plug-in refuses (400) unless it runs with PIXELWIRE_ALLOW_UNSIGNED=1 on a trusted "
            "network; set the same PIXELWIRE_SECRET on both sides"
        )
    if not config.api_keys and not _loopback(host):
        log.warning(
            "no API key: this frontend listens on %s and serves anyone who reaches it (it fetches, "
            "decodes and holds their images); set --api-key or VLLM_API_KEY (the same key as vLLM's), "
            "or listen on 127.0.0.1 behind your own gateway",
            host,
        )
    asyncio.run(_serve(frontend, host, port))


async def _serve(frontend: Frontend, host: str, port: int) -> None:
    """Serves until SIGTERM's drain (:mod:`pixelwire.frontend.drain`) or
    SIGINT ends; then stops listening and lets the requests in flight
    finish (within the upstream timeout) before the publisher closes."""
    # A client that goes away cancels its handler, which closes the upstream
    # request (vLLM aborts it) and frees the request's images at once.
    runner = web.AppRunner(
        frontend.app(),
        handle_signals=False,
        access_log=None,
        handler_cancellation=True,
        shutdown_timeout=frontend.config.upstream_timeout,
    )
    await runner.setup()
    frontend.drain.install()
    listening: asyncio.Server | None = None
    accepting: FairAccept | None = None
    try:
        # aiohttp's own site, with each connection admitted and timed by
        # the frontend's guard (pixelwire.frontend.connections).
        assert runner.server is not None
        factory = frontend.connections.protocol_factory(runner.server)
        # The frontend's own accept loop (pixelwire.frontend.accept) on
        # asyncio's listening sockets, which asyncio itself never serves.
        listening = await asyncio.get_running_loop().create_server(
            factory, host, port, reuse_address=True, start_serving=False
        )
        listeners = [listener.dup() for listener in listening.sockets]
        for listener in listeners:
            listener.listen(LISTEN_BACKLOG)
        guard = frontend.connections
        accepting = FairAccept(
            listeners, factory, guard.held, guard.refuses, ACCEPT_BATCH, most_waiting=LISTEN_BACKLOG
        )
        accepting.start()
        await frontend.drain.wait()
        log.info("stopped listening; waiting for the requests in flight")
    finally:
        if accepting is not None:
            accepting.close()
            for listener in accepting.listeners:
                listener.close()
        if listening is not None:
            listening.close()
        await runner.cleanup()
        frontend.drain.remove()
    log.info("stopped")
