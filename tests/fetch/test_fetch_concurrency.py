"""One caller's share of a Fetcher: a concurrency limit (a context, an explicit
semaphore, ``fetch_many``) bounds its fetches, its deadline covers the wait for
a slot, and a caller with many slow URLs cannot starve another.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

import pixelwire
from pixelwire.fetch import Fetcher

from reference import CORPUS


def test_concurrency_limit_bounds_one_callers_fetches(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())


def test_the_deadline_covers_the_wait_for_a_callers_slot(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())


def test_one_client_cannot_starve_another(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())
