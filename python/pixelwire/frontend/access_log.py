"""The frontend's access log (``--access-log``, ``PIXELWIRE_ACCESS_LOG=1``):
one line a request on the ``pixelwire.frontend.access`` logger, once its
answer is over: method, path, status, bytes of the answer, milliseconds and
the number of media the request carried. Never its body, its query string
or a header (``Authorization`` carries the API key)."""

from __future__ import annotations

import contextvars
import logging
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from aiohttp import web

log = logging.getLogger("pixelwire.frontend.access")

# Paths are cut to this many characters: a client chooses them.
PATH_CHARS = 200


@dataclass
class AccessRecord:
    """What a request's handlers learn for its log line."""

    media: int = 0


# The record of the request being handled: set by the middleware as the
# request begins, and a connection's requests are handled one at a time.
_current: contextvars.ContextVar[AccessRecord | None] = contextvars.ContextVar(
    "pixelwire_access_record", default=None
)


def note_media(count: int) -> None:
    """The request being handled carries ``count`` media (a no-op when the
    access log is off)."""
    record = _current.get()
    if record is not None:
        record.media = count


@web.middleware
async def access_log(request: web.Request, handler: Any) -> web.StreamResponse:
    """Logs the request's line once its answer is over, or once it failed
    (status ``-``: the client went away, or a stream broke mid-way)."""
    started = perf_counter()
    record = AccessRecord()
    _current.set(record)
    response: web.StreamResponse | None = None
    try:
        response = await handler(request)
        return response
    finally:
        log.info(
            "%s %s %s %d bytes %.1f ms %d media",
            request.method,
            request.rel_url.raw_path[:PATH_CHARS],
            response.status if response is not None else "-",
            _answer_bytes(response),
            (perf_counter() - started) * 1000,
            record.media,
        )


def _answer_bytes(response: web.StreamResponse | None) -> int:
    """Bytes of the answer's body: as sent for a streamed (relayed) answer,
    the body's own length for one the frontend made (sent after this)."""
    if response is None:
        return 0
    if response.prepared:
        return int(response.body_length)
    if isinstance(response, web.Response) and isinstance(response.body, (bytes, bytearray)):
        return len(response.body)
    return int(response.content_length or 0)
