"""Prometheus metrics, one set for both sides: ``pixelwire_frontend_*`` on the
frontend's ``/metrics`` and ``pixelwire_worker_*`` on vLLM's own ``/metrics``
(the plug-in registers them in prometheus_client's default registry)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from time import perf_counter

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ImageMetrics:
    """Images handled, pixel bytes, decode (or read) seconds, publish→read
    latency, pool bytes in use and errors by type, for one role.

    ``path`` labels say how an image went: ``nixl`` (decoded at the frontend,
    read over NIXL), ``url`` (fetched and decoded natively by this process),
    ``passthrough`` (frontend left it to the worker) or ``vllm`` (handed to
    vLLM's own loader)."""

    def __init__(
        self,
        role: str,
        registry: CollectorRegistry,
        pool_bytes: Callable[[], float],
        *,
        reads: bool = False,
    ) -> None:
        prefix = f"pixelwire_{role}"
        self.images = Counter(f"{prefix}_images", "Images handled, by path", ["path"], registry=registry)
        self.pixel_bytes = Counter(
            f"{prefix}_pixel_bytes",
            "Pixel bytes handled (as shipped or handed on, after any model-aware resize), by path",
            ["path"],
            registry=registry,
        )
        self.source_pixel_bytes = Counter(
            f"{prefix}_source_pixel_bytes",
            "Pixel bytes of the same images at their decoded size, before any model-aware resize",
            ["path"],
            registry=registry,
        )
        self.decode_seconds = Histogram(
            f"{prefix}_decode_seconds",
            "Seconds to fetch and decode (frontend, url path) or to read over NIXL (worker, nixl path)",
            ["path"],
            buckets=_SECONDS,
            registry=registry,
        )
        # Only the reading side sees both ends of that interval.
        self.publish_to_read_seconds = (
            Histogram(
                f"{prefix}_publish_to_read_seconds",
                "Seconds from the frontend publishing an image to the worker holding its pixels",
                buckets=_SECONDS,
                registry=registry,
            )
            if reads
            else None
        )
        self.pool_bytes_in_use = Gauge(
            f"{prefix}_pool_bytes_in_use", "Bytes of NIXL-registered pool held by images", registry=registry
        )
        self.pool_bytes_in_use.set_function(pool_bytes)
        self.errors = Counter(f"{prefix}_errors", "Errors, by exception type", ["type"], registry=registry)

    def handled(self, path: str, nbytes: int, source_nbytes: int | None = None) -> None:
        """One image: `nbytes` of pixels shipped, `source_nbytes` (default
        the same) at its decoded size."""
        self.images.labels(path=path).inc()
        self.pixel_bytes.labels(path=path).inc(nbytes)
        self.source_pixel_bytes.labels(path=path).inc(nbytes if source_nbytes is None else source_nbytes)

    def failed(self, error: BaseException) -> None:
        self.errors.labels(type=type(error).__name__).inc()

    def observe(self, path: str, seconds: float) -> None:
        """One image's fetch and decode (or read) took `seconds`."""
        self.decode_seconds.labels(path=path).observe(seconds)

    @contextlib.contextmanager
    def timed(self, path: str) -> Iterator[None]:
        start = perf_counter()
        yield
        self.observe(path, perf_counter() - start)
