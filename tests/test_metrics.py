"""The metrics both sides report count an image's pixel bytes alike:
height x width x channels, whatever layout held or moved them; the
worker's cache shows its hits, misses, evictions and bytes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from pixelwire.metrics import MediaMetrics, WorkerCacheMetrics


def _metrics(role: str) -> tuple[MediaMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return MediaMetrics(role, registry, lambda: 0.0, lambda: 0.0), registry


def test_an_image_counts_one_byte_a_channel_at_both_sizes() -> None:
    metrics, registry = _metrics("frontend")
    metrics.handled_image("nixl", (100, 200, 3), (1000, 2000))
    metrics.handled_image("nixl", (10, 10, 1))
    value = registry.get_sample_value
    assert value("pixelwire_frontend_pixel_bytes_total", {"path": "nixl"}) == 100 * 200 * 3 + 100
    assert value("pixelwire_frontend_source_pixel_bytes_total", {"path": "nixl"}) == 1000 * 2000 * 3 + 100
    assert value("pixelwire_frontend_images_total", {"path": "nixl"}) == 2


def test_both_roles_help_states_the_one_convention() -> None:
    for role in ("frontend", "worker"):
        metrics, registry = _metrics(role)
        metrics.handled_image("nixl", (1, 1, 3))
        helps = [
            line
            for line in generate_latest(registry).decode().splitlines()
            if line.startswith("# HELP") and "pixel_bytes" in line
        ]
        assert len(helps) >= 2  # pixel_bytes and source_pixel_bytes
        for line in helps:
            assert "height x width x channels" in line and "4 bytes a pixel" not in line, line


def test_the_worker_cache_shows_hits_misses_evictions_and_bytes_at_each_scrape() -> None:
    stats = {"hits": 0, "misses": 0, "evictions": 0, "bytes": 0, "budget": 1 << 30}
    registry = CollectorRegistry()
    WorkerCacheMetrics(registry, lambda: dict(stats))
    value = registry.get_sample_value
    assert value("pixelwire_worker_cache_hits_total") == 0, "shown from the start"
    assert value("pixelwire_worker_cache_capacity_bytes") == 1 << 30
    stats.update(hits=3, misses=2, evictions=1, bytes=4096, data_url_hits=5, data_url_bytes=700)
    assert value("pixelwire_worker_cache_hits_total") == 3
    assert value("pixelwire_worker_cache_misses_total") == 2
    assert value("pixelwire_worker_cache_evictions_total") == 1
    assert value("pixelwire_worker_cache_bytes") == 4096
    assert value("pixelwire_worker_data_url_hits_total") == 5
    assert value("pixelwire_worker_data_url_bytes") == 700
