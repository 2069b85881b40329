"""Prometheus metrics, one set for both sides: ``pixelwire_frontend_*`` on the
frontend's ``/metrics`` and ``pixelwire_worker_*`` on vLLM's own ``/metrics``
(the plug-in registers them in prometheus_client's default registry)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from time import perf_counter
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pixelwire.handshake import INFO_LABELS, INFO_METRIC

_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


# Each metric's help, for each role: what the code counts there.
_HELP = {
    "images": {
        "frontend": "Images handled, by path: nixl (decoded here and published; counted when published, "
        "whatever the worker then does with it: see pixelwire_frontend_images_refused_upstream) or "
        "passthrough (left to the worker: worker mode, or a mode or format pixelwire does not decode)",
        "worker": "Images handled, by path: nixl (read over NIXL), url (fetched and decoded natively) "
        "or vllm (handed to vLLM's own loader)",
    },
    "pixel_bytes": {
        "frontend": "Pixel bytes published, by path, at the size shipped (after any model-aware resize), "
        "counted at one byte a channel: height x width x channels (3 a pixel for RGB, whatever layout "
        "the pool holds them in; processed inputs: their patch rows' bytes, 6 a pixel for Qwen2-VL); 0 "
        "for passthrough",
        "worker": "Pixel bytes handled, by path (read over NIXL on nixl, decoded here on url), at the "
        "size handed to vLLM (after any model-aware resize), counted at one byte a channel: height x "
        "width x channels (3 a pixel for RGB, whatever layout moved them; processed inputs: their patch "
        "rows' bytes); 0 for vllm",
    },
    "source_pixel_bytes": {
        "frontend": "Pixel bytes of the same images at their decoded size, before any model-aware resize, "
        "counted as pixel_bytes (height x width x channels)",
        "worker": "Pixel bytes of the same images at their decoded size, before any model-aware resize, "
        "counted as pixel_bytes (height x width x channels)",
    },
    "decode_seconds": {
        "frontend": "Seconds per published image (path nixl), from the start of its fetch to the end of "
        "its decode and publish (the batch it was decoded in)",
        "worker": "Seconds per image: the READ over NIXL (path nixl), or the native decode of a fetched "
        "URL (path url; the fetch itself not included)",
    },
    "pool_bytes_in_use": {
        "frontend": "Bytes of the publisher's NIXL-registered pool held by published images",
        "worker": "Bytes of the reader's NIXL-registered receive pool held by images being read",
    },
    "pool_bytes_capacity": {
        "frontend": "Bytes the publisher's pool may grow to (--pool-bytes): with pool_bytes_in_use, how "
        "full it is",
        "worker": "Bytes the reader's receive pool may grow to (PIXELWIRE_READER_POOL_BYTES): with "
        "pool_bytes_in_use, how full it is",
    },
    "videos": {
        "frontend": "Videos handled, by path: nixl (sampled, decoded here and published) or passthrough "
        "(left to the worker's vLLM loader: worker mode, or a codec, container or sampling pixelwire "
        "does not reproduce)",
        "worker": "Videos handled, by path: nixl (frames read over NIXL), url (fetched and decoded "
        "natively) or vllm (handed to vLLM's own loader)",
    },
    "video_frame_bytes": {
        "frontend": "Bytes of the sampled RGB frames published (3 bytes a pixel); 0 for passthrough",
        "worker": "Bytes of the sampled RGB frames handled (3 bytes a pixel), read over NIXL or decoded; "
        "0 for vllm",
    },
    "media": {
        "frontend": "Media handled, by medium (its registered name: image, processed_image, video, "
        "processed_video, or a medium registered since) and path, as the medium's own metrics count them",
        "worker": "Media handled, by medium (its registered name: image, processed_image, video, "
        "processed_video, or a medium registered since) and path, as the medium's own metrics count them",
    },
    "errors": {
        "frontend": "Requests refused for one of their media, by the exception type of the first that failed",
        "worker": "Media that failed in the plug-in (an image refused, or a fetch, READ or decode that "
        "failed; video and audio fetches too), by exception type",
    },
}


class MediaMetrics:
    """Media handled (each medium by its label), images handled, pixel
    bytes, decode (or read) seconds, publish→read latency, the pool's
    bytes in use and capacity and errors by type, for one role
    (``frontend`` or ``worker``); each help text says what that role
    counts.

    ``path`` labels say how an image went: ``nixl`` (decoded at the frontend,
    read over NIXL), ``url`` (fetched and decoded natively by this process),
    ``passthrough`` (frontend left it to the worker) or ``vllm`` (handed to
    vLLM's own loader)."""

    def __init__(
        self,
        role: str,
        registry: CollectorRegistry,
        pool_bytes: Callable[[], float],
        pool_capacity: Callable[[], float],
        *,
        reads: bool = False,
    ) -> None:
        prefix = f"pixelwire_{role}"
        helps = {name: by_role[role] for name, by_role in _HELP.items()}
        self.images = Counter(f"{prefix}_images", helps["images"], ["path"], registry=registry)
        self.pixel_bytes = Counter(f"{prefix}_pixel_bytes", helps["pixel_bytes"], ["path"], registry=registry)
        self.source_pixel_bytes = Counter(
            f"{prefix}_source_pixel_bytes", helps["source_pixel_bytes"], ["path"], registry=registry
        )
        self.decode_seconds = Histogram(
            f"{prefix}_decode_seconds", helps["decode_seconds"], ["path"], buckets=_SECONDS, registry=registry
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
            f"{prefix}_pool_bytes_in_use", helps["pool_bytes_in_use"], registry=registry
        )
        self.pool_bytes_in_use.set_function(pool_bytes)
        self.pool_bytes_capacity = Gauge(
            f"{prefix}_pool_bytes_capacity", helps["pool_bytes_capacity"], registry=registry
        )
        self.pool_bytes_capacity.set_function(pool_capacity)
        self.errors = Counter(f"{prefix}_errors", helps["errors"], ["type"], registry=registry)
        self.media = Counter(f"{prefix}_media", helps["media"], ["medium", "path"], registry=registry)
        self.videos = Counter(f"{prefix}_videos", helps["videos"], ["path"], registry=registry)
        self.video_frame_bytes = Counter(
            f"{prefix}_video_frame_bytes", helps["video_frame_bytes"], ["path"], registry=registry
        )
        # Each metric's child for a path, looked up once: prometheus_client's
        # labels() checks and locks on every call, several times an image,
        # and the paths are a fixed few.
        self._children: dict[tuple[int, str, str], Any] = {}

    def _for_path(self, metric: Counter | Histogram, path: str) -> Any:
        key = (id(metric), path, "")
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(path=path)
        return child

    def handled_medium(self, medium: str, path: str) -> None:
        """One item of the medium labelled ``medium`` (:attr:`pixelwire.media.Medium.metrics_label`)."""
        key = (id(self.media), path, medium)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.media.labels(medium=medium, path=path)
        child.inc()

    def handled(
        self, path: str, nbytes: int, source_nbytes: int | None = None, *, medium: str = "image"
    ) -> None:
        """One image (of the medium labelled ``medium``: an image, or a
        processed image): `nbytes` of pixels shipped, `source_nbytes`
        (default the same) at its decoded size."""
        self.handled_medium(medium, path)
        self._for_path(self.images, path).inc()
        self._for_path(self.pixel_bytes, path).inc(nbytes)
        self._for_path(self.source_pixel_bytes, path).inc(nbytes if source_nbytes is None else source_nbytes)

    def handled_video(self, path: str, nbytes: int) -> None:
        """One video: `nbytes` of sampled frames."""
        self.handled_medium("video", path)
        self._for_path(self.videos, path).inc()
        self._for_path(self.video_frame_bytes, path).inc(nbytes)

    def handled_image(
        self, path: str, shape: tuple[int, int, int], source_size: tuple[int, int] | None = None
    ) -> None:
        """One image of ``shape`` (H, W, C) shipped, ``source_size`` (H, W;
        default its own) at its decoded size: counted at C bytes a pixel,
        whatever layout held or moved its pixels (RGBX takes 4), so that
        every path and both roles count the same image alike."""
        height, width, channels = shape
        source_height, source_width = source_size if source_size is not None else (height, width)
        self.handled(path, height * width * channels, source_height * source_width * channels)

    def failed(self, error: BaseException) -> None:
        self.errors.labels(type=type(error).__name__).inc()

    def observe(self, path: str, seconds: float) -> None:
        """One image's fetch and decode (or read) took `seconds`."""
        self._for_path(self.decode_seconds, path).observe(seconds)

    @contextlib.contextmanager
    def timed(self, path: str) -> Iterator[None]:
        start = perf_counter()
        yield
        self.observe(path, perf_counter() - start)


class CacheMetrics(Collector):
    """The frontend's cache of published images, read from the publisher's
    stats at each scrape: ``pixelwire_frontend_cache_hits_total`` (images
    handed out again, not decoded), ``..._misses_total`` (images decoded to
    be kept), ``..._evictions_total`` (kept images given up: over
    ``--cache-bytes``, or to make room in a full pool) and ``..._bytes``
    (pool bytes the kept images hold); ``pixelwire_frontend_data_url_hits_total``
    (resent data: URLs neither decoded nor hashed again) and
    ``..._data_url_bytes`` (what the memo of them holds)."""

    def __init__(self, registry: CollectorRegistry, stats: Callable[[], dict[str, int]]) -> None:
        self.stats = stats
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        stats = self.stats()
        prefix = "pixelwire_frontend_cache"
        for name, key, help_text in (
            ("hits", "cache_hits", "Images handed out again from the cache, not decoded"),
            (
                "misses",
                "cache_misses",
                "Images decoded to be kept in the cache (in-flight repeats wait for them)",
            ),
            (
                "evictions",
                "evicted",
                "Cached images given up: over --cache-bytes, or to make room in a full pool",
            ),
        ):
            yield CounterMetricFamily(f"{prefix}_{name}", help_text, value=stats.get(key, 0))
        yield GaugeMetricFamily(
            f"{prefix}_bytes",
            "Pool bytes the cached images hold (within --cache-bytes)",
            value=stats.get("pinned_bytes", 0),
        )
        yield CounterMetricFamily(
            "pixelwire_frontend_data_url_hits",
            "Resent data: URLs found in the memo: neither base64-decoded nor hashed again",
            value=stats.get("data_url_hits", 0),
        )
        yield GaugeMetricFamily(
            "pixelwire_frontend_data_url_bytes",
            "Text and decoded bytes of the data: URLs the memo holds (within a share of --cache-bytes)",
            value=stats.get("data_url_bytes", 0),
        )


class WorkerCacheMetrics(Collector):
    """The vLLM plug-in's cache of images it handed vLLM
    (``PIXELWIRE_WORKER_CACHE_BYTES``), read from its stats at each scrape:
    ``pixelwire_worker_cache_hits_total`` (repeats served from it: no READ,
    no decode), ``..._misses_total`` (images looked for and not found:
    READ or decoded, then kept), ``..._evictions_total`` (kept images given
    up for newer ones), ``..._bytes`` (pixel bytes it holds) and
    ``..._capacity_bytes`` (its budget; 0: off); and
    ``pixelwire_worker_data_url_hits_total`` and ``..._data_url_bytes``, the
    memo of worker mode's data: URLs beside it."""

    def __init__(self, registry: CollectorRegistry, stats: Callable[[], dict[str, int]]) -> None:
        self.stats = stats
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        stats = self.stats()
        prefix = "pixelwire_worker_cache"
        for name, key, help_text in (
            ("hits", "hits", "Images served again from the plug-in's cache: neither READ nor decoded"),
            ("misses", "misses", "Images looked for in the plug-in's cache and not found (READ or decoded, "
             "then kept)"),
            ("evictions", "evictions", "Images the plug-in's cache gave up, least recently used first, "
             "to keep within PIXELWIRE_WORKER_CACHE_BYTES"),
        ):  # fmt: skip
            yield CounterMetricFamily(f"{prefix}_{name}", help_text, value=stats.get(key, 0))
        yield GaugeMetricFamily(
            f"{prefix}_bytes", "Pixel bytes the plug-in's cache holds", value=stats.get("bytes", 0)
        )
        yield GaugeMetricFamily(
            f"{prefix}_capacity_bytes",
            "Pixel bytes the plug-in's cache may hold (PIXELWIRE_WORKER_CACHE_BYTES; 0: off)",
            value=stats.get("budget", 0),
        )
        yield CounterMetricFamily(
            "pixelwire_worker_data_url_hits",
            "Resent data: URLs found in the plug-in's memo: neither base64-decoded nor hashed again, or "
            "found by a resent image's reference",
            value=stats.get("data_url_hits", 0),
        )
        yield GaugeMetricFamily(
            "pixelwire_worker_data_url_bytes",
            "Text and decoded bytes of the data: URLs the plug-in's memo holds (a quarter of "
            "PIXELWIRE_WORKER_CACHE_BYTES)",
            value=stats.get("data_url_bytes", 0),
        )


def worker_metrics(
    registry: CollectorRegistry,
    declared: dict[str, str],
    *,
    pool_bytes_in_use: Callable[[], float],
    pool_bytes_capacity: Callable[[], float],
    frontends: Callable[[], float],
    cache_stats: Callable[[], dict[str, int]],
) -> ImageMetrics:
    """Every ``pixelwire_worker_*`` metric, registered in ``registry`` (the
    plug-in's: prometheus_client's default, which vLLM serves): the image
    metrics, ``pixelwire_worker_info`` with the ``declared`` settings as its
    labels (the worker's half of the handshake, :mod:`pixelwire.handshake`),
    the frontends it holds and its cache's. Returns the image metrics, which
    the plug-in updates as it works; the rest read their values at each scrape."""
    metrics = ImageMetrics("worker", registry, pool_bytes_in_use, pool_bytes_capacity, reads=True)
    info = Gauge(
        INFO_METRIC,
        "The pixelwire plug-in is loaded (always 1); its labels are the settings a frontend "
        "compares with its own: pixelwire version, connector (VLLM_MEDIA_CONNECTOR), secret "
        "(PIXELWIRE_SECRET's fingerprint, never the secret, or none), unsigned "
        "(PIXELWIRE_ALLOW_UNSIGNED), private (PIXELWIRE_ALLOW_PRIVATE), resize (the policy of "
        "vLLM's --model and --mm-processor-kwargs, or of PIXELWIRE_MODEL and "
        "PIXELWIRE_MM_PROCESSOR_KWARGS, or none), memo (1 when PIXELWIRE_WORKER_CACHE_BYTES "
        "keeps the data: URLs it decoded, so that a frontend may send resent ones as references), "
        "processed (the processed inputs it takes, pixelwire.processed, or none)",
        list(INFO_LABELS),
        registry=registry,
    )
    info.labels(**declared).set(1)
    held = Gauge(
        "pixelwire_worker_frontends",
        "Frontends whose NIXL metadata this worker holds (loaded at the first READ from each; "
        "at most 256, the least recently used idle one forgotten first)",
        registry=registry,
    )
    held.set_function(frontends)
    WorkerCacheMetrics(registry, cache_stats)
    return metrics


# The name it had when it counted images only: kept for callers.
ImageMetrics = MediaMetrics
