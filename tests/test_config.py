"""Settings from the environment: sizes with units through one parser, the
access log's switch, and the caches' defaults."""

from __future__ import annotations

import pytest

from pixelwire import config


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
    assert config.parse_bytes(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "-1", "1 gallon", "1GiBB", "1e9", "0x10"])
def test_anything_else_is_not_a_size(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        config.parse_bytes(text)


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
    assert config.FrontendConfig.from_env("http://u").access_log is False
    assert config.FrontendConfig.from_env("http://u", access_log=True).access_log is True
    monkeypatch.setenv("PIXELWIRE_ACCESS_LOG", "1")
    assert config.FrontendConfig.from_env("http://u").access_log is True


def test_the_frontend_cache_is_on_by_default_and_takes_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--cache-bytes`` beats ``PIXELWIRE_CACHE_BYTES``, which beats the default; 0 is off."""
    monkeypatch.delenv("PIXELWIRE_CACHE_BYTES", raising=False)
    assert config.FrontendConfig.from_env("http://u").cache_bytes == config.CACHE_BYTES > 0
    monkeypatch.setenv("PIXELWIRE_CACHE_BYTES", "32MiB")
    assert config.FrontendConfig.from_env("http://u").cache_bytes == 32 << 20
    assert config.FrontendConfig.from_env("http://u", cache_bytes=0).cache_bytes == 0


def test_the_frontend_cache_defaults_to_at_most_half_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A smaller pool alone keeps room for the images in flight; a cache
    given explicitly is kept as given (the CLI refuses one over the pool)."""
    monkeypatch.delenv("PIXELWIRE_CACHE_BYTES", raising=False)
    monkeypatch.delenv("PIXELWIRE_POOL_BYTES", raising=False)
    assert config.FrontendConfig.from_env("http://u", pool_bytes=64 << 20).cache_bytes == 32 << 20
    monkeypatch.setenv("PIXELWIRE_POOL_BYTES", "64MiB")
    assert config.FrontendConfig.from_env("http://u").cache_bytes == 32 << 20
    assert config.FrontendConfig.from_env("http://u", cache_bytes=48 << 20).cache_bytes == 48 << 20


def test_the_worker_cache_is_on_by_default_and_takes_units(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chat clients resend every earlier image each turn: the plug-in keeps
    them unless PIXELWIRE_WORKER_CACHE_BYTES=0 turns its cache off."""
    monkeypatch.delenv("PIXELWIRE_WORKER_CACHE_BYTES", raising=False)
    assert config.worker_cache_bytes_from_env() == config.WORKER_CACHE_BYTES == 1 << 30
    monkeypatch.setenv("PIXELWIRE_WORKER_CACHE_BYTES", "256MiB")
    assert config.worker_cache_bytes_from_env() == 256 << 20
    monkeypatch.setenv("PIXELWIRE_WORKER_CACHE_BYTES", "0")
    assert config.worker_cache_bytes_from_env() == 0
