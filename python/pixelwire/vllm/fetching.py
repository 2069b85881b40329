"""The plug-in's fetches of vLLM's media: one guarded Fetcher per event
loop and setting, with vLLM's own media settings
(:class:`~pixelwire.vllm.media_settings.VllmMediaSettings`)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pixelwire.config import allow_private_from_env
from pixelwire.fetch import Fetcher
from pixelwire.fetch.addresses import DEPLOYMENT_PRIVATE_HINT
from pixelwire.vllm.media_settings import VllmMediaSettings

_fetchers_lock = threading.Lock()
_fetchers: dict[tuple[Any, ...], Fetcher] = {}


def media_fetcher(
    domains: list[str] | None,
    local_path: Any,
    timeout: float | None = None,
    medium_max_bytes: int | None = None,
) -> Fetcher:
    """One Fetcher per event loop and setting: vLLM's (allowed domains,
    local path, timeout: vLLM's image fetch timeout unless another is given,
    attempts, download size limit and the medium's own, redirects) and
    PIXELWIRE_ALLOW_PRIVATE."""
    allow_private = allow_private_from_env()
    settings = VllmMediaSettings.from_env()
    timeout = float(settings.image_timeout if timeout is None else timeout)
    max_bytes = settings.body_limit(medium_max_bytes)
    # A Fetcher's HTTP session belongs to one event loop: vLLM's, or the sync one.
    loop = asyncio.get_running_loop()
    key = (loop, tuple(domains or ()), str(local_path or ""), timeout, max_bytes, allow_private, settings)
    with _fetchers_lock:
        fetcher = _fetchers.get(key)
        if fetcher is None:
            fetcher = Fetcher(
                timeout=timeout,
                max_bytes=max_bytes,
                max_redirects=3 if settings.allow_redirects else 0,
                attempts=settings.attempts,
                allowed_domains=domains or None,
                allow_private=allow_private,
                allowed_local_path=local_path,
                private_hint=DEPLOYMENT_PRIVATE_HINT,
            )
            _fetchers[key] = fetcher
        return fetcher


async def close_fetchers() -> None:
    """Closes the running loop's Fetchers (their HTTP sessions): for a loop
    that is about to end. vLLM's own loops live as long as the process."""
    loop = asyncio.get_running_loop()
    with _fetchers_lock:
        mine = [key for key in _fetchers if key[0] is loop]
        closing = [_fetchers.pop(key) for key in mine]
    for fetcher in closing:
        await fetcher.close()
