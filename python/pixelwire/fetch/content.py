"""Reading a response body under a size cap, gzip and deflate decoded.

The body is refused as soon as it is over the fetcher's ``max_bytes``, counted
after decoding: a declared ``Content-Length`` over it before anything is read,
a stream once it passes it, and a compressed body once its output does, so a
small compression bomb never expands in memory. Concatenated gzip members are
decoded in turn; a raw deflate stream sent as ``deflate`` is accepted too.
"""

from __future__ import annotations

import zlib
from typing import Final

import aiohttp
from yarl import URL

from pixelwire._native import FetchError
from pixelwire.fetch.errors import describe, error, too_large

_CHUNK: Final = 64 * 1024


class _Inflater:
    """Incremental gzip/deflate decoding whose output is capped (no compression bombs).

    ``feed`` never returns more than ``room + 1`` bytes, however much its
    input would expand, so the caller sees an overrun after one byte too many
    and stops. Concatenated gzip members are decoded in turn; anything else
    after the end of the stream is ignored.
    """

    def __init__(self, encoding: str) -> None:
        self._gzip = encoding != "deflate"
        self._obj: zlib._Decompress | None = None
        self._carry = b""  # the start of a stream or member, too short to recognise yet
        self._ended = False

    def _start(self, data: bytes) -> bool:
        """Starts the next stream or gzip member at ``data``; False when it cannot (yet)."""
        if len(data) < 2:
            self._carry = data
            return False
        if self._gzip:
            if data[:2] != b"\x1f\x8b":
                if self._obj is None:
                    raise error(FetchError, "gzip body does not start with a gzip header")
                self._ended = True  # trailing bytes after the last member
                return False
            wbits = zlib.MAX_WBITS | 16
        else:
            if self._obj is not None:
                self._ended = True
                return False
            # RFC 9110's "deflate" is zlib-wrapped, but some servers send a
            # raw deflate stream; a zlib header is recognisable from two bytes.
            zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
        self._obj = zlib.decompressobj(wbits)
        return True

    def feed(self, data: bytes, room: int) -> list[bytes]:
        out: list[bytes] = []
        budget = room + 1
        pending, self._carry = self._carry + data, b""
        while pending and budget > 0 and not self._ended:
            if (self._obj is None or self._obj.eof) and not self._start(pending):
                break
            obj = self._obj
            assert obj is not None
            try:
                chunk = obj.decompress(pending, budget)
            except zlib.error:
                raise error(FetchError, "corrupt compressed body") from None
            budget -= len(chunk)
            if chunk:
                out.append(chunk)
            # After the end of a stream the rest of the input is in unused_data;
            # before it, input left over by the output cap is in unconsumed_tail.
            pending = obj.unused_data if obj.eof else obj.unconsumed_tail
        return out

    @property
    def complete(self) -> bool:
        return self._obj is not None and self._obj.eof and not self._carry


async def read_body(response: aiohttp.ClientResponse, url: URL, limit: int) -> bytes:
    """The body of ``response``, decoded when gzip or deflate encoded; refused
    once it is over ``limit`` bytes (after decoding), before reading it all."""
    encoding = response.headers.get("Content-Encoding", "").strip().lower()
    inflater: _Inflater | None
    if encoding in ("", "identity"):
        inflater = None
        length = response.content_length
        if length is not None and length > limit:
            raise too_large(f"Content-Length {length} is over the limit of {limit} bytes: {describe(url)}")
    elif encoding in ("gzip", "x-gzip", "deflate"):
        inflater = _Inflater(encoding)
    else:
        raise error(FetchError, f"unsupported Content-Encoding {encoding[:40]!r}: {describe(url)}")
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.content.iter_chunked(_CHUNK):
        if inflater is None:
            total += len(chunk)
            chunks.append(chunk)
        else:
            for piece in inflater.feed(chunk, limit - total):
                total += len(piece)
                chunks.append(piece)
        if total > limit:
            decoded = " after decoding" if inflater is not None else ""
            where = describe(url)
            raise too_large(f"body is over the limit of {limit} bytes{decoded}: {where}")
    if inflater is not None and not inflater.complete:
        raise error(FetchError, f"truncated {encoding} body: {describe(url)}", retryable=True)
    return b"".join(chunks)
