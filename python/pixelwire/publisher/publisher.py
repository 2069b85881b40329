"""Frontend side: :class:`Publisher` decodes an image, or a video's
sampled frames, straight into NIXL-registered memory and returns its
descriptor; a worker's READ (whose notification frees the slot), a
release, or the lease ends its life."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pixelwire import _native, config
from pixelwire.caches.data_urls import DataUrlMemo
from pixelwire.caches.interface import counts
from pixelwire.caches.published_images import PublishCache
from pixelwire.config import BACKGROUND, DecodeAt, Layout, Mode, PublisherSettings, data_url_memo_bytes
from pixelwire.default_fetcher import default_fetcher
from pixelwire.descriptor import Decoded, DecodedVideo, PassThrough, PublishedSlot
from pixelwire.nixl import ensure_nixl
from pixelwire.publisher.cached import publish_one_through_cache, publish_through_cache
from pixelwire.publisher.images import ImageBatch, ImageOptions
from pixelwire.publisher.medium import MediumPublish
from pixelwire.publisher.off_loop import off_loop
from pixelwire.publisher.slots import handout
from pixelwire.publisher.video import VideoPublish, video_cache_key
from pixelwire.video.sampling import VideoSampling
from pixelwire.video.shares import ClientShares, PoolShare

if TYPE_CHECKING:
    from pixelwire.fetch import Fetcher
    from pixelwire.publisher.images import Shaping
    from pixelwire.resize import ResizePolicy

R = TypeVar("R")
D = TypeVar("D")

# Numbers the videos published without a client, each a client of its own.
_videos = itertools.count()


def _pass_through(source: bytes | bytearray | memoryview | str) -> PassThrough:
    """What worker mode hands on for `source`: its URL, or its bytes as a ``data:`` URL."""
    if isinstance(source, str):
        return PassThrough(source)
    encoded = base64.b64encode(bytes(source)).decode()
    return PassThrough(f"data:application/octet-stream;base64,{encoded}")


def _encoded(source: bytes | bytearray | memoryview) -> bytes | bytearray:
    """Encoded bytes as the native side takes them in place (a memoryview is copied)."""
    return bytes(source) if isinstance(source, memoryview) else source


class Publisher:
    """Frontend side: owns one NIXL agent and a registered pool.

    The agent opens with :meth:`open` (or ``async with``, or the first
    publish) and ends with :meth:`close`; :attr:`is_open` says which.
    ``decode_at="worker"`` (or PIXELWIRE_DECODE_AT=worker) turns it into a
    pass-through: no agent, no fetching, no decoding, the worker gets the
    encoded image. ``cache_bytes`` (0: off) keeps published images, within
    that many of the pool's bytes, to hand out again for the same image
    (see :mod:`pixelwire.caches.published_images`), and :attr:`data_urls` the
    ``data:`` URLs behind them, within a share of it
    (:mod:`pixelwire.caches.data_urls`).
    """

    def __init__(
        self, settings: PublisherSettings | None = None, *, fetcher: Fetcher | None = None, **given: Any
    ) -> None:
        """``settings`` (:class:`pixelwire.config.PublisherSettings`, its
        defaults when None), with any of its fields given by keyword instead
        (None: not given): ``Publisher(pool_bytes=256 << 20, cache_bytes=0)``.
        ``fetcher`` fetches its URLs (one with the default guard is made on
        first use when None)."""
        fields = {name: value for name, value in given.items() if value is not None}
        settings = (
            PublisherSettings(**fields) if settings is None else dataclasses.replace(settings, **fields)
        )
        if not settings.lease_seconds >= _native.MIN_LEASE_SECONDS:
            raise ValueError(
                f"lease_seconds must be at least {_native.MIN_LEASE_SECONDS} (got {settings.lease_seconds}): "
                "a shorter lease frees slots before a worker can read them"
            )
        self.settings = settings
        self._fetcher = fetcher
        self._own_fetcher = fetcher is None
        self.cache = PublishCache(max(0, min(settings.cache_bytes, settings.pool_bytes)))
        self.data_urls = DataUrlMemo(data_url_memo_bytes(self.cache.budget))
        self._video_shares = ClientShares(config.VIDEO_DECODES_PER_CLIENT)
        self._video_pool = PoolShare(config.video_pool_bytes(settings.pool_bytes))
        self._native: _native.NativePublisher | None = None

    @property
    def decode_at(self) -> DecodeAt:
        """Where images are decoded: ``"worker"`` makes this a pass-through."""
        return self.settings.decode_at

    # -- lifecycle -------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """Whether the NIXL agent and its pool exist (never, in worker mode)."""
        return self._native is not None

    def open(self) -> Publisher:
        """Creates the NIXL agent and registers the first pool region
        (idempotent; blocking: from async code, ``async with`` does it off the
        loop). Worker mode has nothing to open."""
        if self._native is None and self.decode_at == "frontend":
            ensure_nixl()
            settings = self.settings
            self._native = _native.NativePublisher(
                pool_bytes=settings.pool_bytes,
                region_bytes=min(settings.region_bytes, settings.pool_bytes),
                lease_seconds=settings.lease_seconds,
                acquire_timeout=settings.acquire_timeout,
                limits=settings.limits,
            )
        return self

    async def close(self) -> None:
        """Deregisters the pool, ends the agent and closes a fetcher this
        publisher made. Outstanding descriptors can no longer be read."""
        native, self._native = self._native, None
        self.cache.clear()
        self.data_urls.clear()
        if native is not None:
            await asyncio.to_thread(native.close)
        if self._own_fetcher and self._fetcher is not None:
            await self._fetcher.close()
            self._fetcher = None

    async def __aenter__(self) -> Publisher:
        await asyncio.to_thread(self.open)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _opened(self) -> _native.NativePublisher:
        self.open()
        if self._native is None:
            raise RuntimeError("a Publisher with decode_at='worker' has no NIXL agent")
        return self._native

    def _open_native(self, what: str) -> _native.NativePublisher:
        if self._native is None:
            raise RuntimeError(f"{what}: the Publisher is not open (open() or `async with` it first)")
        return self._native

    # -- use ------------------------------------------------------------------

    @property
    def fetcher(self) -> Fetcher:
        """The Fetcher URLs are fetched with (made on first use when none was given)."""
        if self._fetcher is None:
            self._fetcher = default_fetcher()
        return self._fetcher

    @property
    def agent_name(self) -> str:
        """The NIXL agent's name (the publisher must be open)."""
        return self._open_native("agent_name").agent_name

    async def decode_and_publish(
        self,
        source: bytes | bytearray | memoryview | str,
        *,
        mode: Mode = "RGB",
        background: tuple[int, int, int] = BACKGROUND,
        layout: Layout = "HWC",
        resize: Shaping | None = None,
        cache_salt: str | None = None,
    ) -> Decoded | PassThrough:
        """Fetches `source` (encoded bytes, or a `data:`/`http(s)` URL through
        the publisher's Fetcher), decodes it into a pool slot off the event
        loop and returns its descriptor. `background` is what RGBA is
        composited onto for ``mode="RGB"`` (vLLM's ``rgba_background_color``).
        ``layout="RGBX"`` (RGB only) stores four bytes a pixel, Pillow's
        in-memory layout: 33% more to move, but a reader asking for a PIL
        image maps it without a copy. `resize` (a :class:`ResizePolicy`, RGB
        only) resizes to the size the model's processor would, with its
        arithmetic, right after decoding; the descriptor records it.
        With the cache on, an image published before with the same options
        and `cache_salt` is handed out again, not decoded.
        With ``decode_at="worker"`` it does neither and returns a
        :class:`PassThrough`."""
        if self.decode_at == "worker":
            return _pass_through(source)
        native = self._opened()
        options = ImageOptions(mode, background, layout, resize)
        options.check()
        data = await self.fetcher.fetch(source) if isinstance(source, str) else _encoded(source)
        (outcome,) = await self._publish(native, [data], options, cache_salt)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def decode_and_publish_many(
        self,
        sources: Sequence[bytes | bytearray | memoryview | str],
        *,
        mode: Mode = "RGB",
        background: tuple[int, int, int] = BACKGROUND,
        layout: Layout = "HWC",
        resize: Shaping | None = None,
        cache_salt: str | None = None,
    ) -> list[Decoded | PassThrough | Exception]:
        """:meth:`decode_and_publish` for every source, with the same options:
        URLs fetched concurrently, then every image decoded side by side on
        native threads (all cores) in one trip off the event loop. One result
        per source, in order: its :class:`Decoded` (:class:`PassThrough` with
        ``decode_at="worker"``), or the exception it failed with
        (:class:`pixelwire.UnsupportedFormat`, :class:`pixelwire.DecodeError`,
        :class:`pixelwire.FetchError`, :class:`pixelwire.PoolExhausted`, ...),
        returned, not raised: the others are published all the same, and the
        caller owns them (a reader's notification, :meth:`release` or the
        lease frees each). Cancelled, it frees whatever the batch publishes.
        With the cache on, each image is decoded once however often it
        comes, here or in requests running beside this one."""
        if self.decode_at == "worker":
            return [_pass_through(source) for source in sources]
        native = self._opened()
        options = ImageOptions(mode, background, layout, resize)
        options.check()
        urls = [source for source in sources if isinstance(source, str)]
        fetched = iter(await self.fetcher.fetch_many(urls) if urls else [])
        encoded: list[bytes | bytearray | Exception] = [
            next(fetched) if isinstance(source, str) else _encoded(source) for source in sources
        ]
        published = iter(
            await self._publish(
                native, [data for data in encoded if not isinstance(data, Exception)], options, cache_salt
            )
        )
        return [data if isinstance(data, Exception) else next(published) for data in encoded]

    async def _publish(
        self,
        native: _native.NativePublisher,
        sources: list[bytes | bytearray],
        options: ImageOptions,
        salt: str | None,
    ) -> list[Decoded | Exception]:
        """Every source published, through the cache when it is on."""
        publish = functools.partial(self._publish_off_loop, native, options)
        if not self.cache.enabled or not sources:
            return await publish(sources, None)
        return await publish_through_cache(
            self.cache, self.data_urls, native, sources, options, salt, publish, self.release
        )

    async def _publish_off_loop(
        self,
        native: _native.NativePublisher,
        options: ImageOptions,
        sources: list[bytes | bytearray],
        digests: Sequence[str] | None,
    ) -> list[Decoded | Exception]:
        """:func:`~pixelwire.publisher.images.publish_many` in a worker
        thread, each result as its descriptor."""
        return await self._publish_medium(
            native, ImageBatch(sources, options, self.settings.publish_threads, digests)
        )

    async def publish(self, job: MediumPublish[Any, D]) -> D:
        """Any medium's decode-and-publish (:class:`pixelwire.publisher.medium.MediumPublish`)
        off the event loop on its threads; cancelled, it frees what the
        publish still makes. Returns its descriptors."""
        return await self._publish_medium(self._opened(), job)

    async def _publish_medium(self, native: _native.NativePublisher, job: MediumPublish[R, D]) -> D:
        control = _native.BatchControl()
        call = functools.partial(job.run, native, control)
        release = functools.partial(job.release, native)
        result = await off_loop(native, job.executor(), call, control, release)
        return job.described(native.agent_name, result, time.time())

    async def decode_and_publish_video(
        self,
        source: bytes | bytearray | memoryview | str,
        *,
        sampling: VideoSampling | None = None,
        limits: _native.VideoLimits | None = None,
        threads: int = 0,
        resize: ResizePolicy | None = None,
        client: str | None = None,
        cache_salt: str | None = None,
    ) -> DecodedVideo | PassThrough:
        """Fetches `source` as :meth:`decode_and_publish` does, samples its
        frames as vLLM's video loader would (``sampling``: the loader, its
        ``num_frames`` and ``fps``; vLLM's ``opencv`` defaults when None),
        decodes them straight into one pool slot off the event loop, on one
        of ``VIDEO_DECODE_CALLS`` threads of lowered priority (checked
        against ``limits`` before any frame memory exists; ``threads``
        decoder threads, 0 for all cores) and returns its descriptor, whose
        frames and metadata are what the loader returns; with `resize` (the
        model's video processor's, :func:`pixelwire.resize.video_resize_policy`)
        each frame at the size that processor resizes it to. Raises what
        :func:`pixelwire.decode_video` raises; with ``decode_at="worker"``
        returns a :class:`PassThrough`. ``client`` names whose video this
        is: one client's videos hold at most ``VIDEO_DECODES_PER_CLIENT`` of
        the decode threads (its others wait for one of its own), and decode
        in turns shared by client (:func:`pixelwire.video.decode.video_decode_executor`);
        without it, the video is a client of its own. With the cache on, a
        video published before from the same bytes, sampled and resized the
        same way, for the same `cache_salt`, is handed out again, not
        decoded."""
        if self.decode_at == "worker":
            return _pass_through(source)
        native = self._opened()
        sampling = sampling or VideoSampling()
        data = await self.fetcher.fetch(source) if isinstance(source, str) else _encoded(source)
        client = client if client is not None else f"video-{next(_videos)}"
        job = VideoPublish(
            data, sampling, limits, threads, resize, client, self._video_pool, self.settings.acquire_timeout
        )

        async def publish() -> DecodedVideo:
            async with self._video_shares.held(client):
                return await self._publish_medium(native, job)

        if not self.cache.enabled:
            return await publish()
        key = await video_cache_key(self.data_urls, data, sampling, resize, cache_salt)
        published = await publish_one_through_cache(self.cache, native, key, publish)
        assert isinstance(published, DecodedVideo), "a video key names a video"
        return published

    def release(self, decoded: PublishedSlot) -> bool:
        """Ends a descriptor's hand-out of its slot before its reader's
        notification or its lease (its request is over): the slot is freed
        unless the cache keeps it or another hand-out is outstanding. False
        when that hand-out had ended already, by a notification, an expired
        lease or an earlier release."""
        native = self._native
        return native is not None and native.release(decoded.slot, decoded.generation, handout(decoded))

    def stats(self) -> dict[str, int]:
        """Pool and slot counters, and the caches' (the publisher must be open):
        the cache's ``cache_hits``, ``cache_misses``, ``cache_bytes``,
        ``cache_budget`` and ``cache_entries``; the data: URL memo's
        ``data_url_hits``, ``data_url_misses``, ``data_url_bytes`` and
        ``data_url_budget`` (:func:`pixelwire.caches.interface.counts`); the pool's
        ``pinned_slots``, ``pinned_bytes``, ``outstanding_handouts``, ``handed_out``
        and ``evicted``."""
        stats = dict(self._open_native("stats()").stats())
        stats.update({f"cache_{name}": value for name, value in self.cache.stats().items()})
        stats.update(counts(self.data_urls, "data_url_"))
        return stats
