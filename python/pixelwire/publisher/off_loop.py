"""Publish calls off the event loop: the threads image publishes wait on
(:func:`publish_executor`), and the one way any publish, image or video,
runs there and is cancelled (:func:`off_loop`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import TypeVar

from pixelwire import _native
from pixelwire.config import PUBLISH_CALLS

T = TypeVar("T")

_executor_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None


def publish_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The threads publish calls wait on (GIL released) while the native
    pool decodes: their own, so that publishing never waits for, nor fills,
    the event loop's default executor that other work (parsing bodies,
    reads) uses."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(PUBLISH_CALLS, "pixelwire-publish")
        return _executor


async def off_loop(
    native: _native.NativePublisher,
    executor: concurrent.futures.Executor,
    call: Callable[[], T],
    control: _native.BatchControl,
    release: Callable[[T], None],
) -> T:
    """``call`` (a publish under ``control``) on ``executor``. When the
    caller goes away first, ``control`` is cancelled: what was published
    by then is freed, work waiting for a slot or a turn stops and work not
    started is skipped, and what the call still publishes is freed by
    ``release`` as soon as it returns (a second free of a slot is a no-op,
    by its generation)."""
    work = asyncio.get_running_loop().run_in_executor(executor, call)
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        native.cancel(control)
        work.add_done_callback(functools.partial(_release_result, release))
        raise


def _release_result(release: Callable[[T], None], work: asyncio.Future[T]) -> None:
    if not work.cancelled() and work.exception() is None:
        release(work.result())
