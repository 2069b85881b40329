"""The connector itself; imports vLLM, so only :func:`pixelwire.vllm.register` loads it."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Coroutine
from typing import Any

import vllm.envs as envs
from PIL import Image
from prometheus_client import REGISTRY, Gauge
from vllm.multimodal.media import MediaConnector, MediaWithBytes
from vllm.multimodal.media.base import MediaIO
from vllm.multimodal.media.image import ImageMediaIO

from pixelwire import __version__
from pixelwire._native import (
    DescriptorError,
    Limits,
    PixelwireError,
    UnsupportedFormat,
    decode_image,
    probe_image,
)
from pixelwire.config import (
    DECODED_MODES,
    Mode,
    allow_private_from_env,
    allow_unsigned_from_env,
    secret_from_env,
    worker_model_from_env,
)
from pixelwire.descriptor import RemoteImage, decoded_as, parse_descriptor
from pixelwire.fetch import DEFAULT_MAX_BYTES, Fetcher
from pixelwire.handshake import INFO_LABELS, INFO_METRIC, WorkerSettings
from pixelwire.metrics import ImageMetrics
from pixelwire.outputs import as_output
from pixelwire.reader import Reader
from pixelwire.resize import ResizePolicy
from pixelwire.signing import decode_reference, is_reference, reference_secret, signing_policy
from pixelwire.transfer import default_reader
from pixelwire.vllm import CONNECTOR_NAME

_state_lock = threading.Lock()
_metrics: ImageMetrics | None = None
_fetchers: dict[tuple[Any, ...], Fetcher] = {}
_sync_loop: asyncio.AbstractEventLoop | None = None


log = logging.getLogger("pixelwire.vllm")


@functools.cache
def worker_resize_policy() -> ResizePolicy | None:
    """The model-aware resize of the model this vLLM serves, from
    PIXELWIRE_MODEL (vLLM's --model) and PIXELWIRE_MM_PROCESSOR_KWARGS (its
    --mm-processor-kwargs): vLLM 0.32 builds media connectors without the
    model config, so the plug-in is told. None without PIXELWIRE_MODEL."""
    model, kwargs = worker_model_from_env()
    if model is None:
        return None
    return ResizePolicy.from_pretrained(model, kwargs)


def check_resize_setting(argv: list[str]) -> None:
    """At start-up: PIXELWIRE_MODEL must name the model vLLM was started
    with (``--model M`` or ``serve M`` on its command line), else the
    plug-in's checks would compare against another model's processor."""
    model, _ = worker_model_from_env()
    started = None
    for i, arg in enumerate(argv[:-1]):
        if arg == "--model" or (arg == "serve" and not argv[i + 1].startswith("-")):
            started = argv[i + 1]
    if model and started and os.path.normpath(model) != os.path.normpath(started):
        log.error(
            "PIXELWIRE_MODEL=%s but vLLM serves %s: set PIXELWIRE_MODEL to vLLM's --model, "
            "or frontend-resized images will be checked against the wrong processor",
            model,
            started,
        )
    policy = worker_resize_policy()
    log.info("pixelwire model-aware resize: %s", policy.identity if policy else "off (PIXELWIRE_MODEL unset)")


def check_signing_setting() -> None:
    """At start-up: logs how descriptor references are checked; an error
    when they are all refused (neither a secret nor the trusted-network
    setting), a warning when they are not checked."""
    policy = signing_policy()
    if secret_from_env() is not None:
        log.info("pixelwire descriptor references: %s", policy)
    elif allow_unsigned_from_env():
        log.warning("pixelwire descriptor references: %s", policy)
    else:
        log.error(
            "pixelwire descriptor references: %s; set PIXELWIRE_SECRET to the frontend's secret, "
            "or PIXELWIRE_ALLOW_UNSIGNED=1 if every client that can reach this vLLM is trusted",
            policy,
        )


def _check_resize(remote: RemoteImage) -> str:
    """A frontend-resized image must carry this vLLM's policy and its target
    size; returns the policy's identity."""
    expected = worker_resize_policy()
    assert remote.resize is not None
    policy, (height, width) = remote.resize.policy, remote.resize.source
    if expected is None:
        raise DescriptorError(
            f"the frontend resized this image for {policy}, but this vLLM's pixelwire plug-in "
            "has no PIXELWIRE_MODEL to check it against: set PIXELWIRE_MODEL (and "
            "PIXELWIRE_MM_PROCESSOR_KWARGS) to vLLM's --model (and --mm-processor-kwargs), "
            "or start the frontend without --model"
        )
    if policy != expected.identity:
        raise DescriptorError(
            f"the frontend resized this image for {policy}, but this vLLM's processor resizes for "
            f"{expected.identity}: give the frontend the same --model and --mm-processor-kwargs as vLLM"
        )
    if remote.shape[:2] != expected.target(height, width):
        raise DescriptorError(
            f"the frontend's resize of a {[height, width]} image does not match {expected.identity}"
        )
    return policy


def _reader_bytes_in_use() -> float:
    reader = default_reader()
    return float(reader.stats()["bytes_in_use"]) if reader.is_open else 0.0


def install_metrics(selected: str) -> ImageMetrics:
    """``pixelwire_worker_*`` in prometheus_client's default registry, which
    vLLM's API server serves at /metrics. ``pixelwire_worker_info`` is the
    worker's half of the start-up handshake: its labels are the settings a
    frontend must agree with (:mod:`pixelwire.handshake`)."""
    global _metrics
    with _state_lock:
        if _metrics is None:
            _metrics = ImageMetrics(
                "worker", REGISTRY, _reader_bytes_in_use, _reader_pool_capacity, reads=True
            )
            info = Gauge(
                INFO_METRIC,
                "The pixelwire plug-in is loaded (always 1); its labels are the settings a frontend "
                "compares with its own: pixelwire version, connector (VLLM_MEDIA_CONNECTOR), secret "
                "(PIXELWIRE_SECRET's fingerprint, never the secret, or none), unsigned "
                "(PIXELWIRE_ALLOW_UNSIGNED), private (PIXELWIRE_ALLOW_PRIVATE), resize (the policy of "
                "PIXELWIRE_MODEL and PIXELWIRE_MM_PROCESSOR_KWARGS, or none)",
                list(INFO_LABELS),
                registry=REGISTRY,
            )
            info.labels(**declared_settings(selected).labels()).set(1)
        return _metrics


def declared_settings(selected: str) -> WorkerSettings:
    """The settings this worker declares. When the plug-in is not the
    connector, a PIXELWIRE_MODEL that cannot be read is no reason to stop
    vLLM (nothing here resizes): its resize reads as unreadable."""
    try:
        policy = worker_resize_policy()
    except (OSError, ValueError):
        if selected == CONNECTOR_NAME:
            raise
        return WorkerSettings.declared(__version__, selected, "unreadable")
    return WorkerSettings.declared(__version__, selected, policy.identity if policy else "none")


def _reader_pool_capacity() -> float:
    return float(default_reader().settings.pool_bytes)


def _fetcher(
    domains: list[str] | None,
    local_path: Any,
    timeout: float | None = None,
    max_bytes: int | None = None,
) -> Fetcher:
    """One Fetcher per event loop and vLLM setting (allowed domains, local
    path, timeout: vLLM's image fetch timeout unless another is given,
    body cap)."""
    allow_private = allow_private_from_env()
    timeout = float(envs.VLLM_IMAGE_FETCH_TIMEOUT if timeout is None else timeout)
    max_bytes = max_bytes or DEFAULT_MAX_BYTES
    # A Fetcher's HTTP session belongs to one event loop: vLLM's, or the sync one.
    loop = asyncio.get_running_loop()
    key = (loop, tuple(domains or ()), str(local_path or ""), timeout, max_bytes, allow_private)
    with _state_lock:
        fetcher = _fetchers.get(key)
        if fetcher is None:
            fetcher = Fetcher(
                timeout=timeout,
                max_bytes=max_bytes,
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


def _decode_for_model(
    data: bytes, mode: Mode, background: tuple[int, int, int], policy: ResizePolicy | None
) -> tuple[Any, int]:
    """Decodes (resized to the model's size when there is a policy); returns
    the pixels and the byte count at the decoded size."""
    limits = _limits()
    if policy is None:
        pixels = decode_image(data, mode=mode, background=background, limits=limits)
        return pixels, int(pixels.nbytes)
    height, width = probe_image(data, limits=limits)["oriented_size"]
    pixels = decode_image(
        data,
        mode=mode,
        background=background,
        limits=limits,
        resize=policy.target(height, width),
        resize_kernel=policy.kernel,
        resize_filter=policy.filter,
    )
    return pixels, height * width * pixels.shape[2]


def cache_identity(
    source_sha256: str, mode: str | None, background: tuple[int, int, int], policy: str
) -> bytes:
    """What vLLM's multimodal caches key a frontend-decoded image on (the
    bytes its hasher reads in place of the encoded image): the signed
    identity of the pixels (source digest, mode, background, resize
    policy), keyed with PIXELWIRE_SECRET when there is one, so nobody
    without the secret can compute it."""
    identity = f"pixelwire-image:{source_sha256}:{mode}:{list(background)}:{policy}".encode()
    secret = secret_from_env()
    digest = (
        hmac.new(secret, identity, hashlib.sha256).digest()
        if secret is not None
        else hashlib.sha256(identity).digest()
    )
    # Tagged, so it is no image's encoded bytes either.
    return b"pixelwire-cache-identity:" + digest


class PixelwireMediaConnector(MediaConnector):
    """vLLM's MediaConnector with images taken over: descriptor references
    are read over NIXL (signed, unless PIXELWIRE_ALLOW_UNSIGNED=1); every
    ``http(s)``, ``data:`` and allowed ``file:`` URL is fetched by
    pixelwire's guarded Fetcher and decoded natively (off the GIL) when the
    mode asked for is one pixelwire decodes (RGB, RGBA, L); other modes and
    formats go to vLLM's own loader as the bytes already fetched. Every
    other medium vLLM loads from a URL (video, audio) is fetched by the same
    guard too, and decoded by vLLM's own loader."""

    async def load_from_url_async(
        self, url: str, media_io: MediaIO[Any], *, fetch_timeout: int | None = None
    ) -> Any:
        # vLLM's one way to every URL it fetches (video and audio; images
        # come through fetch_image_async). data: URLs hold their bytes, and
        # what is not a URL vLLM refuses itself: both stay vLLM's.
        if not isinstance(url, str) or url[:5].lower() == "data:" or ":" not in url:
            return await super().load_from_url_async(url, media_io, fetch_timeout=fetch_timeout)
        fetcher = _fetcher(
            self.allowed_media_domains, self.allowed_local_media_path, fetch_timeout, media_io.get_max_bytes()
        )
        try:
            data = await fetcher.fetch(url)
        except PixelwireError as e:
            install_metrics("pixelwire").failed(e)
            raise ValueError(f"pixelwire: {e}") from e
        return await asyncio.to_thread(media_io.load_bytes, data)

    def load_from_url(self, url: str, media_io: MediaIO[Any], *, fetch_timeout: int | None = None) -> Any:
        return _run_sync(self.load_from_url_async(url, media_io, fetch_timeout=fetch_timeout))

    def _image_settings(self, image_mode: str | None) -> tuple[str | None, tuple[int, int, int]]:
        # ImageMediaIO validates the kwargs exactly as vLLM does.
        io = ImageMediaIO(**({"image_mode": image_mode} | self.media_io_kwargs.get("image", {})))
        return io.image_mode, io.rgba_background_color

    async def fetch_image_async(self, image_url: str, *, image_mode: str | None = "RGB") -> Any:
        mode, background = self._image_settings(image_mode)
        metrics = install_metrics("pixelwire")
        if not isinstance(image_url, str):
            # Not a URL (vLLM passes only strings): vLLM's own answer.
            metrics.handled("vllm", 0)
            return await super().fetch_image_async(image_url, image_mode=image_mode)
        try:
            if is_reference(image_url):
                return await self._read_reference(image_url, mode, background, metrics)
            # Every URL is fetched by pixelwire's guarded Fetcher, whatever
            # the mode; modes pixelwire does not decode go to vLLM's loader
            # as bytes.
            return await self._load_url(image_url, mode, background, metrics)
        except PixelwireError as e:
            metrics.failed(e)
            # vLLM answers ValueError with 400 and the message.
            raise ValueError(f"pixelwire: {e}") from e

    def fetch_image(self, image_url: str, *, image_mode: str | None = "RGB") -> Any:
        return _run_sync(self.fetch_image_async(image_url, image_mode=image_mode))

    async def _read_reference(
        self, reference: str, mode: str | None, background: tuple[int, int, int], metrics: ImageMetrics
    ) -> Image.Image | MediaWithBytes:
        # The signature is checked before anything reaches NIXL; without
        # PIXELWIRE_SECRET every reference is refused unless
        # PIXELWIRE_ALLOW_UNSIGNED=1 (reference_secret raises).
        descriptor = decode_reference(reference, reference_secret())
        made, made_on = decoded_as(descriptor)
        if made != mode or (mode == "RGB" and made_on != background):
            raise DescriptorError(
                f"the frontend decoded this image as {made} on {list(made_on)} but vLLM asks for "
                f"{mode} on {list(background)}: give the frontend the same --media-io-kwargs as vLLM"
            )
        remote = parse_descriptor(descriptor)
        policy = _check_resize(remote) if remote.resize is not None else ""
        reader: Reader = default_reader()
        with metrics.timed("nixl"):
            image: Image.Image = await reader.read_remote(remote, output="pil")
        latency = metrics.publish_to_read_seconds
        if latency is not None and remote.published_at is not None:
            latency.observe(max(0.0, time.time() - remote.published_at))
        metrics.handled_image("nixl", remote.shape, remote.source_size)
        # vLLM's hasher keys a MediaWithBytes image on its bytes (it neither
        # re-normalises it nor hashes its pixels): here the signed identity,
        # which no client can choose (the frontend takes out their uuids)
        # nor compute. Without a source digest, the pixels' content hash,
        # covered by the signature too, stands in; with neither, vLLM hashes
        # the pixels themselves.
        if remote.source_sha256:
            source = remote.source_sha256
        elif remote.content_hash:
            source = f"content:{remote.content_hash}"
        else:
            return image
        return MediaWithBytes(image, cache_identity(source, mode, background, policy))

    async def _load_url(
        self, url: str, mode: str | None, background: tuple[int, int, int], metrics: ImageMetrics
    ) -> Image.Image | MediaWithBytes:
        fetcher = _fetcher(self.allowed_media_domains, self.allowed_local_media_path)
        data = await fetcher.fetch(url)
        if mode not in DECODED_MODES:
            # A mode pixelwire does not decode (P, None = the file's own, ...).
            return await self._vllm_load(data, mode, metrics)
        policy = worker_resize_policy() if mode == "RGB" else None
        try:
            with metrics.timed("url"):
                pixels, source_bytes = await asyncio.to_thread(
                    _decode_for_model, data, mode, background, policy
                )
        except UnsupportedFormat:
            # A format (or variant) pixelwire does not decode.
            return await self._vllm_load(data, mode, metrics)
        metrics.handled("url", int(pixels.nbytes), source_bytes)
        # With the encoded bytes, vLLM's processor cache hashes them as it
        # does for its own loader.
        return MediaWithBytes(
            as_output(pixels, "pil", "cpu"), data, {"image_mode": mode, "rgba_background_color": background}
        )

    async def _vllm_load(self, data: bytes, mode: str | None, metrics: ImageMetrics) -> MediaWithBytes:
        """vLLM's own loader on bytes pixelwire's Fetcher already fetched
        (never on the URL: vLLM's fetch has no address guard), so the result
        is exactly vLLM's."""
        metrics.handled("vllm", 0)
        io = ImageMediaIO(**({"image_mode": mode} | self.media_io_kwargs.get("image", {})))
        return await asyncio.to_thread(io.load_bytes, data)
