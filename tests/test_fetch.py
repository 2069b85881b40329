"""Fetching: pixelwire.fetch.Fetcher against a real HTTP server, and its SSRF guard.

Every test drives its coroutine with ``asyncio.run`` (no pytest-asyncio) and
starts its own aiohttp server on 127.0.0.1 on a free port. The server keeps an
access log (the path and query of every request that reached it) which the
tests inspect. Fetchers that must reach the server use ``allow_private=True``;
the SSRF tests use the default guard.

There is no DNS here, so the SSRF tests use ``HookedFetcher``, which overrides
the fetcher's two documented test seams: ``_getaddrinfo`` (fake DNS for a few
made-up names) and ``_address_refusal`` (treats the two made-up names
``public.example`` and ``cdn.example`` as public although they resolve to the
loopback test server, so that they can stand in for hosts on the internet).
Every other name and address goes through the real guard.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import ipaddress
import os
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from aiohttp import web

import pixelwire
from pixelwire.fetch import Fetcher, address_refusal, load_image

from reference import CORPUS, assert_same_pixels, vllm_load

T = TypeVar("T")

IMAGES = ["flower2.jpg", "hopper.png", "flower.webp"]
CONTENT_TYPES = {".jpg": "image/jpeg", ".png": "image/png", ".webp": "image/webp", ".gif": "image/gif"}
MIB = 1 << 20


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def assert_matches_vllm(data: bytes, got: np.ndarray) -> None:
    fmt, expected = vllm_load(data)
    assert_same_pixels(fmt, data, got, expected)


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
        app.router.add_get("/to", self.redirect_to)
        app.router.add_get("/secret", self.secret)
        app.router.add_get("/big-declared", self.big_declared)
        app.router.add_get("/big-stream", self.big_stream)
        app.router.add_get("/drip", self.drip)
        app.router.add_get("/bomb", self.bomb)
        app.router.add_get("/trickle", self.trickle)
        return app


@asynccontextmanager
async def serve(sites: int = 1) -> AsyncIterator[Server]:
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


def open_fetcher(**kwargs: Any) -> Fetcher:
    kwargs.setdefault("allow_private", True)
    kwargs.setdefault("timeout", 20.0)
    return Fetcher(**kwargs)


# -- serving images ----------------------------------------------------------------


ROUTES = ["/img/{}", "/chunked/{}", "/enc/gzip/{}", "/enc/gzip2/{}", "/enc/deflate/{}", "/enc/rawdeflate/{}"]


@pytest.mark.parametrize("route", [*ROUTES, "/wrongtype/{}"])
@pytest.mark.parametrize("name", IMAGES)
def test_served_image_is_fetched_and_decoded(name: str, route: str) -> None:
    data = (CORPUS / name).read_bytes()

    async def main() -> None:
        async with serve() as server, open_fetcher() as fetcher:
            url = server.url(route.format(name))
            assert await fetcher.fetch(url) == data
            pixels = await load_image(url, fetcher=fetcher)
            assert_matches_vllm(data, pixels)
            assert server.log == [route.format(name)] * 2

    run(main())


def test_load_image_without_a_fetcher_and_from_bytes() -> None:
    data = (CORPUS / "hopper.png").read_bytes()

    async def main() -> None:
        # The default fetcher's guard refuses the loopback server...
        async with serve() as server:
            with pytest.raises(pixelwire.BlockedURL):
                await load_image(server.url("/img/hopper.png"))
            assert server.log == []
        # ...and data: URLs and bytes need no server.
        url = "data:image/png;base64," + base64.b64encode(data).decode()
        assert_matches_vllm(data, await load_image(url))
        assert_matches_vllm(data, await load_image(data))
        assert (await load_image(bytearray(data), mode="L")).shape == (128, 128, 1)
        with pytest.raises(TypeError):
            await load_image(123)  # type: ignore[arg-type]

    run(main())


def test_fetcher_without_context_manager_creates_its_session_lazily() -> None:
    async def main() -> None:
        async with serve() as server:
            fetcher = open_fetcher()
            assert not fetcher.has_session
            assert await fetcher.fetch("data:;base64,eA==") == b"x"
            assert not fetcher.has_session  # data: URLs need no session
            await fetcher.fetch(server.url("/img/hopper.png"))
            assert fetcher.has_session
            await fetcher.close()
            await fetcher.close()  # idempotent
            assert fetcher.closed
            with pytest.raises(RuntimeError, match="closed"):
                await fetcher.fetch(server.url("/img/hopper.png"))

    run(main())


# -- errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        (404, False),
        (403, False),
        (400, False),
        (410, False),
        (408, True),
        (429, True),
        (500, True),
        (503, True),
    ],
)
def test_http_error_status(code: int, retryable: bool) -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher() as fetcher:
            with pytest.raises(pixelwire.FetchError) as caught:
                await fetcher.fetch(server.url(f"/status/{code}?token=SECRET-TOKEN"))
            err = caught.value
            assert not isinstance(err, pixelwire.BlockedURL)
            assert err.status == code
            assert err.retryable is retryable
            assert f"HTTP {code}" in str(err)
            assert "SECRET-TOKEN" not in str(err)  # no query strings in messages

    run(main())


def test_connection_refused_is_retryable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there

    async def main() -> None:
        async with open_fetcher() as fetcher:
            with pytest.raises(pixelwire.FetchError) as caught:
                await fetcher.fetch(f"http://127.0.0.1:{port}/x.png")
            assert caught.value.retryable is True
            assert caught.value.status is None

    run(main())


def test_oversize_by_content_length_is_refused_before_reading() -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher(max_bytes=MIB) as fetcher:
            start = time.monotonic()
            with pytest.raises(pixelwire.FetchError, match=r"Content-Length 268435456 is over") as caught:
                await fetcher.fetch(server.url("/big-declared"))
            assert time.monotonic() - start < 10
            assert caught.value.retryable is False
            await asyncio.wait_for(server.finished["declared"].wait(), 30)
            assert not server.completed["declared"]
            print(
                f"\nserver sent {server.sent['declared'] / MIB:.1f} MiB of 256 MiB before the client hung up"
            )

    run(main())


def test_oversize_stream_is_refused_at_the_cap() -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher(max_bytes=MIB) as fetcher:
            with pytest.raises(pixelwire.FetchError, match=r"over the limit of 1048576 bytes") as caught:
                await fetcher.fetch(server.url("/big-stream"))
            assert caught.value.retryable is False
            await asyncio.wait_for(server.finished["stream"].wait(), 30)
            sent = server.sent["stream"]
            print(f"\nserver sent {sent / MIB:.1f} MiB of 256 MiB before the client hung up")
            # What the socket buffers hold beyond the cap, not the whole body.
            assert not server.completed["stream"]
            assert sent < 48 * MIB

    run(main())


def test_gzip_bomb_is_refused_after_decoding_the_cap() -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher(max_bytes=MIB) as fetcher:
            tracemalloc.start()
            try:
                with pytest.raises(
                    pixelwire.FetchError, match=r"over the limit of 1048576 bytes after decoding"
                ):
                    await fetcher.fetch(server.url("/bomb"))
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            print(f"\npeak traced memory while refusing a 64 MiB gzip bomb: {peak / MIB:.1f} MiB")
            assert peak < 16 * MIB

    run(main())


def test_slow_server_times_out_within_the_limit() -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher(timeout=1.0) as fetcher:
            start = time.monotonic()
            with pytest.raises(pixelwire.FetchError, match="timed out after 1 s") as caught:
                await fetcher.fetch(server.url("/drip"))
            elapsed = time.monotonic() - start
            assert 0.9 <= elapsed < 4.0, elapsed  # the whole drip would take 5000 s
            assert caught.value.retryable is True
            assert caught.value.status is None
            await asyncio.wait_for(server.finished["drip"].wait(), 30)
            assert not server.completed["drip"]

    run(main())


def test_redirects_are_followed_up_to_the_limit() -> None:
    data = (CORPUS / "hopper.png").read_bytes()

    async def main() -> None:
        async with serve() as server, open_fetcher(max_redirects=3) as fetcher:
            assert await fetcher.fetch(server.url("/redirect/3")) == data
            assert server.log == ["/redirect/3", "/redirect/2", "/redirect/1", "/redirect/0"]
            server.log.clear()
            with pytest.raises(pixelwire.FetchError, match="more than 3 redirects") as caught:
                await fetcher.fetch(server.url("/redirect/4"))
            assert not isinstance(caught.value, pixelwire.BlockedURL)
            assert caught.value.retryable is False
            # Three redirects followed, the fourth refused without a request.
            assert server.log == ["/redirect/4", "/redirect/3", "/redirect/2", "/redirect/1"]
        async with serve() as server, open_fetcher(max_redirects=0) as fetcher:
            with pytest.raises(pixelwire.FetchError, match="more than 0 redirects"):
                await fetcher.fetch(server.url("/redirect/1"))
            assert server.log == ["/redirect/1"]

    run(main())


# -- data: and file: URLs -----------------------------------------------------------


def test_data_urls() -> None:
    data = (CORPUS / "flower2.jpg").read_bytes()
    encoded = base64.b64encode(data).decode()

    async def main() -> None:
        async with Fetcher() as fetcher:
            assert await fetcher.fetch("data:image/jpeg;base64," + encoded) == data
            assert await fetcher.fetch("DATA:image/jpeg;BASE64," + encoded) == data
            # Not base64: refused, clearly, without echoing the payload.
            with pytest.raises(pixelwire.FetchError, match="not base64") as caught:
                await fetcher.fetch("data:image/svg+xml,<svg>PAYLOAD-TEXT</svg>")
            assert "PAYLOAD-TEXT" not in str(caught.value)
            # Invalid base64: refused without echoing the payload.
            with pytest.raises(pixelwire.FetchError) as caught:
                await fetcher.fetch("data:image/png;base64,SECRETPAYLOAD!!" + encoded[:400])
            assert "SECRETPAYLOAD" not in str(caught.value)
            assert encoded[:40] not in str(caught.value)
        async with Fetcher(max_bytes=1000) as small:
            with pytest.raises(pixelwire.FetchError, match="over the limit of 1000 bytes") as caught:
                await small.fetch("data:image/jpeg;base64," + encoded)
            assert encoded[:40] not in str(caught.value)
            assert await small.fetch("data:image/png;base64," + base64.b64encode(b"a" * 1000).decode())

    run(main())


def test_file_urls_below_the_allowed_path(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    data = (CORPUS / "hopper.png").read_bytes()
    (allowed / "hopper.png").write_bytes(data)
    (allowed / "sub").mkdir()
    (allowed / "sub" / "x y.png").write_bytes(data)

    async def main() -> None:
        async with Fetcher(allowed_local_path=allowed) as fetcher:
            assert await fetcher.fetch(f"file://{allowed}/hopper.png") == data
            assert await fetcher.fetch(f"file://localhost{allowed}/sub/x%20y.png") == data
            assert await fetcher.fetch(f"file://{allowed}/sub/../hopper.png") == data
            with pytest.raises(pixelwire.FetchError) as caught:
                await fetcher.fetch(f"file://{allowed}/missing.png")
            assert not isinstance(caught.value, pixelwire.BlockedURL)
            with pytest.raises(pixelwire.FetchError, match="regular file"):
                await fetcher.fetch(f"file://{allowed}/sub")
        async with Fetcher(allowed_local_path=allowed, max_bytes=100) as small:
            with pytest.raises(pixelwire.FetchError, match="over the limit of 100 bytes"):
                await small.fetch(f"file://{allowed}/hopper.png")

    run(main())


# -- the SSRF guard -----------------------------------------------------------------


PUBLIC_NAMES = {"public.example", "cdn.example"}
FAKE_DNS = {
    # Stand-ins for hosts on the internet; the test server listens behind them.
    "public.example": ["127.0.0.1"],
    "cdn.example": ["127.0.0.1"],
    # Hostile names: the real guard must refuse them.
    "evil.example": ["127.0.0.1"],
    "evil6.example": ["::1"],
    "dual.example": ["93.184.215.14", "::1"],  # one public address, one loopback
    "metadata.example": ["169.254.169.254"],
    "rfc1918.example": ["10.1.2.3"],
    "nat64.example": ["64:ff9b::a9fe:a9fe"],  # a DNS64 answer for the metadata address
}


class HookedFetcher(Fetcher):
    """A Fetcher with fake DNS and two made-up names treated as public (test seams only)."""

    async def _getaddrinfo(self, host: str, port: int, family: int) -> list[tuple[int, int, str]]:
        addresses = FAKE_DNS.get(host.rstrip("."))
        if addresses is None:
            return await super()._getaddrinfo(host, port, family)
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.IPPROTO_TCP, a)
            for a in addresses
            if family in (0, socket.AF_INET6 if ":" in a else socket.AF_INET)
        ]

    def _address_refusal(self, host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        if host.rstrip(".") in PUBLIC_NAMES:
            return None
        return super()._address_refusal(host, ip)


def hooked(kind: str, allowed: Path) -> HookedFetcher:
    options: dict[str, Any] = {"timeout": 10.0, "connect_timeout": 2.0}
    if kind == "allowlist":
        options["allowed_domains"] = ["public.example"]
    elif kind == "local":
        options["allowed_local_path"] = allowed
    return HookedFetcher(**options)


TO = "http://public.example:{port}/to?url="
HOSTILE: list[tuple[str, str]] = [
    # Loopback in every IPv4 spelling.
    ("default", "http://127.0.0.1:{port}/secret"),
    ("default", "https://127.0.0.1:{port}/secret"),
    ("default", "http://127.0.0.2:{port}/secret"),
    ("default", "http://2130706433:{port}/secret"),
    ("default", "http://0x7f000001:{port}/secret"),
    ("default", "http://0x7f.0x0.0x0.0x1:{port}/secret"),
    ("default", "http://0x7f.1:{port}/secret"),
    ("default", "http://017700000001:{port}/secret"),
    ("default", "http://0177.0.0.1:{port}/secret"),
    ("default", "http://127.1:{port}/secret"),
    ("default", "http://127.0.1:{port}/secret"),
    ("default", "http://0:{port}/secret"),
    ("default", "http://0.0.0.0:{port}/secret"),
    ("default", "http://%31%32%37.0.0.1:{port}/secret"),
    ("default", "http://\u2460\u2461\u2466.\u24ea.\u24ea.\u2460:{port}/secret"),  # circled digits
    ("default", "http://127\u30020\u30020\u30021:{port}/secret"),  # ideographic full stops
    # IPv6 forms.
    ("default", "http://[::1]:{port}/secret"),
    ("default", "http://[0:0:0:0:0:0:0:1]:{port}/secret"),
    ("default", "http://[::ffff:127.0.0.1]:{port}/secret"),
    ("default", "http://[::ffff:7f00:1]:{port}/secret"),
    ("default", "http://[::ffff:10.0.0.1]:{port}/secret"),
    ("default", "http://[::ffff:0:7f00:1]:{port}/secret"),  # IPv4-translated (SIIT)
    ("default", "http://[::10.0.0.1]:{port}/secret"),
    ("default", "http://[64:ff9b::10.0.0.1]:{port}/secret"),
    ("default", "http://[64:ff9b:1::a00:1]:{port}/secret"),  # local-use NAT64
    ("default", "http://[2001:0:808:808::f5ff:fffe]:{port}/secret"),  # Teredo, client 10.0.0.1
    ("default", "http://[::127.0.0.1]:{port}/secret"),
    ("default", "http://[::]:{port}/secret"),
    ("default", "http://[64:ff9b::7f00:1]:{port}/secret"),
    ("default", "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/"),
    ("default", "http://[2002:7f00:1::1]:{port}/secret"),
    ("default", "http://[fe80::1%25lo]:{port}/secret"),
    ("default", "http://[fc00::1]/"),
    ("default", "http://[fd00:ec2::254]/latest/meta-data/"),
    ("default", "http://[ff02::1]/"),
    ("default", "http://[2001:db8::1]/"),
    ("default", "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/"),  # Teredo
    # Private, link-local, metadata, CGNAT, multicast, reserved IPv4.
    ("default", "http://10.0.0.1/"),
    ("default", "http://172.16.0.1/"),
    ("default", "http://192.168.1.1/"),
    ("default", "http://169.254.169.254/latest/meta-data/"),
    ("default", "http://169.254.170.2/v2/credentials"),
    ("default", "http://100.64.0.1/"),
    ("default", "http://224.0.0.1/"),
    ("default", "http://240.0.0.1/"),
    ("default", "http://255.255.255.255/"),
    ("default", "http://192.0.2.1/"),
    ("default", "http://198.18.0.1/"),
    ("default", "http://192.0.0.170/"),
    # Names that resolve to refused addresses.
    ("default", "http://localhost:{port}/secret"),
    ("default", "http://LocalHost:{port}/secret"),
    ("default", "http://evil.example:{port}/secret"),
    ("default", "http://EVIL.example.:{port}/secret"),
    ("default", "http://evil6.example:{port}/secret"),
    ("default", "http://dual.example:{port}/secret"),
    ("default", "http://metadata.example/latest/meta-data/"),
    ("default", "http://rfc1918.example/"),
    ("default", "http://nat64.example/latest/meta-data/"),
    # A public-looking host that redirects to a private address.
    ("default", TO + "http://127.0.0.1:{port}/secret"),
    ("default", TO + "http://localhost:{port}/secret"),
    ("default", TO + "http://evil.example:{port}/secret"),
    ("default", TO + "http://[::1]:{port}/secret"),
    ("default", TO + "http://2130706433:{port}/secret"),
    ("default", TO + "http://169.254.169.254/latest/meta-data/"),
    ("default", TO + "file:///etc/passwd"),
    ("default", TO + "gopher://127.0.0.1:{port}/_secret"),
    ("default", TO + "data:image/png;base64,iVBORw0KGgo="),
    # Schemes.
    ("default", "file:///etc/passwd"),
    ("default", "file://{allowed}/inside.png"),  # no allowed_local_path: file: is off
    ("local", "file:///etc/passwd"),
    ("local", "file://{allowed}/../outside.png"),
    ("local", "file://{allowed}/%2e%2e/outside.png"),
    ("local", "file://{allowed}/link.png"),  # a symlink that leads outside
    ("local", "file://public.example{allowed}/inside.png"),
    ("default", "ftp://127.0.0.1:{port}/secret"),
    ("default", "gopher://127.0.0.1:{port}/_GET%20/secret"),
    ("default", "dict://127.0.0.1:{port}/"),
    ("default", "ws://127.0.0.1:{port}/secret"),
    ("default", "javascript:alert(1)"),
    ("default", "//127.0.0.1:{port}/secret"),
    ("default", "/secret"),
    ("default", "http://public.example@127.0.0.1:{port}/secret"),
    ("default", "http://user:pass@public.example:{port}/secret"),
    # The domain allow-list, on the first hop and on a redirect.
    ("allowlist", "http://cdn.example:{port}/secret"),
    ("allowlist", "http://public.example.cdn.example:{port}/secret"),
    ("allowlist", "http://127.0.0.1:{port}/secret"),
    ("allowlist", TO + "http://cdn.example:{port}/secret"),
]


def _case_id(case: tuple[str, str]) -> str:
    kind, template = case
    return f"{kind}:{template.replace('{port}', 'P').replace('{allowed}', 'A')}"


@pytest.mark.parametrize(("kind", "template"), HOSTILE, ids=[_case_id(c) for c in HOSTILE])
def test_hostile_url_is_blocked_and_never_reaches_the_server(
    kind: str, template: str, tmp_path: Path
) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "inside.png").write_bytes((CORPUS / "hopper.png").read_bytes())
    (tmp_path / "outside.png").write_bytes((CORPUS / "hopper.png").read_bytes())
    os.symlink(tmp_path / "outside.png", allowed / "link.png")

    async def main() -> None:
        async with serve() as server, hooked(kind, allowed) as fetcher:
            url = template.format(port=server.port, allowed=allowed)
            with pytest.raises(pixelwire.BlockedURL) as caught:
                await fetcher.fetch(url)
            assert caught.value.status is None
            assert caught.value.retryable is False
            print(f"\n{url!r}: {caught.value}")
            if template.startswith(TO):
                # The public-looking first hop is served; the hop it redirects to is not.
                assert len(server.log) == 1 and server.log[0].startswith("/to?")
            else:
                assert server.log == []

    run(main())


def test_hostile_table_is_large_enough() -> None:
    assert len(HOSTILE) >= 25


def test_hooked_names_reach_the_server_when_nothing_is_hostile() -> None:
    """Controls for the table: the hooks work, so only the guard stops the hostile cases."""
    data = (CORPUS / "hopper.png").read_bytes()

    async def main() -> None:
        async with serve() as server, hooked("allowlist", Path("/")) as allowlisted:
            async with hooked("default", Path("/")) as fetcher:
                assert await fetcher.fetch(f"http://public.example:{server.port}/img/hopper.png") == data
                redirect = f"http://public.example:{server.port}/to?url=http://cdn.example:{server.port}/img/hopper.png"
                assert await fetcher.fetch(redirect) == data
            assert await allowlisted.fetch(f"http://public.example:{server.port}/img/hopper.png") == data
            assert await allowlisted.fetch(f"http://PUBLIC.example.:{server.port}/img/hopper.png") == data
            assert len(server.log) == 5 and server.log[1].startswith("/to?")
            assert [p for i, p in enumerate(server.log) if i != 1] == ["/img/hopper.png"] * 4

    run(main())


def test_the_real_default_fetcher_blocks_the_test_server() -> None:
    async def main() -> None:
        async with serve() as server, Fetcher() as fetcher:
            for host in ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "2130706433"):
                with pytest.raises(pixelwire.BlockedURL):
                    await fetcher.fetch(server.url("/img/hopper.png", host=host))
            assert server.log == []

    run(main())


def test_allow_private_opts_out_of_the_address_check_only() -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher() as fetcher:
            assert await fetcher.fetch(server.url("/img/hopper.png", host="localhost"))
            # Odd spellings, schemes and credentials stay refused.
            for url in (
                server.url("/secret", host="2130706433"),
                server.url("/secret", host="127.1"),
                f"ftp://127.0.0.1:{server.port}/secret",
                f"http://u:p@127.0.0.1:{server.port}/secret",
                "file:///etc/passwd",
            ):
                with pytest.raises(pixelwire.BlockedURL):
                    await fetcher.fetch(url)
            assert server.log == ["/img/hopper.png"]

    run(main())


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("8.8.8.8", False),
        ("1.1.1.1", False),
        ("2606:4700:4700::1111", False),
        ("64:ff9b::808:808", False),  # NAT64 of 8.8.8.8
        ("2002:808:808::1", False),  # 6to4 of 8.8.8.8
        ("127.0.0.1", True),
        ("10.255.255.255", True),
        ("172.31.0.1", True),
        ("192.168.0.1", True),
        ("169.254.169.254", True),
        ("100.127.255.255", True),
        ("0.0.0.0", True),
        ("224.0.0.251", True),
        ("255.255.255.255", True),
        ("::1", True),
        ("::", True),
        ("::ffff:8.8.8.8", False),  # IPv4-mapped: the IPv4 rule
        ("::8.8.8.8", True),
        ("fe80::1", True),
        ("fec0::1", True),
        ("fd12:3456::1", True),
        ("ff0e::1", True),
        ("64:ff9b::a00:1", True),
        ("64:ff9b:1::1", True),
        ("2002:a00:1::1", True),
        ("2001::1", True),
        ("2001:db8::1", True),
    ],
)
def test_address_policy(address: str, refused: bool) -> None:
    assert (address_refusal(ipaddress.ip_address(address)) is not None) is refused


# -- concurrency ---------------------------------------------------------------------

CONCURRENT_IMAGES = [
    "flower2.jpg",
    "hopper.png",
    "flower.webp",
    "hopper_gray.jpg",
    "hopper.webp",
    "flower2.webp",
    "1_trns.png",
    "exif_gps_typeerror.jpg",
]


def test_200_concurrent_fetches_and_decodes_share_a_bounded_pool() -> None:
    files = {name: (CORPUS / name).read_bytes() for name in CONCURRENT_IMAGES}
    expected = {name: vllm_load(data) for name, data in files.items()}
    names = [CONCURRENT_IMAGES[i % len(CONCURRENT_IMAGES)] for i in range(200)]

    async def one(fetcher: Fetcher, server: Server, name: str) -> np.ndarray:
        data = await fetcher.fetch(server.url(f"/img/{name}"))
        assert data == files[name]
        return await asyncio.to_thread(pixelwire.decode_image, data)

    async def main() -> None:
        async with serve() as server, open_fetcher(timeout=120.0) as fetcher:
            server.delay = 0.005  # keep requests in flight together
            results = await asyncio.gather(*(one(fetcher, server, name) for name in names))
            limit = Fetcher.MAX_CONNECTIONS_PER_HOST
            print(
                f"\n200 fetches: {len(server.peers)} connections opened, "
                f"at most {server.max_in_flight} requests in flight (limit {limit})"
            )
            assert len(server.log) == 200
            assert server.max_in_flight <= limit
            assert len(server.peers) <= limit  # connections were reused, not one per fetch
        for name, pixels in zip(names, results, strict=True):
            fmt, reference = expected[name]
            assert_same_pixels(fmt, files[name], pixels, reference)

    run(main())


def test_200_concurrent_url_publishes_read_back_over_nixl() -> None:
    """200 concurrent fetch + decode_and_publish of URLs, each read back over
    NIXL and compared with the decoder's output, through a bounded pool of
    connections."""
    try:
        pixelwire.transfer.nixl_library_path()
    except pixelwire.TransferError as missing:
        pytest.skip(str(missing))
    files = {name: (CORPUS / name).read_bytes() for name in CONCURRENT_IMAGES}
    expected = {name: pixelwire.decode_image(data) for name, data in files.items()}
    names = [CONCURRENT_IMAGES[i % len(CONCURRENT_IMAGES)] for i in range(200)]

    async def main() -> None:
        async with serve() as server, open_fetcher(timeout=120.0) as fetcher:
            server.delay = 0.005
            publisher = pixelwire.Publisher(fetcher=fetcher, pool_bytes=512 << 20, acquire_timeout=60)
            async with publisher, pixelwire.Reader() as reader:
                descs = await asyncio.gather(
                    *(publisher.decode_and_publish(server.url(f"/img/{name}")) for name in names)
                )
                for name, desc in zip(names, descs, strict=True):
                    got = await reader.read_decoded(desc, output="numpy")
                    np.testing.assert_array_equal(got, expected[name])
                limit = Fetcher.MAX_CONNECTIONS_PER_HOST
                peers, busiest = len(server.peers), server.max_in_flight
                print(f"\n200 URL publishes: {peers} connections, {busiest} in flight")
                assert len(server.log) == 200
                assert server.max_in_flight <= limit and len(server.peers) <= limit

    run(main())


class SmallPoolFetcher(Fetcher):
    MAX_CONNECTIONS = 8
    MAX_CONNECTIONS_PER_HOST = 4


def test_connection_limit_is_enforced() -> None:
    async def main() -> None:
        async with serve() as server, SmallPoolFetcher(allow_private=True, timeout=60.0) as fetcher:
            server.delay = 0.05
            await asyncio.gather(*(fetcher.fetch(server.url("/img/hopper.png")) for _ in range(40)))
            assert len(server.log) == 40
            assert 2 <= server.max_in_flight <= 4
            assert len(server.peers) <= 4

    run(main())


# -- embedded IPv4 in IPv6: one rule ---------------------------------------------------

# Every IPv6 form that embeds an IPv4 address is judged by the IPv4 rule applied
# to what it embeds; a form whose public addresses are refused all the same says
# so. (address, refused, words the refusal must contain)
EMBEDDED_IPV4: list[tuple[str, bool, str]] = [
    # IPv4-mapped: a socket connects to the IPv4 address itself.
    ("::ffff:10.0.0.1", True, "embeds 10.0.0.1"),
    ("::ffff:127.0.0.1", True, "embeds 127.0.0.1"),
    ("::ffff:169.254.169.254", True, "embeds 169.254.169.254"),
    ("::ffff:8.8.8.8", False, ""),
    # IPv4-translated (SIIT, ::ffff:0:0:0/96): obsolete, public ones refused too.
    ("::ffff:0:10.0.0.1", True, "embeds 10.0.0.1"),
    ("::ffff:0:8.8.8.8", True, "IPv4-translated"),
    # IPv4-compatible (::/96): deprecated, public ones refused too.
    ("::10.0.0.1", True, "embeds 10.0.0.1"),
    ("::192.168.1.1", True, "embeds 192.168.1.1"),
    ("::8.8.8.8", True, "IPv4-compatible"),
    # NAT64, the well-known prefix: a translator reaches the IPv4 address.
    ("64:ff9b::10.0.0.1", True, "embeds 10.0.0.1"),
    ("64:ff9b::100.64.0.1", True, "embeds 100.64.0.1"),
    ("64:ff9b::8.8.8.8", False, ""),
    # NAT64, the local-use prefix (64:ff9b:1::/48): the site picks the prefix
    # length, so every RFC 6052 layout that fits must embed a public address.
    ("64:ff9b:1::10.0.0.1", True, "embeds"),
    ("64:ff9b:1::8.8.8.8", True, "embeds 0.0.0.0"),  # public at /96, 0.0.0.0 at /48
    ("64:ff9b:1:a00:0:108:808:808", True, "embeds 10.0.0.1"),  # 10.0.0.1 at /48
    ("64:ff9b:1:808:8:808:808:808", False, ""),  # 8.8.8.8 in every layout
    # 6to4 (2002::/16): the relay delivers to the IPv4 router it names.
    ("2002:a00:1::1", True, "embeds 10.0.0.1"),
    ("2002:7f00:1::1", True, "embeds 127.0.0.1"),
    ("2002:808:808::1", False, ""),
    # Teredo (2001::/32): server and (obfuscated) client IPv4; refused even when public.
    ("2001:0:808:808::f5ff:fffe", True, "embeds 10.0.0.1"),  # client 10.0.0.1
    ("2001:0:a00:1::f7f7:f7f7", True, "embeds 10.0.0.1"),  # server 10.0.0.1
    ("2001:0:808:808::f7f7:f7f7", True, "Teredo"),  # both 8.8.8.8
]


@pytest.mark.parametrize(("address", "refused", "words"), EMBEDDED_IPV4)
def test_embedded_ipv4_is_judged_by_the_ipv4_rule(address: str, refused: bool, words: str) -> None:
    reason = address_refusal(ipaddress.IPv6Address(address))
    print(f"\n{address}: {reason}")
    assert (reason is not None) is refused
    if refused:
        assert words in (reason or "")


# -- file: URLs without a check-then-open race -----------------------------------------


def test_file_url_symlinks_are_followed_only_inside_the_allowed_folder(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "sub").mkdir(parents=True)
    (tmp_path / "outdir").mkdir()
    (allowed / "real.png").write_bytes(b"inside")
    (allowed / "sub" / "x.png").write_bytes(b"inside too")
    (tmp_path / "outside.png").write_bytes(b"SECRET")
    (tmp_path / "outdir" / "x.png").write_bytes(b"SECRET")
    os.symlink("real.png", allowed / "rel.png")
    os.symlink(allowed / "real.png", allowed / "abs.png")
    os.symlink("sub", allowed / "subdir")
    os.symlink("../real.png", allowed / "sub" / "up.png")
    os.symlink("../outside.png", allowed / "out.png")
    os.symlink(tmp_path / "outside.png", allowed / "absout.png")
    os.symlink(tmp_path / "outdir", allowed / "outdir")
    os.symlink("..", allowed / "parent")
    os.symlink("loop", allowed / "loop")

    async def main() -> None:
        async with Fetcher(allowed_local_path=allowed) as fetcher:
            for name in ("real.png", "rel.png", "abs.png", "sub/up.png", "subdir/up.png"):
                assert await fetcher.fetch(f"file://{allowed}/{name}") == b"inside", name
            assert await fetcher.fetch(f"file://{allowed}/subdir/x.png") == b"inside too"
            for name in ("out.png", "absout.png", "outdir/x.png", "parent/outside.png"):
                with pytest.raises(pixelwire.BlockedURL, match="outside allowed_local_path"):
                    await fetcher.fetch(f"file://{allowed}/{name}")
            with pytest.raises(pixelwire.FetchError, match="symbolic links"):
                await fetcher.fetch(f"file://{allowed}/loop")

    run(main())


def test_file_swapped_for_a_symlink_never_leaks_what_it_points_at(tmp_path: Path) -> None:
    """A path inside the folder flips between a regular file and a symlink to a
    secret outside it, as fast as a thread can rename: whatever the fetch sees,
    it never returns the secret (no window between a check and the open)."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    master = tmp_path / "inside-master"
    master.write_bytes(b"inside")
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"SECRET")
    target = allowed / "flip.png"
    os.link(master, target)
    stop = threading.Event()

    def flip() -> None:
        spare_link, spare_file = allowed / ".link", allowed / ".file"
        while not stop.is_set():
            os.symlink(secret, spare_link)
            os.replace(spare_link, target)
            os.link(master, spare_file)
            os.replace(spare_file, target)

    async def main() -> dict[str, int]:
        seen = {"inside": 0, "refused": 0, "leaked": 0}
        flipper = threading.Thread(target=flip)
        flipper.start()
        try:
            async with Fetcher(allowed_local_path=allowed) as fetcher:
                deadline = time.monotonic() + 1.5
                while time.monotonic() < deadline and not seen["leaked"]:
                    try:
                        data = await fetcher.fetch(f"file://{target}")
                    except pixelwire.FetchError:  # BlockedURL, or the link gone before readlink
                        seen["refused"] += 1
                    else:
                        seen["leaked" if data == b"SECRET" else "inside"] += 1
                        assert data in (b"inside", b"SECRET")
        finally:
            stop.set()
            flipper.join(10)
        return seen

    seen = run(main())
    print(f"\nfetches while flipping: {seen}")
    assert seen["leaked"] == 0
    assert seen["inside"] > 0 and seen["refused"] > 0  # both states were met


# -- fairness --------------------------------------------------------------------------


def test_a_trickling_body_fails_at_the_total_deadline() -> None:
    """One byte every 0.5 s never trips a per-read timeout; the total deadline ends it."""

    async def main() -> None:
        async with serve() as server, open_fetcher(timeout=1.5) as fetcher:
            start = time.monotonic()
            with pytest.raises(pixelwire.FetchError, match=r"timed out after 1\.5 s") as caught:
                await fetcher.fetch(server.url("/trickle"))
            elapsed = time.monotonic() - start
            assert 1.4 <= elapsed < 4.0, elapsed
            assert caught.value.retryable is True
            for _ in range(100):  # the connection was dropped: the server stops sending
                if server.trickling == 0:
                    break
                await asyncio.sleep(0.05)
            assert server.trickling == 0

    run(main())


def test_name_resolution_does_not_wait_behind_a_busy_default_executor() -> None:
    """Threads of the loop's default executor blocked (as decode threads waiting
    for a full pixel pool are) must not hold up resolving a host name."""
    data = (CORPUS / "hopper.png").read_bytes()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2))
        release = threading.Event()
        blocked = [asyncio.ensure_future(asyncio.to_thread(release.wait, 30)) for _ in range(2)]
        try:
            await asyncio.sleep(0.05)
            async with serve() as server, open_fetcher(timeout=3.0) as fetcher:
                assert await fetcher.fetch(server.url("/img/hopper.png", host="localhost")) == data
        finally:
            release.set()
            await asyncio.gather(*blocked)

    run(main())


def test_concurrency_limit_bounds_one_callers_fetches() -> None:
    data = (CORPUS / "hopper.png").read_bytes()

    async def main() -> None:
        async with serve() as server, open_fetcher(timeout=30.0) as fetcher:
            server.delay = 0.05
            url = server.url("/img/hopper.png")
            # A context: every fetch started in it, in tasks it creates too, shares the limit.
            with fetcher.concurrency_limit(3):
                got = await asyncio.gather(*(fetcher.fetch(url) for _ in range(15)))
            assert got == [data] * 15
            assert 2 <= server.max_in_flight <= 3
            # An explicit semaphore.
            server.max_in_flight = 0
            limit = asyncio.Semaphore(2)
            assert await asyncio.gather(*(fetcher.fetch(url, limit=limit) for _ in range(10))) == [data] * 10
            assert server.max_in_flight <= 2
            # fetch_many: results in order, fetch errors in place.
            server.max_in_flight = 0
            urls = [url, server.url("/status/404"), url, "ftp://x/", url]
            results = await fetcher.fetch_many(urls, max_concurrent=2)
            assert results[0] == results[2] == results[4] == data
            assert isinstance(results[1], pixelwire.FetchError) and results[1].status == 404
            assert isinstance(results[3], pixelwire.BlockedURL)
            assert server.max_in_flight <= 2
            with pytest.raises(ValueError):
                fetcher.concurrency_limit(0)

    run(main())


def test_the_deadline_covers_the_wait_for_a_callers_slot() -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher(timeout=1.0) as fetcher:
            start = time.monotonic()
            with fetcher.concurrency_limit(1):
                results = await asyncio.gather(
                    *(fetcher.fetch(server.url("/trickle")) for _ in range(4)), return_exceptions=True
                )
            elapsed = time.monotonic() - start
            assert all(isinstance(r, pixelwire.FetchError) and "timed out" in str(r) for r in results)
            assert elapsed < 3.0, elapsed  # not one deadline after another (4 s)

    run(main())


def test_one_client_cannot_starve_another() -> None:
    """While client A's 64 slow-trickle URLs (on four hosts, so
    per-host limits do not save B) are in flight, client B's image, behind a host
    name, comes back within 2 s. Each client is one frontend request: its fetches
    run under its own concurrency limit, as the frontend does."""
    data = (CORPUS / "hopper.png").read_bytes()

    async def main() -> None:
        async with serve(sites=4) as slow, serve() as fast, open_fetcher(timeout=30.0) as fetcher:
            trickles = [slow.url("/trickle", port=slow.ports[i % 4]) for i in range(64)]
            with fetcher.concurrency_limit(8):
                client_a = asyncio.gather(*(fetcher.fetch(u) for u in trickles), return_exceptions=True)
            try:
                for _ in range(200):
                    if slow.trickling >= 8:
                        break
                    await asyncio.sleep(0.025)
                assert slow.trickling >= 8
                start = time.monotonic()
                with fetcher.concurrency_limit(8):
                    got = await asyncio.wait_for(
                        fetcher.fetch(fast.url("/img/hopper.png", host="localhost")), 2.0
                    )
                elapsed = time.monotonic() - start
                print(f"\nclient B's image in {elapsed:.3f} s with {slow.trickling} trickles in flight")
                assert got == data
                assert slow.trickling >= 8 and not client_a.done()  # A is still being served
            finally:
                client_a.cancel()
                await asyncio.gather(client_a, return_exceptions=True)

    run(main())


def test_a_refused_private_address_names_both_settings_that_allow_it() -> None:
    """Worker mode needs both (the frontend checks a URL, the plug-in checks
    it again): the refusal names the frontend's flag and the plug-in's variable."""
    with pytest.raises(pixelwire.BlockedURL) as refused:
        pixelwire.Fetcher().check("http://127.0.0.1:9/x.png")
    message = str(refused.value)
    assert "loopback" in message
    assert "--allow-private" in message and "PIXELWIRE_ALLOW_PRIVATE=1" in message
