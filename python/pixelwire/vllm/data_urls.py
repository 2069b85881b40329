"""vLLM's own grammar for ``data:`` URLs, which the plug-in keeps.

RFC 2397 as vLLM 0.32 reads it (``MediaConnector._load_data_url``): a ``,``
after the header, the header's last parameter exactly ``base64`` (lower
case, no space), and the payload strict base64 (no line breaks, padded),
decoded by the decoder vLLM decodes it with. So a ``data:`` URL vLLM refuses
is refused here with vLLM's exception (``ValueError``: 400,
``NotImplementedError``: 501), and one it accepts is accepted. The
frontend's Fetcher is more lenient (``pixelwire.fetch``): there, nothing
behind it is stricter.
"""

from __future__ import annotations

import asyncio
from typing import Final

import pybase64  # vLLM's own dependency, and its data: URL decoder

# Payloads decoded off the event loop from this size on.
_THREAD_CHARS: Final = 1 << 20


def decode_data_url(url: str) -> bytes:
    """The bytes of a ``data:`` URL, or vLLM's exception for it."""
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise ValueError(f"Invalid data URL {url[:32]!r}: missing ',' separator.")
    _, semicolon, encoding = header.rpartition(";")
    if not semicolon or encoding != "base64":
        raise NotImplementedError("Only base64 data URLs are supported for now.")
    return pybase64.b64decode(payload, validate=True)


async def decode_data_url_async(url: str) -> bytes:
    """:func:`decode_data_url`, on a worker thread for a large URL."""
    if len(url) >= _THREAD_CHARS:
        return await asyncio.to_thread(decode_data_url, url)
    return decode_data_url(url)
