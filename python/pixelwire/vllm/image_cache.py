"""The plug-in's cache of images it handed vLLM: a repeated reference (the
same signed identity and content hash) or, in worker mode, a repeated URL's
same bytes is served from here instead of READ or decoded again, and a
resent ``data:`` URL of the same text is not even base64-decoded or hashed
again (:attr:`ImageCache.data_urls`; a resent image's reference,
:mod:`pixelwire.resent_reference`, finds its bytes there).

Bounded by ``PIXELWIRE_WORKER_CACHE_BYTES`` (0: off), least recently used
out first. Each image is kept as a copy (an image read over NIXL maps the
reader's receive memory, which must go back to its pool) and handed out as
a copy, so nothing vLLM does to one request's image reaches another's. A
processed image (:mod:`pixelwire.vllm.processed_inputs`) is kept as its
patch rows, a numpy array, copied alike.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, Protocol

from pixelwire.config import data_url_memo_bytes, worker_cache_bytes_from_env
from pixelwire.data_url_memo import DataUrlMemo


class Copyable(Protocol):
    """What the cache keeps: a PIL image or a numpy array (both ``.copy()``)."""

    def copy(self) -> Any: ...


class ImageCache:
    """Images by key, within ``budget`` bytes of pixels."""

    def __init__(self, budget: int) -> None:
        self.budget = max(0, budget)
        # key -> (image, what else the caller keeps with it, bytes)
        self.images: OrderedDict[Hashable, tuple[Copyable, Any, int]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        # vLLM may load a request's media on several threads.
        self._lock = threading.Lock()
        # Worker mode's data: URLs behind the kept images: a resent one is
        # neither base64-decoded nor hashed again (unsalted, as the keys are).
        self.data_urls = DataUrlMemo(data_url_memo_bytes(self.budget))

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def get(self, key: Hashable) -> tuple[Any, Any] | None:
        """A copy of the image kept for `key` and what was kept with it, or None."""
        with self._lock:
            kept = self.images.get(key)
            if kept is None:
                self.misses += 1
                return None
            self.images.move_to_end(key)
            self.hits += 1
        return kept[0].copy(), kept[1]

    def put(self, key: Hashable, image: Copyable, nbytes: int, extra: Any = None) -> None:
        """Keeps a copy of `image` (`nbytes` of pixels), and `extra`, unless
        it alone is over the budget; the least recently used go to make room."""
        if not self.enabled or nbytes > self.budget:
            return
        kept = image.copy()
        with self._lock:
            old = self.images.pop(key, None)
            if old is not None:
                self.bytes -= old[2]
            self.images[key] = (kept, extra, nbytes)
            self.bytes += nbytes
            while self.bytes > self.budget:
                _, (_, _, gone) = self.images.popitem(last=False)
                self.bytes -= gone
                self.evictions += 1

    def stats(self) -> dict[str, int]:
        """What the cache's metrics show (:class:`pixelwire.metrics.WorkerCacheMetrics`)."""
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
                "bytes": self.bytes,
                "budget": self.budget,
                "data_url_hits": self.data_urls.hits,
                "data_url_bytes": self.data_urls.held,
            }


_lock = threading.Lock()
_cache: ImageCache | None = None


def worker_image_cache() -> ImageCache:
    """The process's cache, sized by ``PIXELWIRE_WORKER_CACHE_BYTES`` when first used."""
    global _cache
    with _lock:
        if _cache is None:
            _cache = ImageCache(worker_cache_bytes_from_env())
        return _cache


def reset_worker_image_cache() -> None:
    """Forgets the cache (the next use sizes a new one from the environment)."""
    global _cache
    with _lock:
        _cache = None
