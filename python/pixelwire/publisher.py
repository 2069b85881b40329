"""Frontend side: :class:`Publisher` decodes an image straight into
NIXL-registered memory and returns its descriptor; a worker's READ (whose
notification frees the slot), a release, or the lease ends its life."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import hashlib
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pixelwire import _native, config
from pixelwire._native import SLOT_HEADER_BYTES, PixelwireError
from pixelwire.config import (
    ACQUIRE_TIMEOUT,
    BACKGROUND,
    LEASE_SECONDS,
    POOL_BYTES,
    PUBLISH_CALLS,
    PUBLISH_THREADS,
    REGION_BYTES,
    DecodeAt,
    Layout,
    Mode,
    allow_private_from_env,
    data_url_memo_bytes,
)
from pixelwire.data_url_memo import DataUrlMemo
from pixelwire.descriptor import Decoded, DecodedVideo, PassThrough
from pixelwire.nixl import ensure_nixl
from pixelwire.processed import PatchLayout
from pixelwire.publish_cache import CacheKey, Outcome, PublishCache
from pixelwire.video.decode import (
    capture_opener,
    frame_resize,
    loader_metadata,
    sample_video,
    video_decode_executor,
    with_settled_count,
)
from pixelwire.video.sampling import VideoSampling
from pixelwire.video.shares import ClientShares, PoolShare

if TYPE_CHECKING:
    from pixelwire.fetch import Fetcher
    from pixelwire.resize import ResizePolicy

    # How an image is shaped for the model: resized pixels, or the
    # processor's patch rows of them (processed inputs, layout "PATCHES").
    Shaping = ResizePolicy | PatchLayout

T = TypeVar("T")

# Numbers the videos published without a client, each a client of its own.
_videos = itertools.count()


def default_fetcher() -> Fetcher:
    """A Fetcher with the default SSRF guard; PIXELWIRE_ALLOW_PRIVATE=1 is the
    explicit opt-out for deployments that fetch from their own network."""
    from pixelwire.fetch import Fetcher

    return Fetcher(allow_private=allow_private_from_env())


_executor_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _publish_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The threads publish calls wait on (GIL released) while the native
    pool decodes: their own, so that publishing never waits for, nor fills,
    the event loop's default executor that other work (parsing bodies,
    reads) uses."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(PUBLISH_CALLS, "pixelwire-publish")
        return _executor


def _resize_target(
    data: bytes | bytearray, resize: Shaping | None
) -> list[tuple[int, int]] | Exception | None:
    """The sizes `resize` takes the image to in turn (the last is the one
    shipped), from its header (the orientation applied); the error instead
    when its header says no."""
    if resize is None:
        return None
    try:
        return resize.steps(*_native.probe_image(data)["oriented_size"])
    except (PixelwireError, ValueError) as error:
        return error


def _publish_many(
    native: _native.NativePublisher,
    sources: Sequence[bytes | bytearray],
    mode: Mode,
    background: tuple[int, int, int],
    layout: Layout,
    resize: Shaping | None,
    control: _native.BatchControl,
    threads: int,
    digests: Sequence[str] | None = None,
) -> list[tuple[_native.Published, str] | Exception]:
    """Decode-and-publish of every source (each resized as `resize` says),
    side by side on native threads, plus each published source's SHA-256
    (`digests` when given), in one trip off the event loop (hashlib releases
    the GIL on large inputs). One result per source, in order; a source that
    fails costs only itself."""
    targets = [_resize_target(data, resize) for data in sources]
    to_publish = [index for index, target in enumerate(targets) if not isinstance(target, Exception)]
    options: dict[str, Any] = {}
    if resize is not None:
        options = {"resize_kernel": resize.kernel, "resize_filter": resize.filter}
    published = iter(
        native.publish_many(
            [sources[index] for index in to_publish],
            mode=mode,
            background=background,
            rgbx=layout == "RGBX",
            patches=resize.wire_grid if isinstance(resize, PatchLayout) else None,
            normalize=resize.native_normalize if isinstance(resize, PatchLayout) else None,
            resizes=[target for target in targets if not isinstance(target, Exception)],
            control=control,
            threads=threads,
            **options,
        )
        if to_publish
        else []
    )
    outcomes: list[tuple[_native.Published, str] | Exception] = []
    for index, (data, target) in enumerate(zip(sources, targets, strict=True)):
        fields = target if isinstance(target, Exception) else next(published)
        if isinstance(fields, Exception):
            outcomes.append(fields)
        else:
            outcomes.append((fields, hashlib.sha256(data).hexdigest() if digests is None else digests[index]))
    return outcomes


def _sha256s(sources: Sequence[bytes | bytearray]) -> list[str]:
    """Each source's SHA-256 (off the event loop: hashlib releases the GIL on large inputs)."""
    return [hashlib.sha256(data).hexdigest() for data in sources]


def _handout(decoded: Decoded | DecodedVideo) -> int:
    """Which hand-out of its slot a descriptor is, from its notification."""
    named = _native.parse_notification(decoded.notification)
    return 0 if named is None else named[2]


async def _off_loop(
    native: _native.NativePublisher,
    executor: concurrent.futures.Executor,
    call: Callable[[], T],
    control: _native.BatchControl,
    release: Callable[[T], None],
) -> T:
    """``call`` (a publish under ``control``) on ``executor``. When the
    caller goes away first, ``control`` is cancelled: what was published
    by then is freed, work waiting for a slot or a turn stops and work not
    started is skipped, and what the call still publishes is freed by
    ``release`` as soon as it returns (a second free of a slot is a no-op,
    by its generation)."""
    work = asyncio.get_running_loop().run_in_executor(executor, call)
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        native.cancel(control)
        work.add_done_callback(functools.partial(_release_result, release))
        raise


def _release_result(release: Callable[[T], None], work: asyncio.Future[T]) -> None:
    if not work.cancelled() and work.exception() is None:
        release(work.result())


def _release_batch(
    native: _native.NativePublisher, outcomes: list[tuple[_native.Published, str] | Exception]
) -> None:
    """Frees what an abandoned batch still reports as published."""
    for outcome in outcomes:
        if not isinstance(outcome, Exception):
            fields, _ = outcome
            native.release(fields["slot"], fields["generation"], fields["handout"])


def _release_video(native: _native.NativePublisher, published: _PublishedVideo) -> None:
    """Frees the video an abandoned publish published."""
    fields = published.fields
    native.release(fields["slot"], fields["generation"], fields["handout"])


def _pass_through(source: bytes | bytearray | memoryview | str) -> PassThrough:
    """What worker mode hands on for `source`: its URL, or its bytes as a ``data:`` URL."""
    if isinstance(source, str):
        return PassThrough(source)
    encoded = base64.b64encode(bytes(source)).decode()
    return PassThrough(f"data:application/octet-stream;base64,{encoded}")


def _slot_fields(agent: str, fields: _native.PublishedSlot) -> dict[str, Any]:
    """The descriptor fields of a published slot, image or video."""
    return {
        "nixl_metadata": fields["metadata"],
        "metadata_version": fields["metadata_version"],
        "metadata_pruned": fields["metadata_pruned"],
        "addr": fields["addr"],
        "size": fields["size"],
        "content_hash": fields["content_hash"],
        "agent": agent,
        "slot": fields["slot"],
        "generation": fields["generation"],
        "expires_at": fields["expires_at"],
        "notification": fields["notification"],
    }


def _decoded(
    agent: str,
    fields: _native.Published,
    source_sha256: str,
    mode: Mode,
    background: tuple[int, int, int],
    layout: Layout,
    resize: Shaping | None,
    published_at: float,
) -> Decoded:
    """The descriptor of one image `agent` published."""
    source = fields["source_shape"]
    processed = resize.record(*resize.target(*source)) if isinstance(resize, PatchLayout) else None
    policy = resize.resize if isinstance(resize, PatchLayout) else resize
    return Decoded(
        **_slot_fields(agent, fields),
        shape=fields["shape"],
        format=fields["format"],
        color_type=mode,
        background=background,
        published_at=published_at,
        source_sha256=source_sha256,
        layout=layout,
        extra={"source_mode": fields["color_type"]},
        resize=None if policy is None else {"policy": policy.identity, "source": list(source)},
        processed=processed,
    )


@dataclass(frozen=True)
class _PublishedVideo:
    """What one video publish found and made."""

    fields: _native.PublishedVideo
    loader_metadata: dict[str, Any]
    codec: str
    source_sha256: str
    # The decoded frames' (height, width) before any resize.
    source_size: tuple[int, int]


def _publish_video(
    native: _native.NativePublisher,
    data: bytes | bytearray,
    sampling: VideoSampling,
    limits: _native.VideoLimits | None,
    threads: int,
    resize: ResizePolicy | None,
    control: _native.BatchControl,
    client: str,
    holding: Callable[[int], contextlib.AbstractContextManager[None]],
) -> _PublishedVideo:
    """Opens the video, samples it as the loader does and decodes the
    sampled frames into a slot, each resized as `resize` says (GIL released
    throughout), in turns as `client`'s; stops with :class:`Cancelled` once
    `control` is cancelled. Its slot is taken within `holding(bytes)`
    (the videos' share of the pool)."""

    def publish(settle_count: bool) -> _PublishedVideo:
        open_video = capture_opener(data, threads, limits, settle_count, control, client)
        return _publish_opened(native, open_video, data, sampling, resize, control, holding)

    return with_settled_count(publish)


def _publish_opened(
    native: _native.NativePublisher,
    open_video: Callable[[], _native.VideoCapture],
    data: bytes | bytearray,
    sampling: VideoSampling,
    resize: ResizePolicy | None,
    control: _native.BatchControl,
    holding: Callable[[int], contextlib.AbstractContextManager[None]],
) -> _PublishedVideo:
    capture = open_video()
    info = capture.info()
    source, wanted = sample_video(
        capture, sampling.loader, sampling.num_frames, sampling.fps, sampling.loader_kwargs
    )
    size = (info["height"], info["width"])
    options = frame_resize(resize, size, len(set(wanted)), source)
    height, width = options.get("resize", size)
    with holding(SLOT_HEADER_BYTES + len(set(wanted)) * height * width * 3):
        fields = native.publish_video(capture, wanted, control=control, **options)
        settled = frame_resize(resize, size, len(fields["indices"]), source)
        if settled != options:
            # A frame that did not decode changed the count a per-video size
            # depends on: the decoded frames again, at the size for that count.
            native.release(fields["slot"], fields["generation"], fields["handout"])
            decoded = fields["indices"]
            fields = native.publish_video(open_video(), decoded, control=control, **settled)
            if fields["indices"] != decoded:
                native.release(fields["slot"], fields["generation"], fields["handout"])
                raise _native.VideoDecodeError(
                    f"the video's frames {decoded} decoded as {fields['indices']} when read again"
                )
    return _PublishedVideo(
        fields,
        loader_metadata(source, fields["indices"]),
        info["codec"],
        hashlib.sha256(data).hexdigest(),
        size,
    )


def _check_resize(mode: Mode, layout: Layout, resize: Shaping | None) -> None:
    if resize is not None and mode != "RGB":
        raise ValueError("a model-aware resize needs mode='RGB' (what the processors see)")
    if (layout == "PATCHES") != isinstance(resize, PatchLayout):
        raise ValueError("the PATCHES layout is made for a processor's patch layout (resize=PatchLayout)")


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
    (see :mod:`pixelwire.publish_cache`), and :attr:`data_urls` the
    ``data:`` URLs behind them, within a share of it
    (:mod:`pixelwire.data_url_memo`).
    """

    def __init__(
        self,
        *,
        pool_bytes: int = POOL_BYTES,
        lease_seconds: float = LEASE_SECONDS,
        limits: _native.Limits | None = None,
        acquire_timeout: float = ACQUIRE_TIMEOUT,
        region_bytes: int = REGION_BYTES,
        decode_at: DecodeAt | None = None,
        fetcher: Fetcher | None = None,
        publish_threads: int = PUBLISH_THREADS,
        cache_bytes: int = 0,
    ) -> None:
        self.decode_at = config.decode_at(decode_at)
        if not lease_seconds >= _native.MIN_LEASE_SECONDS:
            raise ValueError(
                f"lease_seconds must be at least {_native.MIN_LEASE_SECONDS} (got {lease_seconds}): "
                "a shorter lease frees slots before a worker can read them"
            )
        self._fetcher = fetcher
        self._own_fetcher = fetcher is None
        self.pool_bytes = pool_bytes
        self.lease_seconds = lease_seconds
        self.limits = limits
        self.acquire_timeout = acquire_timeout
        self.region_bytes = min(region_bytes, pool_bytes)
        self.publish_threads = publish_threads
        self.cache = PublishCache(max(0, min(cache_bytes, pool_bytes)))
        self.data_urls = DataUrlMemo(data_url_memo_bytes(self.cache.budget))
        self._video_shares = ClientShares(config.VIDEO_DECODES_PER_CLIENT)
        self._video_pool = PoolShare(config.video_pool_bytes(pool_bytes))
        self._native: _native.NativePublisher | None = None

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
            self._native = _native.NativePublisher(
                pool_bytes=self.pool_bytes,
                region_bytes=self.region_bytes,
                lease_seconds=self.lease_seconds,
                acquire_timeout=self.acquire_timeout,
                limits=self.limits,
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
        _check_resize(mode, layout, resize)
        data = await self.fetcher.fetch(source) if isinstance(source, str) else _encoded(source)
        (outcome,) = await self._publish(native, [data], mode, background, layout, resize, cache_salt)
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
        _check_resize(mode, layout, resize)
        urls = [source for source in sources if isinstance(source, str)]
        fetched = iter(await self.fetcher.fetch_many(urls) if urls else [])
        encoded: list[bytes | bytearray | Exception] = [
            next(fetched) if isinstance(source, str) else _encoded(source) for source in sources
        ]
        published = iter(
            await self._publish(
                native,
                [data for data in encoded if not isinstance(data, Exception)],
                mode,
                background,
                layout,
                resize,
                cache_salt,
            )
        )
        return [data if isinstance(data, Exception) else next(published) for data in encoded]

    async def _publish(
        self,
        native: _native.NativePublisher,
        sources: list[bytes | bytearray],
        mode: Mode,
        background: tuple[int, int, int],
        layout: Layout,
        resize: Shaping | None,
        salt: str | None,
    ) -> list[Decoded | Exception]:
        """Every source published, through the cache when it is on."""
        if not self.cache.enabled or not sources:
            return await self._publish_off_loop(native, sources, mode, background, layout, resize)
        loop = asyncio.get_running_loop()
        # A resent data: URL's bytes come with the digest noted the first time.
        noted = [self.data_urls.sha256(data) for data in sources]
        unknown = [data for data, sha256 in zip(sources, noted, strict=True) if sha256 is None]
        computed = iter(await loop.run_in_executor(_publish_executor(), _sha256s, unknown) if unknown else [])
        digests = [sha256 if sha256 is not None else next(computed) for sha256 in noted]
        for data, known, sha256 in zip(sources, noted, digests, strict=True):
            if known is None:
                self.data_urls.note_sha256(data, sha256)
        identity = None if resize is None else resize.identity
        keys = [
            CacheKey(digest, len(data), mode, background, layout, identity, salt)
            for digest, data in zip(digests, sources, strict=True)
        ]
        results: list[Decoded | Exception | None] = [None] * len(sources)
        try:
            await self._publish_cached(
                native, sources, digests, keys, results, mode, background, layout, resize
            )
        except BaseException:
            # The caller went away: every hand-out it got is ended now.
            for result in results:
                if isinstance(result, Decoded):
                    self.release(result)
            raise
        return [RuntimeError("an image was left unpublished (a bug)") if r is None else r for r in results]

    async def _publish_cached(
        self,
        native: _native.NativePublisher,
        sources: list[bytes | bytearray],
        digests: list[str],
        keys: list[CacheKey],
        results: list[Decoded | Exception | None],
        mode: Mode,
        background: tuple[int, int, int],
        layout: Layout,
        resize: Shaping | None,
    ) -> None:
        """Fills `results`: a hit is handed out; the first of each missing key
        (here or in no other request) is decoded, once, and kept; a repeat
        here, or a key another request is decoding, gets a hand-out of that
        decode (or its error). What none of that served (a decode abandoned
        by its request, an image too large to keep) is decoded uncached."""
        cache = self.cache
        leaders: dict[CacheKey, int] = {}
        repeats: list[tuple[int, CacheKey]] = []
        waits: list[tuple[int, CacheKey, asyncio.Future[Outcome]]] = []
        for index, key in enumerate(keys):
            hit = cache.hand_out(native, key)
            future = cache.waiting_on(key)
            if hit is not None:
                results[index] = hit
            elif key in leaders:
                repeats.append((index, key))
            elif future is not None:
                waits.append((index, key, future))
            else:
                leaders[key] = index
                cache.begin(key)
        try:
            firsts = list(leaders.values())
            outcomes = (
                await self._publish_off_loop(
                    native,
                    [sources[index] for index in firsts],
                    mode,
                    background,
                    layout,
                    resize,
                    [digests[index] for index in firsts],
                )
                if firsts
                else []
            )
        except BaseException:
            for key in leaders:
                cache.finish_abandoned(key)
            raise
        for (key, index), outcome in zip(leaders.items(), outcomes, strict=True):
            results[index] = outcome
            cache.finish(native, key, outcome)
        for index, key in repeats:
            results[index] = self._again(native, key, results[leaders[key]])
        for index, key, future in waits:
            results[index] = self._again(native, key, await asyncio.shield(future))
        rest = [index for index, result in enumerate(results) if result is None]
        if rest:
            again = await self._publish_off_loop(
                native, [sources[index] for index in rest], mode, background, layout, resize
            )
            for index, outcome in zip(rest, again, strict=True):
                results[index] = outcome

    def _again(
        self, native: _native.NativePublisher, key: CacheKey, outcome: Outcome
    ) -> Decoded | Exception | None:
        """What a request waiting on a decode of `key` gets: the decode's
        error, or a hand-out of what it published (None: decode it anew)."""
        if isinstance(outcome, Exception):
            return outcome
        return None if outcome is None else self.cache.hand_out(native, key)

    async def _publish_off_loop(
        self,
        native: _native.NativePublisher,
        sources: list[bytes | bytearray],
        mode: Mode,
        background: tuple[int, int, int],
        layout: Layout,
        resize: Shaping | None,
        digests: Sequence[str] | None = None,
    ) -> list[Decoded | Exception]:
        """:func:`_publish_many` in a worker thread, each result as its descriptor."""
        control = _native.BatchControl()
        call = functools.partial(
            _publish_many,
            native,
            sources,
            mode,
            background,
            layout,
            resize,
            control,
            self.publish_threads,
            digests,
        )
        release = functools.partial(_release_batch, native)
        outcomes: list[tuple[_native.Published, str] | Exception] = await _off_loop(
            native, _publish_executor(), call, control, release
        )
        published_at = time.time()
        return [
            outcome
            if isinstance(outcome, Exception)
            else _decoded(native.agent_name, *outcome, mode, background, layout, resize, published_at)
            for outcome in outcomes
        ]

    async def decode_and_publish_video(
        self,
        source: bytes | bytearray | memoryview | str,
        *,
        sampling: VideoSampling | None = None,
        limits: _native.VideoLimits | None = None,
        threads: int = 0,
        resize: ResizePolicy | None = None,
        client: str | None = None,
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
        without it, the video is a client of its own."""
        if self.decode_at == "worker":
            return _pass_through(source)
        native = self._opened()
        sampling = sampling or VideoSampling()
        data = await self.fetcher.fetch(source) if isinstance(source, str) else _encoded(source)
        control = _native.BatchControl()
        client = client if client is not None else f"video-{next(_videos)}"
        holding = functools.partial(self._video_pool.taken, timeout=self.acquire_timeout, control=control)
        call = functools.partial(
            _publish_video, native, data, sampling, limits, threads, resize, control, client, holding
        )
        async with self._video_shares.held(client):
            release = functools.partial(_release_video, native)
            published = await _off_loop(native, video_decode_executor(), call, control, release)
        fields = published.fields
        return DecodedVideo(
            **_slot_fields(native.agent_name, fields),
            shape=fields["shape"],
            loader_metadata=published.loader_metadata,
            sampling=sampling.to_dict(),
            codec=published.codec,
            published_at=time.time(),
            source_sha256=published.source_sha256,
            resize=None
            if resize is None
            else {"policy": resize.identity, "source": list(published.source_size)},
        )

    def release(self, decoded: Decoded | DecodedVideo) -> bool:
        """Ends a descriptor's hand-out of its slot before its reader's
        notification or its lease (its request is over): the slot is freed
        unless the cache keeps it or another hand-out is outstanding. False
        when that hand-out had ended already, by a notification, an expired
        lease or an earlier release."""
        native = self._native
        return native is not None and native.release(decoded.slot, decoded.generation, _handout(decoded))

    def stats(self) -> dict[str, int]:
        """Pool and slot counters, and the cache's (the publisher must be open):
        ``cache_hits``, ``cache_misses``, ``cache_entries``; the data: URL
        memo's ``data_url_hits`` and ``data_url_bytes``; the pool's
        ``pinned_slots``, ``pinned_bytes``, ``outstanding_handouts``, ``handed_out``
        and ``evicted``."""
        stats = dict(self._open_native("stats()").stats())
        stats.update({f"cache_{name}": value for name, value in self.cache.stats().items()})
        stats.update({"data_url_hits": self.data_urls.hits, "data_url_bytes": self.data_urls.held})
        return stats
