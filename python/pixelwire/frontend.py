"""``pixelwire frontend``: an OpenAI-compatible reverse proxy in front of vLLM.

For ``POST /v1/chat/completions`` (and vLLM's other routes whose body is a
chat ``messages`` list: ``/tokenize``, ``/pooling``, ``/v1/embeddings``,
``/classify``) it decodes every image part concurrently into NIXL-registered
memory, swaps each URL for a (signed) descriptor reference that vLLM's
pixelwire media connector reads over NIXL, fetches every video and audio URL
through the same guard and hands vLLM the bytes, takes out every part's
client-chosen ``uuid`` (vLLM's cache key), forwards the request and streams
the answer back. Every other route passes through, except that a JSON body
holding a medium, a ``uuid`` media part or a ``pixelwire:`` reference is
refused there (vLLM would load such media itself, past this frontend's
guard). Upstream redirects are handed back, never followed. ``/metrics`` is
the frontend's own.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import json
import json.scanner
import logging
import posixpath
import re
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from yarl import URL

from pixelwire._native import (
    BlockedURL,
    DecodeError,
    FetchError,
    PixelwireError,
    PoolExhausted,
    UnsupportedFormat,
    probe_image,
)
from pixelwire.config import DECODED_MODES, FrontendConfig, Layout, Mode
from pixelwire.descriptor import Decoded, PassThrough
from pixelwire.fetch import Fetcher
from pixelwire.media_parts import MediaPart, MediaPartRefused, data_url_bytes, foreign_media, media_parts
from pixelwire.metrics import ImageMetrics
from pixelwire.publisher import Publisher
from pixelwire.signing import encode_reference

if TYPE_CHECKING:
    from pixelwire.resize import ResizePolicy

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
# The worker's plug-in exposes this gauge when vLLM runs it as its media connector.
_PLUGIN_ACTIVE = re.compile(r'^pixelwire_worker_info\{[^}]*connector="pixelwire"[^}]*\}\s+1(\.0)?\s*$', re.M)


class OpenAIError(Exception):
    """An error answered in OpenAI's error JSON."""

    def __init__(self, status: int, message: str, *, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = _KINDS.get(status, "InternalServerError")
        self.param = param

    def response(self) -> web.Response:
        body = {
            "error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}
        }
        headers = {"Retry-After": "1"} if self.status == 503 else None
        return web.json_response(body, status=self.status, headers=headers)


_KINDS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    413: "RequestEntityTooLargeError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


@dataclass(frozen=True)
class _Fetched:
    """An image part's encoded bytes, fetched to be decoded here, and when its fetch started."""

    data: bytes
    started: float


@dataclass
class _Budget:
    """What is left of a request's decoded pixels and pool bytes."""

    pixels: int
    pool_bytes: int


def _canonical_path(raw_path: str) -> str:
    """The route a path names, whatever its spelling: percent-decoded (as
    uvicorn does, %2F included, repeatedly so that no layer decodes more),
    dot segments removed and slashes merged (as some clients and proxies do),
    no trailing slash (FastAPI redirects there)."""
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    for _ in range(4):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    path = posixpath.normpath("/" + re.sub(r"/+", "/", path))
    return re.sub(r"/+", "/", path)


# Bodies up to this size are parsed by the C scanner on the loop (a few ms
# at worst); larger ones off it, by the Python scanner (see _loads).
_C_PARSE_BYTES = 256 * 1024
# Bodies with more JSON values than this (an upper bound, counted before
# parsing) are parsed, walked for media and written off the loop even when
# small: the walk is Python, ~1 us a value. A chat body of a few turns has
# hundreds.
_LOOP_VALUES = 4096


@dataclass(frozen=True)
class _Body:
    """A request's raw body and the bound on its JSON values."""

    raw: bytes
    values: int


# vLLM 0.32's routes whose body is a chat request (`messages`, parsed by
# chat_utils): rewritten and guarded like chat completions.
_REWRITTEN = {
    "/v1/chat/completions": "chat",
    "/tokenize": "tokenize",
    "/pooling": "pooling",
    "/v1/embeddings": "embeddings",
    "/classify": "classify",
}


def _bytes_url(data: bytes) -> str:
    """Encoded image bytes as a ``data:`` URL (vLLM's loader sniffs the format)."""
    return "data:application/octet-stream;base64," + base64.b64encode(data).decode("ascii")


def _image_settings(defaults: dict[str, Any], body: dict[str, Any]) -> tuple[Any, tuple[int, int, int]]:
    """(image_mode, rgba_background_color) the worker's vLLM will ask for:
    the server-wide defaults overridden by the request's media_io_kwargs."""
    settings = {"image_mode": "RGB", "rgba_background_color": [255, 255, 255], **defaults}
    kwargs = body.get("media_io_kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("image"), dict):
        settings.update(kwargs["image"])
    background = settings["rgba_background_color"]
    if not (
        isinstance(background, (list, tuple))
        and len(background) == 3
        and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in background)
    ):
        raise OpenAIError(
            400, "rgba_background_color must be a list of 3 integers in [0, 255]", param="media_io_kwargs"
        )
    return settings["image_mode"], (background[0], background[1], background[2])


def _media_error(part: MediaPart, error: BaseException) -> OpenAIError:
    medium = part.kind
    if isinstance(error, PoolExhausted):
        return OpenAIError(503, f"{part.where}: the frontend's image pool is full; retry shortly")
    if isinstance(error, BlockedURL):
        return OpenAIError(400, f"{part.where}: {medium} URL refused: {error}", param=part.where)
    if isinstance(error, FetchError):
        return OpenAIError(400, f"{part.where}: could not fetch the {medium}: {error}", param=part.where)
    if isinstance(error, DecodeError):
        return OpenAIError(400, f"{part.where}: could not decode the {medium}: {error}", param=part.where)
    if isinstance(error, (PixelwireError, ValueError)):
        return OpenAIError(400, f"{part.where}: {error}", param=part.where)
    log.error("unexpected error handling %s", part.where, exc_info=error)
    return OpenAIError(500, f"{part.where}: internal error handling the {medium}")


def _shipped_channels(mode: Mode, layout: Layout) -> int:
    """Bytes a pixel takes in the pool, as published."""
    return 4 if layout == "RGBX" or mode == "RGBA" else 3 if mode == "RGB" else 1


class Frontend:
    """The proxy's state: one Publisher, one upstream session, metrics."""

    def __init__(self, config: FrontendConfig) -> None:
        self.config = config
        self.upstream = config.upstream.rstrip("/")
        self.registry = CollectorRegistry()
        self.fetcher = Fetcher(allowed_domains=config.allowed_domains, allow_private=config.allow_private)
        self.publisher = Publisher(
            pool_bytes=config.pool_bytes,
            region_bytes=config.region_bytes,
            lease_seconds=config.lease_seconds,
            decode_at=config.decode_at,
            publish_threads=config.publish_threads,
            fetcher=self.fetcher,
        )
        self.metrics = ImageMetrics("frontend", self.registry, self._pool_bytes_in_use)
        self.pool_regions = Gauge(
            "pixelwire_frontend_pool_regions",
            "Registered regions in the frontend's pixel pool (it grows and gives way by regions)",
            registry=self.registry,
        )
        self.pool_regions.set_function(lambda: float(self._pool_stats().get("regions", 0)))
        self.requests = Counter(
            "pixelwire_frontend_requests",
            "Requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.upstream_calls = Counter(
            "pixelwire_frontend_upstream_requests", "Requests forwarded upstream", registry=self.registry
        )
        self.released = Counter(
            "pixelwire_frontend_released_at_request_end",
            "Images still held when their request ended (freed then, not by a notification)",
            registry=self.registry,
        )
        self.upstream_retries = Counter(
            "pixelwire_frontend_upstream_retries",
            "Requests sent again on a fresh connection after the upstream closed a pooled one unanswered",
            registry=self.registry,
        )
        self._api_key_digests = [hashlib.sha256(key.encode()).digest() for key in config.api_keys]
        self._session: aiohttp.ClientSession | None = None
        self._fresh_session: aiohttp.ClientSession | None = None
        self._plugin_seen = not (config.check_upstream and config.decode_at == "frontend")
        self._checker: asyncio.Task[None] | None = None

    def _pool_stats(self) -> dict[str, int]:
        if not self.publisher.is_open:  # worker mode never opens it
            return {}
        return self.publisher.stats()

    def _pool_bytes_in_use(self) -> float:
        return float(self._pool_stats().get("bytes_in_use", 0))

    # -- lifecycle -------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_request_bytes, middlewares=[_json_errors, self._authenticate]
        )
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_route("*", "/{tail:.*}", self.dispatch)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(
            total=self.config.upstream_timeout, sock_connect=self.config.connect_timeout
        )
        self._session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        # A connection of its own for each retry (never a pooled one).
        self._fresh_session = aiohttp.ClientSession(
            timeout=timeout, auto_decompress=False, connector=aiohttp.TCPConnector(force_close=True)
        )
        await asyncio.to_thread(self.publisher.open)
        if not self._plugin_seen:
            self._checker = asyncio.create_task(self._check_upstream())

    async def _stop(self, _app: web.Application) -> None:
        if self._checker is not None:
            self._checker.cancel()
        for session in (self._session, self._fresh_session):
            if session is not None:
                await session.close()
        await self.publisher.close()
        await self.fetcher.close()

    async def _check_upstream(self) -> None:
        """Until the upstream shows the pixelwire connector is active, warn:
        a vLLM without it would fail only at the first image."""
        warned = False
        while not (seen := await self._upstream_has_plugin()):
            if seen is False and not warned:
                warned = True
                log.error(
                    "upstream %s does NOT run the pixelwire media connector: start vLLM with "
                    "pixelwire installed and VLLM_MEDIA_CONNECTOR=pixelwire, or run this frontend with "
                    "--decode-at worker. Image requests are refused (502) until it does.",
                    self.upstream,
                )
            await asyncio.sleep(2.0)
        log.info("upstream %s runs the pixelwire media connector", self.upstream)

    async def _upstream_has_plugin(self) -> bool | None:
        """Whether the upstream's /metrics shows the connector active; None
        while the upstream does not answer (not up yet)."""
        assert self._session is not None
        try:
            async with self._session.get(
                f"{self.upstream}/metrics", timeout=aiohttp.ClientTimeout(total=5)
            ) as response:
                text = await response.text() if response.status == 200 else ""
        except (aiohttp.ClientError, TimeoutError):
            return None
        self._plugin_seen = bool(_PLUGIN_ACTIVE.search(text))
        return self._plugin_seen

    # -- routes ----------------------------------------------------------------

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

    async def metrics_page(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        if not request.raw_path.startswith("/"):
            # An absolute-form target (GET http://host/x) is for a forward
            # proxy, which this is not.
            refused = OpenAIError(400, "the request target must be a path (this is not a forward proxy)")
            return refused.response()
        path = _canonical_path(request.raw_path)
        route = _REWRITTEN.get(path)
        if route is not None and request.method == "POST":
            return await self.rewrite(request, path, route)
        return await self.passthrough(request, path)

    async def _read(self, request: web.Request) -> _Body:
        """The body, within --max-request-bytes (413 naming the limit) and
        --max-json-values (400)."""
        limit = self.config.max_request_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise OpenAIError(
                413, f"request body of {length} bytes is over the limit of {limit} bytes (max_request_bytes)"
            )
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise OpenAIError(
                413, f"request body is over the limit of {limit} bytes (max_request_bytes)"
            ) from None
        # Counting runs in C (bytes.count): only the body's size sends it off the loop.
        values = await self._off_loop(_Body(raw, 0), json_value_bound, raw)
        if values > self.config.max_json_values:
            raise OpenAIError(
                400,
                f"request body has up to {values} JSON values, over the limit of "
                f"{self.config.max_json_values} (max_json_values)",
            )
        return _Body(raw, values)

    async def _off_loop(self, body: _Body, work: Any, *args: Any) -> Any:
        """``work(*args)`` in a thread when the body is large or holds many
        values: parsing, walking or writing such a body on the event loop
        would stall every request."""
        if len(body.raw) > _C_PARSE_BYTES or body.values > _LOOP_VALUES:
            return await asyncio.to_thread(work, *args)
        return work(*args)

    async def passthrough(self, request: web.Request, path: str) -> web.StreamResponse:
        try:
            body = await self._read(request)
            where = await self._off_loop(body, _inspect_foreign, body.raw)
            if where is not None:
                raise OpenAIError(
                    400,
                    f"{where}: media are accepted only on the routes this frontend rewrites "
                    f"({', '.join(sorted(_REWRITTEN))}), not on {path}; pixelwire descriptors are "
                    "minted by the frontend, not sent by clients",
                    param=where,
                )
            return await self._forward(request, body.raw, route="other")
        except OpenAIError as e:
            self.requests.labels(route="other", status=str(e.status)).inc()
            return e.response()

    async def rewrite(self, request: web.Request, path: str, route: str) -> web.StreamResponse:
        published: list[Decoded] = []
        try:
            read = await self._read(request)
            body, parts = await self._off_loop(read, _inspect_chat, read.raw)
            self._check_caps(parts)
            if parts:
                if not self._plugin_seen:
                    seen = await self._upstream_has_plugin()
                    if seen is None:
                        raise OpenAIError(502, "the upstream is unreachable")
                    if not seen:
                        raise OpenAIError(
                            502,
                            "the upstream vLLM is not running the pixelwire media connector "
                            "(start it with VLLM_MEDIA_CONNECTOR=pixelwire and pixelwire installed)",
                        )
                await self._publish_parts(body, parts, published)
                payload: bytes = await self._off_loop(read, _dump, body)
            else:
                payload = read.raw  # nothing rewritten: the client's bytes, as sent
            return await self._forward(request, payload, route=route, path=path)
        except OpenAIError as e:
            self.requests.labels(route=route, status=str(e.status)).inc()
            return e.response()
        finally:
            # The request is over (answered, failed or its client went away):
            # whatever its worker did not read is freed now, not at lease end.
            for decoded in published:
                if self.publisher.release(decoded):
                    self.released.inc()

    def _check_caps(self, parts: list[MediaPart]) -> None:
        """The per-request caps that can be checked before any work."""
        limit = self.config.max_images_per_request
        if len(parts) > limit:
            raise OpenAIError(
                400,
                f"the request has {len(parts)} media parts, over the limit of {limit} per request "
                "(max_images_per_request)",
                param="messages",
            )
        encoded = sum(data_url_bytes(p.url) for p in parts)
        limit = self.config.max_image_bytes_per_request
        if encoded > limit:
            raise OpenAIError(
                400,
                f"the request's data: URLs hold {encoded} bytes of media, over the limit of {limit} "
                "bytes per request (max_image_bytes_per_request)",
                param="messages",
            )

    async def _publish_parts(self, body: dict[str, Any], parts: list[MediaPart], out: list[Decoded]) -> None:
        mode, background = _image_settings(self.config.image_kwargs, body)
        native = self.config.decode_at == "frontend" and mode in DECODED_MODES

        # A request with its own mm_processor_kwargs may change the
        # processor's size: its images ship at full resolution (within the
        # request's pixel and pool budget, checked before any decode).
        resize = self.config.resize if mode == "RGB" and "mm_processor_kwargs" not in body else None
        budget = _Budget(self.config.max_pixels_per_request, self.config.pool_bytes)

        encoded_limit = self.config.max_image_bytes_per_request
        fetched = 0
        over: list[OpenAIError] = []

        async def fetch(part: MediaPart) -> bytes:
            nonlocal fetched
            if over:
                raise over[0]
            data = await self.fetcher.fetch(part.url)
            fetched += len(data)
            if fetched > encoded_limit and not over:
                over.append(
                    OpenAIError(
                        400,
                        f"{part.where}: the request's media reach {fetched} encoded bytes, over the limit "
                        f"of {encoded_limit} bytes per request (max_image_bytes_per_request)",
                        param=part.where,
                    )
                )
            if over:
                raise over[0]
            return data

        async def one(part: MediaPart) -> str | _Fetched:
            """The part's new URL; for an image to decode here, its bytes."""
            if self.config.decode_at == "worker":
                # The worker fetches, with its own guard (vLLM's allowed
                # domains); refuse here what this one would refuse too.
                self.fetcher.check(part.url)
                if part.kind == "image":
                    self.metrics.handled("passthrough", 0)
                return part.url
            if part.kind != "image":
                # Video and audio: vLLM decodes them, from bytes fetched
                # here through this guard; a data: URL holds its bytes
                # already (and vLLM reads it without any fetch).
                if part.url[:5].lower() == "data:":
                    return part.url
                return _bytes_url(await fetch(part))
            started = perf_counter()
            data = await fetch(part)
            if not native:
                # A mode pixelwire does not decode: fetched here, through this
                # guard, and handed on as the bytes, never as a URL the worker
                # would fetch again (its answer could differ).
                self.metrics.handled("passthrough", 0)
                return _bytes_url(data)
            return _Fetched(data, started)

        # One request's fetches share a few connections, so a request full of
        # slow URLs cannot hold every pooled connection the others need.
        # Images are decoded in batches of those whose bytes have arrived:
        # a request of data: URLs is one batch; fetches still running go on
        # while a batch decodes, and what they bring is the next batch. The
        # first failure stops the rest (nothing more is decoded, fetches
        # still running are cancelled) and fails the request.
        results: list[str | _Fetched | BaseException | None] = [None] * len(parts)
        with self.fetcher.concurrency_limit(self.config.max_fetches_per_request):
            fetching = {asyncio.ensure_future(one(part)): index for index, part in enumerate(parts)}
            pending = set(fetching)
            try:
                while pending and not any(isinstance(r, BaseException) for r in results):
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        error = task.exception()
                        results[fetching[task]] = error if error is not None else task.result()
                    if any(isinstance(r, BaseException) for r in results):
                        break
                    batch = sorted((fetching[task], results[fetching[task]]) for task in done)
                    to_decode = [(index, item) for index, item in batch if isinstance(item, _Fetched)]
                    if to_decode:
                        self._spend(budget, [(parts[i], item) for i, item in to_decode], mode, resize)
                        await self._decode_fetched(to_decode, results, mode, background, resize, out)
            finally:
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.gather(*pending, return_exceptions=True)
        if over:
            raise over[0]
        self._raise_first_failure(parts, results)
        for part, result in zip(parts, results, strict=True):
            assert isinstance(result, str)
            part.holder[part.key] = result

    def _spend(
        self,
        budget: _Budget,
        fetched: list[tuple[MediaPart, _Fetched]],
        mode: Mode,
        resize: ResizePolicy | None,
    ) -> None:
        """Takes the images about to be decoded out of the request's budget,
        from their headers (no pixel memory yet): decoded pixels, and pool
        bytes at the size they ship. Over either, the request is refused
        before they are decoded. An image whose header cannot be read is
        left to the decode, which says why."""
        layout: Layout = "RGBX" if mode == "RGB" else "HWC"
        channels = _shipped_channels(mode, layout)
        for part, item in fetched:
            try:
                height, width = probe_image(item.data)["oriented_size"]
            except (PixelwireError, ValueError):
                continue
            budget.pixels -= height * width
            if budget.pixels < 0:
                limit = self.config.max_pixels_per_request
                raise OpenAIError(
                    400,
                    f"{part.where}: the request's images reach more than {limit} decoded pixels, the "
                    "limit per request (max_pixels_per_request)",
                    param=part.where,
                )
            shipped = resize.target(height, width) if resize is not None else (height, width)
            budget.pool_bytes -= shipped[0] * shipped[1] * channels
            if budget.pool_bytes < 0:
                raise OpenAIError(
                    400,
                    f"{part.where}: the request's images need more than the frontend's whole image pool "
                    f"({self.config.pool_bytes} bytes) at once, so it could never be served (pool_bytes)",
                    param=part.where,
                )

    async def _decode_fetched(
        self,
        fetched: list[tuple[int, _Fetched]],
        results: list[str | _Fetched | BaseException | None],
        mode: Mode,
        background: tuple[int, int, int],
        resize: ResizePolicy | None,
        out: list[Decoded],
    ) -> None:
        """Decodes and publishes the request's fetched images (each with its
        index in ``results``) in one batch on native threads, and puts each
        one's new URL, or its error, in its place. Everything published goes
        into ``out`` before any result is looked at, so whatever fails, the
        request's end releases every slot."""
        # vLLM wants PIL images: RGB goes in Pillow's layout, mapped not copied.
        layout: Layout = "RGBX" if mode == "RGB" else "HWC"
        outcomes = await self.publisher.decode_and_publish_many(
            [item.data for _, item in fetched], mode=mode, background=background, layout=layout, resize=resize
        )
        done = perf_counter()
        out.extend(outcome for outcome in outcomes if isinstance(outcome, Decoded))
        for (index, item), outcome in zip(fetched, outcomes, strict=True):
            assert not isinstance(outcome, PassThrough), "images are fetched only to be decoded here"
            if isinstance(outcome, UnsupportedFormat):
                # Not a format pixelwire decodes: the bytes already fetched go
                # on to the worker, whose plug-in hands them to vLLM's loader.
                self.metrics.handled("passthrough", 0)
                results[index] = _bytes_url(item.data)
            elif isinstance(outcome, Exception):
                results[index] = outcome
            else:
                # Fetch and decode, as the request waited for them.
                self.metrics.observe("nixl", done - item.started)
                # Bytes at the decoded size, in the layout shipped.
                source = outcome.resize["source"] if outcome.resize else outcome.shape[:2]
                at_source = outcome.size * source[0] * source[1] // (outcome.shape[0] * outcome.shape[1])
                self.metrics.handled("nixl", outcome.size, at_source)
                results[index] = encode_reference(outcome.to_dict(), self.config.secret)

    def _raise_first_failure(self, parts: list[MediaPart], results: list[Any]) -> None:
        """The request's answer when one of its media failed: the first one's error."""
        for part, result in zip(parts, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                self.metrics.failed(result)
                raise _media_error(part, result)

    async def _forward(
        self, request: web.Request, body: bytes, *, route: str, path: str | None = None
    ) -> web.StreamResponse:
        """Sends the request upstream: to ``path`` (the canonical route the
        body was inspected for) when given, else to the path as the client
        spelt it. A redirect is answered as is, never followed. A request
        that fails on a pooled connection before any byte of the answer
        arrived (the upstream closed that connection: after another
        request's failure, uvicorn drops it) is sent once more, on a fresh
        connection; until an answer begins, the upstream has done nothing
        for it."""
        assert self._session is not None and self._fresh_session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        target = request.raw_path
        if path is not None:
            query = request.rel_url.raw_query_string
            target = path + (f"?{query}" if query else "")
        url = URL(f"{self.upstream}{target}", encoded=True)
        self.upstream_calls.inc()
        try:
            return await self._relay(self._session, request, url, headers, body, route)
        except _StaleConnection as stale:
            log.info("upstream connection closed before answering %s (%r); sending it again", target, stale)
            self.upstream_retries.inc()
        try:
            return await self._relay(self._fresh_session, request, url, headers, body, route)
        except _StaleConnection as stale:
            log.warning("the upstream %s closed a fresh connection too: %r", self.upstream, stale)
            raise OpenAIError(502, "the upstream closed the connection without answering") from None

    async def _relay(
        self,
        session: aiohttp.ClientSession,
        request: web.Request,
        url: URL,
        headers: dict[str, str],
        body: bytes,
        route: str,
    ) -> web.StreamResponse:
        """One try of :meth:`_forward`: raises :class:`_StaleConnection` when
        the connection closed before the answer began. Errors name "the
        upstream", not its address (the log has it)."""
        response: web.StreamResponse | None = None
        try:
            async with session.request(
                request.method, url, data=body, headers=headers, allow_redirects=False
            ) as upstream:
                out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
                if upstream.headers.get("Content-Encoding"):
                    out_headers["Content-Encoding"] = upstream.headers["Content-Encoding"]
                response = web.StreamResponse(
                    status=upstream.status, reason=upstream.reason, headers=out_headers
                )
                await response.prepare(request)
                # Chunks are written as they arrive: SSE streams pass through live.
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                self.requests.labels(route=route, status=str(upstream.status)).inc()
                return response
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as e:
            if response is not None and response.prepared:
                # Mid-stream: the status is sent, so the connection just ends.
                log.warning("upstream stream or client connection broke on %s: %r", request.rel_url, e)
                raise
            if response is None and _closed_before_answering(e):
                raise _StaleConnection(repr(e)) from None
            if isinstance(e, (TimeoutError, aiohttp.ServerTimeoutError)):
                log.warning("the upstream %s timed out on %s", self.upstream, request.rel_url)
                raise OpenAIError(504, "the upstream timed out") from None
            log.warning("the upstream %s is unreachable: %r", self.upstream, e)
            raise OpenAIError(502, f"the upstream is unreachable: {type(e).__name__}") from None


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


class _StaleConnection(Exception):
    """The upstream closed a connection before any byte of its answer."""


def _closed_before_answering(error: BaseException) -> bool:
    """Whether ``error`` is a connection the upstream closed (or reset)
    before answering, rather than one that could not be made or a timeout."""
    if isinstance(error, aiohttp.ClientConnectorError):
        return False  # no connection was made: the upstream is down
    return isinstance(error, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError))


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def json_value_bound(raw: bytes) -> int:
    """An upper bound on the JSON values in ``raw``, without parsing it:
    every value but the outermost is an array element or an object member,
    and a container holds one more of those than its commas (bytes.count
    runs in C, ~1 GB/s)."""
    return 1 + raw.count(b"{") + raw.count(b"[") + raw.count(b",")


def _loads(raw: bytes) -> Any:
    """``json.loads(raw)``, with the pure-Python scanner for a large body:
    the C scanner never lets go of the GIL, so even in a thread a body of
    millions of tiny values would stall the event loop for seconds; the
    Python one does (strings, the bulk of a real body, are still scanned in C)."""
    if len(raw) <= _C_PARSE_BYTES:
        return json.loads(raw)
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    decoder = json.JSONDecoder()
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder.decode(text)


def _parse(raw: bytes) -> Any:
    try:
        return _loads(raw)
    except (ValueError, RecursionError) as e:
        raise OpenAIError(400, f"request body is not valid JSON: {e}") from None


def _inspect_chat(raw: bytes) -> tuple[dict[str, Any], list[MediaPart]]:
    """A chat-shaped body and its media parts, client uuids taken out (run
    off the loop when large). A medium or a descriptor outside ``messages``
    is refused: only the parts found here are guarded."""
    body = _parse(raw)
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    try:
        parts = media_parts(body)
    except MediaPartRefused as refused:
        raise OpenAIError(400, str(refused), param=refused.where) from None
    where = foreign_media({k: v for k, v in body.items() if k != "messages"})
    if where is not None:
        raise OpenAIError(
            400,
            f"{where}: media are accepted in messages[].content only; pixelwire descriptors are "
            "minted by the frontend, not sent by clients",
            param=where,
        )
    return body, parts


def _inspect_foreign(raw: bytes) -> str | None:
    """Where a passed-through JSON body holds a medium or a descriptor. A
    body that is not JSON passes untouched: vLLM parses JSON with the same
    json.loads, so it cannot read media out of it either."""
    if not raw.strip():
        return None
    try:
        body = _loads(raw)
    except RecursionError:
        # vLLM's parser might still take it: refuse what cannot be inspected.
        return "body (nested too deeply to inspect)"
    except ValueError:
        return None
    return foreign_media(body)


def _dump(body: dict[str, Any]) -> bytes:
    # Not one-shot: the Python encoder, which lets go of the GIL (see _loads).
    return "".join(json.JSONEncoder(separators=(",", ":")).iterencode(body)).encode()


def run(config: FrontendConfig, host: str, port: int) -> None:
    """Serves until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    # A client that goes away cancels its handler, which closes the upstream
    # request (vLLM aborts it) and frees the request's images at once.
    web.run_app(frontend.app(), host=host, port=port, print=None, access_log=None, handler_cancellation=True)
