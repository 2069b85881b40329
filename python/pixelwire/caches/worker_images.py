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
patch rows, a numpy array, copied alike. A video's frames are kept in a
memory file and handed out as private copy-on-write mappings of it
(:mod:`pixelwire.caches.mapped_frames`), as independent as copies.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, Protocol

from pixelwire.caches.data_urls import DataUrlMemo
from pixelwire.caches.interface import counts
from pixelwire.config import data_url_memo_bytes, worker_cache_bytes_from_env


class Copyable(Protocol):
    """What the cache keeps: a PIL image or a numpy array (both ``.copy()``)."""

    def copy(self) -> Any: ...


class ImageCache:
    """Images by key, within ``budget`` bytes of pixels: a
    :class:`~pixelwire.caches.interface.Cache` keyed by what the plug-in
    names an image by (a reference's identity, a URL's bytes and options)."""

    def __init__(self, budget: int) -> None:
        self.budget = max(0, budget)
        # key -> (image, what else the caller keeps with it, bytes)
        self.images: OrderedDict[Hashable, tuple[Copyable, Any, int]] = OrderedDict()
        self.held_bytes = 0
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

    def __contains__(self, key: Hashable) -> bool:
        """Whether an image is kept for ``key`` (not counted as a lookup)."""
        with self._lock:
            return key in self.images

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
        self.keep(key, image.copy(), nbytes, extra)

    def keep(self, key: Hashable, kept: Copyable, nbytes: int, extra: Any = None) -> None:
        """Keeps `kept` itself, a copy the caller made and holds no more
        (e.g. a video's :class:`~pixelwire.caches.mapped_frames.MappedFrames`),
        as :meth:`put` keeps its copy; :meth:`get` hands out its ``.copy()``."""
        if not self.enabled or nbytes > self.budget:
            return
        with self._lock:
            old = self.images.pop(key, None)
            if old is not None:
                self.held_bytes -= old[2]
            self.images[key] = (kept, extra, nbytes)
            self.held_bytes += nbytes
            while self.held_bytes > self.budget:
                _, (_, _, gone) = self.images.popitem(last=False)
                self.held_bytes -= gone
                self.evictions += 1

    def clear(self) -> None:
        """Forgets every image, and the ``data:`` URLs beside them."""
        with self._lock:
            self.images.clear()
            self.held_bytes = 0
        self.data_urls.clear()

    def stats(self) -> dict[str, int]:
        """What the cache's metrics show (:class:`pixelwire.metrics.WorkerCacheMetrics`):
        its :func:`~pixelwire.caches.interface.counts` and evictions, and the
        memo's counts beside it (``data_url_*``)."""
        with self._lock:
            return {**counts(self), "evictions": self.evictions, **counts(self.data_urls, "data_url_")}


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
