"""The connector itself; imports vLLM, so only :func:`pixelwire.vllm.register` loads it."""

from __future__ import annotations

import asyncio
import hashlib
import re
import threading
import time
import uuid
from collections.abc import Coroutine
from typing import Any, Literal, cast

import vllm.envs as envs
from PIL import ExifTags, Image
from prometheus_client import REGISTRY, Gauge
from vllm.multimodal.media import MediaConnector, MediaWithBytes
from vllm.multimodal.media.image import ImageMediaIO

from pixelwire import __version__
from pixelwire._native import DescriptorError, Limits, PixelwireError, UnsupportedFormat, decode_image
from pixelwire.fetch import Fetcher
from pixelwire.metrics import ImageMetrics
from pixelwire.signing import decode_reference, is_reference, secret_from_env
from pixelwire.transfer import DECODED_MODES, Reader, _as_output, allow_private_from_env, default_reader

NativeMode = Literal["RGB", "RGBA", "L"]
_SHA256 = re.compile(r"[0-9a-f]{64}")
_state_lock = threading.Lock()
_metrics: ImageMetrics | None = None
_fetchers: dict[tuple[Any, ...], Fetcher] = {}
_sync_loop: asyncio.AbstractEventLoop | None = None


def _reader_bytes_in_use() -> float:
    reader = default_reader()
    return float(reader.stats()["bytes_in_use"]) if reader._native is not None else 0.0


def install_metrics(selected: str) -> ImageMetrics:
    """``pixelwire_worker_*`` in prometheus_client's default registry, which
    vLLM's API server serves at /metrics; ``pixelwire_worker_info`` tells a
    frontend which connector vLLM was started with."""
    global _metrics
    with _state_lock:
        if _metrics is None:
            _metrics = ImageMetrics("worker", REGISTRY, _reader_bytes_in_use, reads=True)
            info = Gauge(
                "pixelwire_worker_info",
                "pixelwire plug-in loaded; connector is VLLM_MEDIA_CONNECTOR",
                ["version", "connector"],
                registry=REGISTRY,
            )
            info.labels(version=__version__, connector=selected).set(1)
        return _metrics


def _fetcher(domains: list[str] | None, local_path: Any) -> Fetcher:
    """One Fetcher per event loop and vLLM setting (allowed domains, local path, timeout)."""
    allow_private = allow_private_from_env()
    # A Fetcher's HTTP session belongs to one event loop: vLLM's, or the sync one.
    loop = asyncio.get_running_loop()
    key = (loop, tuple(domains or ()), str(local_path or ""), envs.VLLM_IMAGE_FETCH_TIMEOUT, allow_private)
    with _state_lock:
        fetcher = _fetchers.get(key)
        if fetcher is None:
            fetcher = Fetcher(
                timeout=float(envs.VLLM_IMAGE_FETCH_TIMEOUT),
                max_redirects=3 if envs.VLLM_MEDIA_URL_ALLOW_REDIRECTS else 0,
                allowed_domains=domains or None,
                allow_private=allow_private,
                allowed_local_path=local_path,
            )
            _fetchers[key] = fetcher
        return fetcher


async def close_fetchers() -> None:
    """Closes the running loop's Fetchers (their HTTP sessions): for a loop
    that is about to end. vLLM's own loops live as long as the process."""
    loop = asyncio.get_running_loop()
    with _state_lock:
        mine = [key for key in _fetchers if key[0] is loop]
        closing = [_fetchers.pop(key) for key in mine]
    for fetcher in closing:
        await fetcher.close()


def _limits() -> Limits:
    max_pixels = envs.VLLM_MAX_IMAGE_PIXELS
    return Limits(max_pixels=max_pixels) if max_pixels > 0 else Limits()


def _run_sync(coro: Coroutine[Any, Any, Any]) -> Any:
    """Runs a coroutine for vLLM's synchronous loaders on one private loop
    thread, whether or not the caller is inside an event loop."""
    global _sync_loop
    with _state_lock:
        if _sync_loop is None:
            _sync_loop = asyncio.new_event_loop()
            threading.Thread(target=_sync_loop.run_forever, name="pixelwire-sync", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coro, _sync_loop).result()


class PixelwireMediaConnector(MediaConnector):
    """vLLM's MediaConnector with images taken over: descriptor references
    are read over NIXL; ``http(s)``, ``data:`` and allowed ``file:`` URLs are
    fetched and decoded natively (off the GIL) when the mode asked for is one
    pixelwire decodes (RGB, RGBA, L). Everything else is vLLM's own code."""

    def _image_settings(self, image_mode: str | None) -> tuple[str | None, tuple[int, int, int]]:
        # ImageMediaIO validates the kwargs exactly as vLLM does.
        io = ImageMediaIO(**({"image_mode": image_mode} | self.media_io_kwargs.get("image", {})))
        return io.image_mode, io.rgba_background_color

    async def fetch_image_async(self, image_url: str, *, image_mode: str | None = "RGB") -> Any:
        mode, background = self._image_settings(image_mode)
        metrics = install_metrics("pixelwire")
        try:
            if is_reference(image_url):
                return await self._read_reference(image_url, mode, background, metrics)
            if mode in DECODED_MODES and isinstance(image_url, str):
                return await self._load_url(image_url, mode, background, metrics)
        except PixelwireError as e:
            metrics.failed(e)
            # vLLM answers ValueError with 400 and the message.
            raise ValueError(f"pixelwire: {e}") from e
        metrics.handled("vllm", 0)
        return await super().fetch_image_async(image_url, image_mode=image_mode)

    def fetch_image(self, image_url: str, *, image_mode: str | None = "RGB") -> Any:
        return _run_sync(self.fetch_image_async(image_url, image_mode=image_mode))

    async def _read_reference(
        self, reference: str, mode: str | None, background: tuple[int, int, int], metrics: ImageMetrics
    ) -> Image.Image:
        # The signature is checked before anything reaches NIXL.
        descriptor = decode_reference(reference, secret_from_env())
        info, own = descriptor.get("metadata"), descriptor.get("pixelwire")
        if (
            not isinstance(info, dict)
            or not isinstance(own, dict)
            or not isinstance(info.get("color_type"), str)
        ):
            raise DescriptorError("descriptor lacks its metadata.color_type or pixelwire keys")
        made = info["color_type"]
        made_on = tuple(own.get("background", (255, 255, 255)))
        if made != mode or (mode == "RGB" and made_on != background):
            raise DescriptorError(
                f"the frontend decoded this image as {made} on {list(made_on)} but vLLM asks for "
                f"{mode} on {list(background)}: give the frontend the same --media-io-kwargs as vLLM"
            )
        reader: Reader = default_reader()
        with metrics.timed("nixl"):
            image: Image.Image = await reader.read_decoded(descriptor, output="pil")
        published_at = own.get("published_at")
        latency = metrics.publish_to_read_seconds
        if latency is not None and isinstance(published_at, (int, float)) and published_at > 0:
            latency.observe(max(0.0, time.time() - published_at))
        metrics.handled("nixl", int(descriptor["nixl_descriptor"]["size"]))
        digest = own.get("source_sha256")
        if isinstance(digest, str) and _SHA256.fullmatch(digest):
            # vLLM keys its multimodal caches on an EXIF ImageID UUID when an
            # image has one, instead of hashing every pixel (~20 ms for 4K).
            identity = hashlib.sha256(f"pixelwire-image:{digest}:{mode}:{list(background)}".encode()).digest()
            image.getexif()[ExifTags.Base.ImageID] = uuid.UUID(bytes=identity[:16])
        return image

    async def _load_url(
        self, url: str, mode: str, background: tuple[int, int, int], metrics: ImageMetrics
    ) -> MediaWithBytes:
        fetcher = _fetcher(self.allowed_media_domains, self.allowed_local_media_path)
        data = await fetcher.fetch(url)
        try:
            with metrics.timed("url"):
                pixels = await asyncio.to_thread(
                    decode_image,
                    data,
                    mode=cast(NativeMode, mode),
                    background=background,
                    limits=_limits(),
                )
        except UnsupportedFormat:
            # A format (or variant) pixelwire does not decode: vLLM's own
            # loader on the bytes already fetched, exactly as vLLM would.
            metrics.handled("vllm", 0)
            io = ImageMediaIO(**({"image_mode": mode} | self.media_io_kwargs.get("image", {})))
            return await asyncio.to_thread(io.load_bytes, data)
        metrics.handled("url", int(pixels.nbytes))
        # With the encoded bytes, vLLM's processor cache hashes them as it
        # does for its own loader.
        return MediaWithBytes(
            _as_output(pixels, "pil", "cpu"), data, {"image_mode": mode, "rgba_background_color": background}
        )
