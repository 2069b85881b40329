"""vLLM's own grammar for ``data:`` URLs, which the plug-in keeps.

RFC 2397 as vLLM 0.32 reads it (``MediaConnector._load_data_url``, split by
:func:`pixelwire.loader_input.data_url_parts`): a ``,`` after the header,
the header's last parameter exactly ``base64`` (lower case, no space), and
the payload strict base64 (no line breaks, padded), decoded by the decoder
vLLM decodes it with. So a ``data:`` URL vLLM refuses
is refused here with vLLM's exception (``ValueError``: 400,
``NotImplementedError``: 501), and one it accepts is accepted. The
frontend's Fetcher is more lenient (``pixelwire.fetch``): there, nothing
behind it is stricter.
"""

from __future__ import annotations

import asyncio
from typing import Final

import pybase64  # vLLM's own dependency, and its data: URL decoder

from pixelwire.loader_input import data_url_parts

# Payloads decoded off the event loop from this size on.
_THREAD_CHARS: Final = 1 << 20


def decode_data_url(url: str) -> bytes:
    """The bytes of a ``data:`` URL, or vLLM's exception for it."""
    _, payload = data_url_parts(url)
    return strict_b64decode(payload)


def strict_b64decode(text: str) -> bytes:
    """Base64 decoded as vLLM decodes a ``data:`` URL's payload."""
    return pybase64.b64decode(text, validate=True)


async def decode_data_url_async(url: str) -> bytes:
    """:func:`decode_data_url`, on a worker thread for a large URL."""
    if len(url) >= _THREAD_CHARS:
        return await asyncio.to_thread(decode_data_url, url)
    return decode_data_url(url)
