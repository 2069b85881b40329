"""The fetch tests' HTTP server, and a fetcher that may reach it.

Every test drives its coroutine with ``asyncio.run`` (no pytest-asyncio), so a
fixture cannot start the server outside the test's event loop: ``serve`` hands
out the factory, and ``async with serve() as server`` starts an aiohttp server
on 127.0.0.1 on a free port inside it. The server keeps an access log (the
path and query of every request that reached it) which the tests inspect.
Fetchers that must reach the server use ``allow_private=True`` (the
``open_fetcher`` factory); the SSRF tests use the default guard.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from pixelwire.fetch import Fetcher

from reference import CORPUS

CONTENT_TYPES = {".jpg": "image/jpeg", ".png": "image/png", ".webp": "image/webp", ".gif": "image/gif"}
MIB = 1 << 20


class Server:
    """An aiohttp app on 127.0.0.1 with the endpoints the tests need and an access log."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.peers: set[Any] = set()
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay = 0.0
        self.port = 0
        # What streaming handlers managed to send before they ended.
        self.sent: dict[str, int] = {}
        self.completed: dict[str, bool] = {}
        self.finished: dict[str, asyncio.Event] = {}
        self.ports: list[int] = []  # every port the server listens on, ``port`` first
        self.trickling = 0  # /trickle responses being sent now
        self.hits: dict[str, int] = {}  # requests per path, for the endpoints that fail at first

    def url(self, path: str, host: str = "127.0.0.1", port: int | None = None) -> str:
        return f"http://{host}:{self.port if port is None else port}{path}"

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        self.log.append(request.path_qs)
        if request.transport is not None:
            self.peers.add(request.transport.get_extra_info("peername"))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            return await handler(request)
        finally:
            self.in_flight -= 1

    @staticmethod
    def _file(request: web.Request) -> tuple[bytes, str]:
        name = request.match_info["name"]
        path = CORPUS / name
        return path.read_bytes(), CONTENT_TYPES.get(path.suffix, "application/octet-stream")

    async def image(self, request: web.Request) -> web.StreamResponse:
        data, content_type = self._file(request)
        return web.Response(body=data, content_type=content_type)

    async def wrong_type(self, request: web.Request) -> web.StreamResponse:
        data, _ = self._file(request)
        return web.Response(body=data, content_type="text/html")

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        data, content_type = self._file(request)
        response = web.StreamResponse(headers={"Content-Type": content_type})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(data), 7000):
            await response.write(data[start : start + 7000])
            await asyncio.sleep(0)
        await response.write_eof()
        return response

    async def encoded(self, request: web.Request) -> web.StreamResponse:
        data, content_type = self._file(request)
        kind = request.match_info["encoding"]
        if kind == "gzip":
            body, encoding = gzip.compress(data), "gzip"
        elif kind == "gzip2":  # two concatenated gzip members
            half = len(data) // 2
            body, encoding = gzip.compress(data[:half]) + gzip.compress(data[half:]), "gzip"
        elif kind == "deflate":
            body, encoding = zlib.compress(data), "deflate"
        else:  # raw deflate, sent as "deflate" by some servers
            compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
            body, encoding = compressor.compress(data) + compressor.flush(), "deflate"
        return web.Response(body=body, headers={"Content-Type": content_type, "Content-Encoding": encoding})

    async def status(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=int(request.match_info["code"]), text="no")

    async def flaky(self, request: web.Request) -> web.StreamResponse:
        """``/flaky/{code}/{n}``: answers ``code`` to the first ``n`` requests, then hopper.png."""
        hits = self.hits[request.path] = self.hits.get(request.path, 0) + 1
        if hits <= int(request.match_info["n"]):
            return web.Response(status=int(request.match_info["code"]), text="not now")
        return web.Response(body=(CORPUS / "hopper.png").read_bytes(), content_type="image/png")

    async def late_once(self, request: web.Request) -> web.StreamResponse:
        """``/late-once/{seconds}``: the first answer comes after ``seconds``, later ones at once."""
        hits = self.hits[request.path] = self.hits.get(request.path, 0) + 1
        if hits == 1:
            await asyncio.sleep(float(request.match_info["seconds"]))
        return web.Response(body=(CORPUS / "hopper.png").read_bytes(), content_type="image/png")

    async def redirect_chain(self, request: web.Request) -> web.StreamResponse:
        left = int(request.match_info["n"])
        if left == 0:
            return web.Response(body=(CORPUS / "hopper.png").read_bytes(), content_type="image/png")
        raise web.HTTPFound(f"/redirect/{left - 1}")

    async def redirect_to(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(request.query["url"])

    async def secret(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="the SSRF guard let a request through")

    async def _stream(
        self, request: web.Request, key: str, total: int, chunk: bytes, pause: float, declare: bool
    ) -> web.StreamResponse:
        headers = {"Content-Type": "image/png"}
        if declare:
            headers["Content-Length"] = str(total)
        response = web.StreamResponse(headers=headers)
        self.sent[key] = 0
        self.completed[key] = False
        event = self.finished.setdefault(key, asyncio.Event())
        try:
            await response.prepare(request)
            while self.sent[key] < total:
                await response.write(chunk)
                self.sent[key] += len(chunk)
                if pause:
                    await asyncio.sleep(pause)
            await response.write_eof()
            self.completed[key] = True
        except (ConnectionError, OSError):
            pass  # the client hung up, as it should
        finally:
            event.set()
        return response

    async def big_declared(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, "declared", 256 * MIB, b"\0" * 65536, 0.0, declare=True)

    async def big_stream(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, "stream", 256 * MIB, b"\0" * 65536, 0.0, declare=False)

    async def drip(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, "drip", 100_000, b"x", 0.05, declare=True)

    async def trickle(self, request: web.Request) -> web.StreamResponse:
        """One byte every 0.5 s of a declared 1000: a slow-trickle upstream."""
        response = web.StreamResponse(headers={"Content-Type": "image/png", "Content-Length": "1000"})
        self.trickling += 1
        try:
            await response.prepare(request)
            for _ in range(1000):
                await response.write(b"x")
                await asyncio.sleep(0.5)
            await response.write_eof()
        except (ConnectionError, OSError):
            pass  # the client hung up, as it should
        finally:
            self.trickling -= 1
        return response

    async def bomb(self, request: web.Request) -> web.StreamResponse:
        compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
        zeros = b"\0" * MIB
        body = b"".join(compressor.compress(zeros) for _ in range(64)) + compressor.flush()
        return web.Response(body=body, headers={"Content-Type": "image/png", "Content-Encoding": "gzip"})

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.middleware])
        app.router.add_get("/img/{name}", self.image)
        app.router.add_get("/wrongtype/{name}", self.wrong_type)
        app.router.add_get("/chunked/{name}", self.chunked)
        app.router.add_get("/enc/{encoding}/{name}", self.encoded)
        app.router.add_get("/status/{code}", self.status)
        app.router.add_get("/redirect/{n}", self.redirect_chain)
        app.router.add_get("/flaky/{code}/{n}", self.flaky)
        app.router.add_get("/late-once/{seconds}", self.late_once)
        app.router.add_get("/to", self.redirect_to)
        app.router.add_get("/secret", self.secret)
        app.router.add_get("/big-declared", self.big_declared)
        app.router.add_get("/big-stream", self.big_stream)
        app.router.add_get("/drip", self.drip)
        app.router.add_get("/bomb", self.bomb)
        app.router.add_get("/trickle", self.trickle)
        return app


@asynccontextmanager
async def _serve(sites: int = 1) -> AsyncIterator[Server]:
    """The test server, listening on ``sites`` ports of 127.0.0.1 (each a separate host to a client)."""
    server = Server()
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        for _ in range(sites):
            await web.TCPSite(runner, "127.0.0.1", 0).start()
        server.ports = [address[1] for address in runner.addresses]
        server.port = server.ports[0]
        yield server
    finally:
        await runner.cleanup()


def _open_fetcher(**kwargs: Any) -> Fetcher:
    kwargs.setdefault("allow_private", True)
    kwargs.setdefault("timeout", 20.0)
    return Fetcher(**kwargs)


@pytest.fixture
def serve() -> Callable[..., AbstractAsyncContextManager[Server]]:
    """``serve(sites=1)``: the test server, started in the test's event loop."""
    return _serve


@pytest.fixture
def open_fetcher() -> Callable[..., Fetcher]:
    """``open_fetcher(**kwargs)``: a Fetcher that may reach the loopback test server."""
    return _open_fetcher
