"""The Fetcher against a real HTTP server: images served every way, HTTP
errors, time limits, redirects, ``data:`` URLs, a shared connection pool and
fair shares of it.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import pixelwire
from pixelwire.fetch import Fetcher, load_image

from reference import CORPUS, assert_same_pixels, vllm_load

IMAGES = ["flower2.jpg", "hopper.png", "flower.webp"]


def assert_matches_vllm(data: bytes, got: np.ndarray) -> None:
    fmt, expected = vllm_load(data)
    assert_same_pixels(fmt, data, got, expected)


# -- serving images ----------------------------------------------------------------


ROUTES = ["/img/{}", "/chunked/{}", "/enc/gzip/{}", "/enc/gzip2/{}", "/enc/deflate/{}", "/enc/rawdeflate/{}"]


@pytest.mark.parametrize("route", [*ROUTES, "/wrongtype/{}"])
@pytest.mark.parametrize("name", IMAGES)
def test_served_image_is_fetched_and_decoded(
    name: str, route: str, serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
    data = (CORPUS / name).read_bytes()

    async def main() -> None:
        async with serve() as server, open_fetcher() as fetcher:
            url = server.url(route.format(name))
            assert await fetcher.fetch(url) == data
            pixels = await load_image(url, fetcher=fetcher)
            assert_matches_vllm(data, pixels)
            assert server.log == [route.format(name)] * 2

    asyncio.run(main())


def test_load_image_without_a_fetcher_and_from_bytes(serve: Callable[..., Any]) -> None:
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

    asyncio.run(main())


def test_fetcher_without_context_manager_creates_its_session_lazily(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())


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
def test_http_error_status(
    code: int, retryable: bool, serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())


def test_connection_refused_is_retryable(open_fetcher: Callable[..., Fetcher]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there

    async def main() -> None:
        async with open_fetcher() as fetcher:
            with pytest.raises(pixelwire.FetchError) as caught:
                await fetcher.fetch(f"http://127.0.0.1:{port}/x.png")
            assert caught.value.retryable is True
            assert caught.value.status is None

    asyncio.run(main())


def test_slow_server_times_out_within_the_limit(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())


def test_redirects_are_followed_up_to_the_limit(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())


# -- data: URLs -----------------------------------------------------------------------


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

    asyncio.run(main())


# -- one shared connection pool ------------------------------------------------------

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


def test_200_concurrent_fetches_and_decodes_share_a_bounded_pool(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
    files = {name: (CORPUS / name).read_bytes() for name in CONCURRENT_IMAGES}
    expected = {name: vllm_load(data) for name, data in files.items()}
    names = [CONCURRENT_IMAGES[i % len(CONCURRENT_IMAGES)] for i in range(200)]

    async def one(fetcher: Fetcher, server: Any, name: str) -> np.ndarray:
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

    asyncio.run(main())


def test_200_concurrent_url_publishes_read_back_over_nixl(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())


class SmallPoolFetcher(Fetcher):
    MAX_CONNECTIONS = 8
    MAX_CONNECTIONS_PER_HOST = 4


def test_connection_limit_is_enforced(serve: Callable[..., Any]) -> None:
    async def main() -> None:
        async with serve() as server, SmallPoolFetcher(allow_private=True, timeout=60.0) as fetcher:
            server.delay = 0.05
            await asyncio.gather(*(fetcher.fetch(server.url("/img/hopper.png")) for _ in range(40)))
            assert len(server.log) == 40
            assert 2 <= server.max_in_flight <= 4
            assert len(server.peers) <= 4

    asyncio.run(main())


# -- fairness --------------------------------------------------------------------------


def test_a_trickling_body_fails_at_the_total_deadline(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())


def test_name_resolution_does_not_wait_behind_a_busy_default_executor(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())
