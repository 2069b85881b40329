"""Fixtures shared by the test files of more than one module."""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

if TYPE_CHECKING:
    from pixelwire.publisher_process import PublisherProcess

MiB = 1024 * 1024

# The test running now, for `make test-core` and `make test-vllm` to name
# when the process dies outright (a native abort): CI keeps only the tail of
# the output, which is then the bottom of a stack dump.
_RUNNING_TEST = Path(__file__).resolve().parent.parent / "target" / "pytest-running-test"


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _RUNNING_TEST.parent.mkdir(exist_ok=True)
    _RUNNING_TEST.write_text(nodeid + "\n")


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    # A test that ended is not the one a dead process was running.
    _RUNNING_TEST.unlink(missing_ok=True)


def _random_png(width: int, height: int, seed: int = 0, *, noise: bool = True) -> bytes:
    from PIL import Image  # only where a test asks for one: the vLLM group's venv loads this file too

    rng = np.random.default_rng(seed)
    if noise:
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    else:
        pixels = np.full((height, width, 3), rng.integers(0, 256, 3, dtype=np.uint8), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


@pytest.fixture
def random_png() -> Callable[..., bytes]:
    """``random_png(width, height, seed=0, *, noise=True)``: an RGB PNG of
    random pixels, which no codec shrinks, so its decode does real work for
    its size; with ``noise=False`` one random colour, which compresses to
    almost nothing however many pixels it holds."""
    return _random_png


def _ppm_of_size(size: int, seed: int = 0) -> bytes:
    pixels = size // 3
    width = next(w for w in range(int(pixels**0.5), 0, -1) if pixels % w == 0) if pixels else 1
    height = pixels // width
    body = np.random.default_rng(seed).integers(0, 256, width * height * 3, dtype=np.uint8)
    return f"P6\n{width} {height}\n255\n".encode() + body.tobytes()


@pytest.fixture
def ppm_of_size() -> Callable[..., bytes]:
    """``ppm_of_size(size, seed=0)``: a binary PPM whose decoded RGB pixels
    are exactly ``size`` bytes (a multiple of 3) of random values: a read of
    any size, odd ones included, for the cost of a copy to decode."""
    return _ppm_of_size


def _wait_for(predicate: Callable[[], Any], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def qwen2_vl_folder(tmp_path: Path) -> Callable[..., str]:
    """``qwen2_vl_folder(model_type="qwen2_vl", **processor)``: a model folder
    with a Qwen2-VL config.json and preprocessor_config.json (Qwen's 12.8 MP
    budget, ``processor`` overriding its settings); returns its path."""

    def make(model_type: str = "qwen2_vl", **processor: Any) -> str:
        config = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2}
        config["size"] = {"shortest_edge": 3136, "longest_edge": 12845056}
        (tmp_path / "preprocessor_config.json").write_text(json.dumps({**config, **processor}))
        (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
        return str(tmp_path)

    return make


@pytest.fixture
def wait_for() -> Callable[..., bool]:
    """``wait_for(predicate, seconds=10.0)``: whether ``predicate()`` came
    true within ``seconds`` (what another process does lands when it lands)."""
    return _wait_for


@pytest.fixture
def start_publisher_process() -> Iterator[Callable[..., PublisherProcess]]:
    """``start_publisher_process(pool_bytes=64 MiB, lease=60.0, acquire=5.0,
    **options)``: a publisher in a child process (`PublisherProcess`), the
    other end of real NIXL reads; every one started is closed (killed if it
    will not exit) when the test ends."""
    from pixelwire.publisher_process import PublisherProcess

    started: list[PublisherProcess] = []

    def start(
        pool_bytes: int = 64 * MiB, lease: float = 60.0, acquire: float = 5.0, **options: Any
    ) -> PublisherProcess:
        process = PublisherProcess(pool_bytes=pool_bytes, lease=lease, acquire=acquire, **options)
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


@pytest.fixture
def publisher_process(start_publisher_process: Callable[..., PublisherProcess]) -> PublisherProcess:
    """A publisher in a child process with `start_publisher_process`'s defaults."""
    return start_publisher_process()


@pytest.fixture(scope="session")
def video_clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Every test video of ``video_clips.CLIPS`` by name, made once per session."""
    import video_clips

    # PIXELWIRE_TEST_VIDEOS: a folder of clips made beforehand, for a
    # machine without the ffmpeg CLI (the GPU machine).
    made = os.environ.get("PIXELWIRE_TEST_VIDEOS")
    return video_clips.make_all(video_clips.CLIPS, Path(made) if made else tmp_path_factory.mktemp("videos"))


@pytest.fixture(scope="session")
def long_video(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """``video_clips.LONG``'s clip: 3000 frames of 640x360 H.264."""
    import video_clips

    (clip,) = video_clips.make_all(video_clips.LONG, tmp_path_factory.mktemp("long_video")).values()
    return clip


@pytest.fixture(scope="session")
def video_bomb(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """``video_clips.VIDEO_BOMB``: a video bomb (1,500 1080p frames claiming
    1.5 ms) and a victim's 5 s 720p clip."""
    import video_clips

    made = os.environ.get("PIXELWIRE_TEST_VIDEOS")  # as video_clips'
    folder = Path(made) if made else tmp_path_factory.mktemp("video_bomb")
    return video_clips.make_all(video_clips.VIDEO_BOMB, folder)


@pytest.fixture(scope="session")
def corrupt_video(video_clips: dict[str, bytes]) -> bytes:
    """``h264_high_bframes.mp4`` with 2000 random bytes a third of the way
    in: some of its frames no longer decode, the others still do."""
    corrupt = bytearray(video_clips["h264_high_bframes.mp4"])
    at = len(corrupt) // 3
    corrupt[at : at + 2000] = np.random.default_rng(1).integers(0, 256, 2000, np.uint8).tobytes()
    return bytes(corrupt)


@pytest.fixture(scope="session")
def bad_videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """``video_clips.BAD_SOURCES`` by name (audio only, zero frames, codecs
    pixelwire does not decode, an mp4 with its index at the end)."""
    import video_clips

    return video_clips.make_all(video_clips.BAD_SOURCES, tmp_path_factory.mktemp("bad_videos"))


@pytest.fixture(scope="session")
def hostile_videos(video_clips: dict[str, bytes], bad_videos: dict[str, bytes]) -> dict[str, bytes]:
    """``video_clips.hostile``: truncated, corrupt, frameless, audio-only,
    claiming hours or 10^9 frames, an unknown codec, over 8K."""
    import video_clips as clips

    return clips.hostile(video_clips, bad_videos)
