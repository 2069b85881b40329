"""Fixtures shared by the test files of more than one module."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import pytest


def _random_png(width: int, height: int, seed: int = 0) -> bytes:
    from PIL import Image  # only where a test asks for one: the vLLM group's venv loads this file too

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


@pytest.fixture
def random_png() -> Callable[..., bytes]:
    """``random_png(width, height, seed=0)``: an RGB PNG of random pixels,
    which no codec shrinks, so its decode does real work for its size."""
    return _random_png


@pytest.fixture(scope="session")
def video_clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Every test video of ``video_clips.CLIPS`` by name, made once per session."""
    import video_clips

    return video_clips.make_all(video_clips.CLIPS, tmp_path_factory.mktemp("videos"))


@pytest.fixture(scope="session")
def bad_videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """``video_clips.BAD_SOURCES`` by name (audio only, zero frames, codecs
    pixelwire does not decode, an mp4 with its index at the end)."""
    import video_clips

    return video_clips.make_all(video_clips.BAD_SOURCES, tmp_path_factory.mktemp("bad_videos"))
