"""The Fetcher's retries (``attempts``, ``retry_backoff``, ``retry_growth``;
:mod:`pixelwire.fetch.retries`):
what is safe to retry is retried with vLLM's back-off, nothing else is, and
one attempt (the default) never retries; a body over ``max_bytes`` is a
:class:`pixelwire.fetch.FetchTooLarge` however it arrives.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Any

import pytest

import pixelwire
from pixelwire import config
from pixelwire.fetch import Fetcher, FetchTooLarge

from reference import CORPUS

HOPPER = (CORPUS / "hopper.png").read_bytes()


@pytest.mark.parametrize("code", [500, 502, 503, 504, 429, 408])
def test_a_transient_http_status_is_retried(
    code: int, serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher(attempts=3, retry_backoff=0.01) as fetcher:
            assert await fetcher.fetch(server.url(f"/flaky/{code}/2")) == HOPPER
            assert server.log == [f"/flaky/{code}/2"] * 3

    asyncio.run(main())


def test_the_last_attempts_error_is_raised(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher(attempts=2, retry_backoff=0.01) as fetcher:
            with pytest.raises(pixelwire.FetchError, match="HTTP 503") as caught:
                await fetcher.fetch(server.url("/flaky/503/5"))
            assert caught.value.status == 503 and caught.value.retryable
            assert len(server.log) == 2

    asyncio.run(main())


@pytest.mark.parametrize("code", [400, 403, 404, 410])
def test_a_client_error_is_not_retried(
    code: int, serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher(attempts=3, retry_backoff=0.01) as fetcher:
            with pytest.raises(pixelwire.FetchError) as caught:
                await fetcher.fetch(server.url(f"/flaky/{code}/1"))
            assert caught.value.status == code and not caught.value.retryable
            assert len(server.log) == 1

    asyncio.run(main())


def test_a_late_answer_is_retried_with_a_longer_timeout(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
    """vLLM's growth: attempt n waits ``timeout * retry_growth**n``; the
    second attempt here gets 0.4 s * 4 against a first answer 0.8 s late."""

    async def main() -> None:
        async with serve() as server, open_fetcher(timeout=0.4, attempts=2, retry_backoff=0.01) as fetcher:
            assert await fetcher.fetch(server.url("/late-once/0.8")) == HOPPER
            assert len(server.log) == 2

    asyncio.run(main())


def test_the_back_off_grows_as_vllms(serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]) -> None:
    """``retry_backoff * retry_growth**n`` seconds before attempt n + 1: 0.1 then 0.4 s."""

    async def main() -> None:
        async with serve() as server, open_fetcher(attempts=3, retry_backoff=0.1, retry_growth=4) as fetcher:
            start = time.monotonic()
            await fetcher.fetch(server.url("/flaky/503/2"))
            assert 0.5 <= time.monotonic() - start < 2.0

    asyncio.run(main())


def test_what_is_refused_or_over_a_limit_is_never_retried(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
    async def main() -> None:
        async with serve() as server:
            async with Fetcher(attempts=3, retry_backoff=5.0) as guarded:
                start = time.monotonic()
                with pytest.raises(pixelwire.BlockedURL):
                    await guarded.fetch(server.url("/flaky/503/1"))
                assert time.monotonic() - start < 1.0
            async with open_fetcher(attempts=3, retry_backoff=5.0, max_bytes=1000) as small:
                start = time.monotonic()
                with pytest.raises(FetchTooLarge, match="over the limit of 1000 bytes"):
                    await small.fetch(server.url("/big-declared"))
                with pytest.raises(FetchTooLarge):
                    await small.fetch(server.url("/big-stream"))
                assert time.monotonic() - start < 2.0
            assert server.log == ["/big-declared", "/big-stream"]

    asyncio.run(main())


def test_one_attempt_is_the_default(serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]) -> None:
    """The frontend's fetches are not retried (its client decides)."""
    assert config.FETCH_ATTEMPTS == 1

    async def main() -> None:
        async with serve() as server, open_fetcher() as fetcher:
            assert fetcher.retries.attempts == 1
            with pytest.raises(pixelwire.FetchError, match="HTTP 503"):
                await fetcher.fetch(server.url("/flaky/503/1"))
            assert len(server.log) == 1

    asyncio.run(main())


def test_retry_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="attempts"):
        Fetcher(attempts=0)
    with pytest.raises(ValueError, match="retry"):
        Fetcher(retry_backoff=-1.0)
    with pytest.raises(ValueError, match="retry"):
        Fetcher(retry_growth=0.5)


def test_data_and_file_urls_over_the_limit_are_fetch_too_large(tmp_path: Any) -> None:
    (tmp_path / "big.png").write_bytes(HOPPER)
    url = "data:image/png;base64," + base64.b64encode(HOPPER).decode()

    async def main() -> None:
        async with Fetcher(max_bytes=1000, allowed_local_path=tmp_path) as fetcher:
            with pytest.raises(FetchTooLarge):
                await fetcher.fetch(url)
            with pytest.raises(FetchTooLarge):
                await fetcher.fetch((tmp_path / "big.png").as_uri())

    asyncio.run(main())
