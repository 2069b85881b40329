"""The plug-in's cache of images it handed vLLM
(`python/pixelwire/caches/worker_images.py`): least recently used out first
within its byte budget, copies in and out, off at 0, and the stats its
metrics show. (Its use by the connector: tests/e2e/test_connector.py.)"""

from __future__ import annotations

from PIL import Image

from pixelwire.caches.worker_images import ImageCache


def _image(value: int) -> Image.Image:
    return Image.new("RGB", (4, 4), (value, value, value))


def test_least_recently_used_go_first_within_the_budget() -> None:
    cache = ImageCache(budget=100)
    for key in "abc":
        cache.put(key, _image(ord(key)), 40, extra=key)
    assert cache.get("a") is None, "a went to make room for c"
    kept = cache.get("b")
    assert kept is not None and kept[1] == "b"
    cache.put("d", _image(1), 40)
    assert cache.get("c") is None and cache.get("b") is not None, "b was used after c"
    assert cache.held_bytes <= 100 and len(cache.images) == 2
    cache.put("huge", _image(2), 101)
    assert cache.get("huge") is None and cache.held_bytes <= 100


def test_images_go_in_and_come_out_as_copies() -> None:
    """What one request's vLLM does to its image never reaches the next's."""
    cache = ImageCache(budget=1000)
    original = _image(7)
    cache.put("k", original, 48)
    original.putpixel((0, 0), (0, 0, 0))
    first = cache.get("k")
    assert first is not None
    first[0].putpixel((1, 1), (0, 0, 0))
    second = cache.get("k")
    assert second is not None and second[0].getpixel((0, 0)) == second[0].getpixel((1, 1)) == (7, 7, 7)
    assert (cache.hits, cache.misses) == (2, 0)


def test_a_budget_of_zero_keeps_nothing() -> None:
    cache = ImageCache(budget=0)
    assert not cache.enabled
    cache.put("k", _image(1), 1)
    assert cache.get("k") is None and not cache.images


def test_its_stats_count_hits_misses_evictions_and_bytes() -> None:
    cache = ImageCache(budget=100)
    for key in "abc":
        cache.put(key, _image(ord(key)), 40)
    assert cache.get("a") is None and cache.get("c") is not None
    stats = cache.stats()
    assert {k: stats[k] for k in ("hits", "misses", "evictions", "bytes", "budget")} == {
        "hits": 1, "misses": 1, "evictions": 1, "bytes": 80, "budget": 100,
    }  # fmt: skip
    assert stats["data_url_hits"] == 0 and stats["data_url_bytes"] == 0
