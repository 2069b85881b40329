"""The metrics both sides report count an image's pixel bytes alike:
height x width x channels, whatever layout held or moved them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from pixelwire.metrics import ImageMetrics


def _metrics(role: str) -> tuple[ImageMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return ImageMetrics(role, registry, lambda: 0.0, lambda: 0.0), registry


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
