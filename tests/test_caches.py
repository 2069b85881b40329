"""Every cache behind one interface (`python/pixelwire/caches/interface.py`):
each names its key, keeps within its budget, says what it holds, and counts
its hits and misses the way the metrics read them. (What each keeps:
tests/test_publish_cache.py, tests/test_data_url_memo.py,
tests/test_vllm_image_cache.py.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from PIL import Image

from pixelwire.caches.data_urls import DataUrlMemo
from pixelwire.caches.interface import Cache, counts
from pixelwire.caches.published_images import PublishCache
from pixelwire.caches.worker_images import ImageCache

CACHES: dict[str, Callable[[], Cache[object]]] = {
    "published_images": lambda: PublishCache(1 << 20),
    "data_urls": lambda: DataUrlMemo(1 << 20),
    "worker_images": lambda: ImageCache(1 << 20),
}


@pytest.mark.parametrize("name", CACHES)
def test_every_cache_implements_the_one_interface(name: str) -> None:
    cache = CACHES[name]()
    assert isinstance(cache, Cache)
    assert counts(cache, "x_") == {"x_hits": 0, "x_misses": 0, "x_bytes": 0, "x_budget": 1 << 20}
    cache.clear()


def test_the_data_url_memo_counts_what_it_finds_and_what_it_does_not() -> None:
    memo = DataUrlMemo(1 << 20)
    url = "data:image/png;base64,YWJj"
    assert memo.lookup(url, None) is None
    memo.remember(url, None, b"abc")
    assert memo.lookup(url, None) == b"abc"
    assert (url, None) in memo and (url, "tenant") not in memo, "the key is the text and the salt"
    assert counts(memo) == {"hits": 1, "misses": 1, "bytes": len(url) + 3, "budget": 1 << 20}
    memo.clear()
    assert (url, None) not in memo and memo.held_bytes == 0


def test_the_worker_cache_counts_what_it_finds_and_clears() -> None:
    cache = ImageCache(100)
    cache.put("a", Image.new("RGB", (4, 4)), 40)
    assert "a" in cache and cache.get("b") is None and cache.get("a") is not None
    stats = cache.stats()
    assert {name: stats[name] for name in ("hits", "misses", "bytes", "budget")} == {
        "hits": 1, "misses": 1, "bytes": 40, "budget": 100,
    }  # fmt: skip
    cache.clear()
    assert "a" not in cache and cache.held_bytes == 0 and cache.data_urls.held_bytes == 0
