"""Response bodies under the size cap: a declared Content-Length over it is
refused before reading, a stream at the cap, a gzip bomb after decoding the
cap (in bounded memory).
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

import pixelwire
from pixelwire.fetch import Fetcher

MIB = 1 << 20


def test_oversize_by_content_length_is_refused_before_reading(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())


def test_oversize_stream_is_refused_at_the_cap(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())


def test_gzip_bomb_is_refused_after_decoding_the_cap(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
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

    asyncio.run(main())
