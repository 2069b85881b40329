"""One caller's share of the fetcher: how many of its fetches run at once.

A caller (a frontend request) whose many slow URLs must not take the whole
connection pool runs its fetches under a limit, a semaphore. The limit a
:meth:`pixelwire.Fetcher.concurrency_limit` block sets lives in a context
variable, so every fetch started in the block, in tasks created there too
(they copy the context), waits for one of its slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterator

# The concurrency limit of the caller whose context a fetch runs in (see
# Fetcher.concurrency_limit); tasks copy it from the context that creates them.
_CALLER_LIMIT: contextvars.ContextVar[asyncio.Semaphore | None] = contextvars.ContextVar(
    "pixelwire_fetch_limit", default=None
)


def new_limit(max_concurrent: int) -> asyncio.Semaphore:
    """A limit of ``max_concurrent`` fetches at once; a positive int or ValueError."""
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
        raise ValueError(f"max_concurrent must be a positive int, not {max_concurrent!r}")
    return asyncio.Semaphore(max_concurrent)


@contextlib.contextmanager
def caller_limit_scope(limit: asyncio.Semaphore) -> Iterator[asyncio.Semaphore]:
    """``limit`` is the caller's limit inside the ``with`` block (replacing an outer one)."""
    token = _CALLER_LIMIT.set(limit)
    try:
        yield limit
    finally:
        _CALLER_LIMIT.reset(token)


def caller_limit() -> asyncio.Semaphore | None:
    """The limit of the caller whose context this runs in, if one is set."""
    return _CALLER_LIMIT.get()
