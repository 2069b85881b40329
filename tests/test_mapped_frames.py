"""A video's frames in the plug-in's cache
(`python/pixelwire/caches/mapped_frames.py`): kept in a memory file, each
hand-out a private mapping with the frames' bytes that is as independent
as a copy (a write to one reaches neither the cache nor another hand-out).
(What it saves, measured: docs/performance.md, multi-turn with one video.)"""

from __future__ import annotations

import numpy as np
import pytest

from pixelwire.caches.mapped_frames import MappedFrames, kept_frames
from pixelwire.caches.worker_images import ImageCache


def _frames(count: int = 4, height: int = 64, width: int = 48) -> np.ndarray:
    rng = np.random.default_rng(7)
    return rng.integers(0, 256, (count, height, width, 3), dtype=np.uint8)


def test_a_hand_out_has_the_frames_bytes_shape_and_dtype_and_is_writable() -> None:
    frames = _frames()
    kept = kept_frames(frames)
    assert isinstance(kept, MappedFrames)
    out = kept.copy()
    assert out.shape == frames.shape and out.dtype == frames.dtype and out.flags.writeable
    assert out.flags.c_contiguous and np.array_equal(out, frames)


def test_writes_reach_neither_the_cache_nor_another_hand_out() -> None:
    frames = _frames()
    kept = kept_frames(frames)
    frames[:] = 0  # the caller's array is not what is kept
    first, second = kept.copy(), kept.copy()
    first[0, :8] = 255
    second[-1] ^= 0xFF
    third = kept.copy()
    original = _frames()
    assert np.array_equal(third, original)
    assert np.array_equal(second[0], original[0]) and np.array_equal(first[-1], original[-1])


def test_a_hand_out_outlives_its_entry() -> None:
    """An entry evicted (its memory file closed) leaves the frames already
    handed out intact."""
    cache = ImageCache(budget=_frames().nbytes)
    cache.keep("a", kept_frames(_frames()), _frames().nbytes)
    held = cache.get("a")
    assert held is not None
    cache.keep("b", kept_frames(_frames(count=4, height=64, width=48) // 2), _frames().nbytes)
    assert cache.get("a") is None, "a went to make room for b"
    assert np.array_equal(held[0], _frames())


@pytest.mark.parametrize(
    "frames",
    [np.zeros((0, 4, 4, 3), np.uint8), np.array([object(), object()], dtype=object)],
    ids=["empty", "objects"],
)
def test_what_no_memory_file_can_hold_is_kept_as_a_plain_copy(frames: np.ndarray) -> None:
    kept = kept_frames(frames)
    assert isinstance(kept, np.ndarray) and kept is not frames
    assert kept.shape == frames.shape
