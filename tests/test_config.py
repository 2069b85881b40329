"""Settings from the environment: sizes with units through one parser, the
access log's switch, and the caches' defaults."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pixelwire
from pixelwire import config
from pixelwire._native import SLOT_HEADER_BYTES
from pixelwire.frontend.settings import FrontendConfig, frontend_video_limits
from pixelwire.sizes import parse_bytes


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("268435456", 268435456),
        ("512MiB", 512 << 20),
        ("1GiB", 1 << 30),
        ("1 GiB", 1 << 30),
        ("1gi", 1 << 30),
        ("64KiB", 64 << 10),
        ("1.5GiB", 3 << 29),
        ("2G", 2_000_000_000),
        ("2GB", 2_000_000_000),
        ("100kB", 100_000),
        ("1TiB", 1 << 40),
        ("7B", 7),
    ],
)
def test_sizes_take_binary_and_decimal_units(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "-1", "1 gallon", "1GiBB", "1e9", "0x10"])
def test_anything_else_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes(text)


def test_size_variables_take_units_and_name_themselves_when_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIXELWIRE_POOL_BYTES", "1GiB")
    monkeypatch.setenv("PIXELWIRE_READER_POOL_BYTES", "512MiB")
    assert config.PublisherSettings.from_env().pool_bytes == 1 << 30
    assert config.ReaderSettings.from_env().pool_bytes == 512 << 20
    monkeypatch.setenv("PIXELWIRE_REGION_BYTES", "lots")
    with pytest.raises(ValueError, match="PIXELWIRE_REGION_BYTES"):
        config.PublisherSettings.from_env()
    monkeypatch.setenv("PIXELWIRE_MAX_VIDEO_BYTES", "64MiB")
    monkeypatch.setenv("PIXELWIRE_MAX_VIDEO_FRAME_BYTES", "2GiB")
    limits = config.video_limits_from_env()
    assert (limits.max_bytes, limits.max_frame_bytes) == (64 << 20, 2 << 30)


def test_the_access_log_is_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIXELWIRE_ACCESS_LOG", raising=False)
    assert FrontendConfig.from_env("http://u").access_log is False
    assert FrontendConfig.from_env("http://u", access_log=True).access_log is True
    monkeypatch.setenv("PIXELWIRE_ACCESS_LOG", "1")
    assert FrontendConfig.from_env("http://u").access_log is True


def test_the_frontend_cache_is_on_by_default_and_takes_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--cache-bytes`` beats ``PIXELWIRE_CACHE_BYTES``, which beats the default; 0 is off."""
    monkeypatch.delenv("PIXELWIRE_CACHE_BYTES", raising=False)
    assert FrontendConfig.from_env("http://u").publisher.cache_bytes == config.CACHE_BYTES > 0
    monkeypatch.setenv("PIXELWIRE_CACHE_BYTES", "32MiB")
    assert FrontendConfig.from_env("http://u").publisher.cache_bytes == 32 << 20
    assert config.PublisherSettings.for_frontend(cache_bytes=0).cache_bytes == 0


def test_the_frontend_cache_defaults_to_at_most_half_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A smaller pool alone keeps room for the images in flight; a cache
    given explicitly is kept as given (the CLI refuses one over the pool)."""
    monkeypatch.delenv("PIXELWIRE_CACHE_BYTES", raising=False)
    monkeypatch.delenv("PIXELWIRE_POOL_BYTES", raising=False)
    assert config.PublisherSettings.for_frontend(pool_bytes=64 << 20).cache_bytes == 32 << 20
    monkeypatch.setenv("PIXELWIRE_POOL_BYTES", "64MiB")
    assert FrontendConfig.from_env("http://u").publisher.cache_bytes == 32 << 20
    assert config.PublisherSettings.for_frontend(cache_bytes=48 << 20).cache_bytes == 48 << 20


def test_the_worker_cache_is_on_by_default_and_takes_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chat clients resend every earlier image each turn: the plug-in keeps
    them unless PIXELWIRE_WORKER_CACHE_BYTES=0 turns its cache off."""
    monkeypatch.delenv("PIXELWIRE_WORKER_CACHE_BYTES", raising=False)
    assert config.worker_cache_bytes_from_env() == config.WORKER_CACHE_BYTES == 1 << 30
    monkeypatch.setenv("PIXELWIRE_WORKER_CACHE_BYTES", "256MiB")
    assert config.worker_cache_bytes_from_env() == 256 << 20
    monkeypatch.setenv("PIXELWIRE_WORKER_CACHE_BYTES", "0")
    assert config.worker_cache_bytes_from_env() == 0


def test_the_frontend_hands_its_publisher_one_settings_object(monkeypatch: pytest.MonkeyPatch) -> None:
    """The publisher's settings are made once (the CLI's flags, else the
    environment) and handed on whole: every publisher variable reaches the
    frontend's publisher, PIXELWIRE_ACQUIRE_TIMEOUT too; a Publisher takes
    the object, or its fields by keyword."""
    monkeypatch.setenv("PIXELWIRE_ACQUIRE_TIMEOUT", "3.5")
    monkeypatch.setenv("PIXELWIRE_DECODE_AT", "worker")
    frontend = FrontendConfig.from_env("http://u")
    assert (frontend.publisher.acquire_timeout, frontend.decode_at) == (3.5, "worker")
    assert pixelwire.Publisher(frontend.publisher).settings == frontend.publisher
    assert pixelwire.Publisher(frontend.publisher, cache_bytes=0).settings.cache_bytes == 0
    assert pixelwire.Publisher(pool_bytes=1 << 20).settings.pool_bytes == 1 << 20
    with pytest.raises(ValueError, match="decode_at"):
        config.PublisherSettings(decode_at="elsewhere")  # type: ignore[arg-type]


def test_the_frontends_video_limits_are_made_once_within_the_pool() -> None:
    """--max-video-* given win over the defaults, and a video's frames fit
    in the videos' share of the pool, where they ship as one slot."""
    limits = frontend_video_limits(64 << 20, max_frames=12, max_seconds=None)
    assert (limits.max_frames, limits.max_seconds) == (12, config.FRONTEND_MAX_VIDEO_SECONDS)
    share = config.video_pool_bytes(64 << 20) - SLOT_HEADER_BYTES
    assert limits.max_frame_bytes == share < config.FRONTEND_MAX_VIDEO_FRAME_BYTES
    assert FrontendConfig.from_env("http://u").video_limits.max_bytes == config.FRONTEND_MAX_VIDEO_BYTES


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs to narrow the affinity to one",
)
def test_thread_defaults_follow_the_cpu_affinity() -> None:
    """The thread counts config derives from the cores count the CPUs the
    process may run on: a child narrowed to one CPU sees one."""
    script = (
        "import os\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from pixelwire import config\n"
        "print(config.usable_cpus(), config.HASH_THREADS, config.PUBLISH_THREADS,"
        " config.VIDEO_DECODE_CALLS)\n"
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert child.stdout.split() == ["1", "1", "1", "1"]
    assert config.usable_cpus() == len(os.sched_getaffinity(0))
