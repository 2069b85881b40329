"""The private event loop vLLM's synchronous loaders run the plug-in's
coroutines on (:func:`run_sync`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

_sync_loop_lock = threading.Lock()
_sync_loop: asyncio.AbstractEventLoop | None = None


def run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Runs a coroutine for vLLM's synchronous loaders on one private loop
    thread, whether or not the caller is inside an event loop."""
    global _sync_loop
    with _sync_loop_lock:
        if _sync_loop is None:
            _sync_loop = asyncio.new_event_loop()
            threading.Thread(target=_sync_loop.run_forever, name="pixelwire-sync", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coro, _sync_loop).result()
