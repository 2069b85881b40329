"""One request's media, from the URLs a client sent to what vLLM is handed:
each part fetched through the guard (within the request's encoded-bytes
cap), its image checked against the request's pixel and pool budget from
its header, decoded and published into NIXL-registered memory, and its URL
replaced in the body by a signed descriptor reference (or by its bytes,
for what the worker decodes)."""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter
from typing import Any

from pixelwire._native import (
    BlockedURL,
    DecodeError,
    FetchError,
    PixelwireError,
    PoolExhausted,
    UnidentifiedMedia,
    UnsupportedFormat,
    VideoTooLarge,
    probe_image,
)
from pixelwire.caches.data_urls import DataUrlMemo
from pixelwire.config import DECODED_MODES, Layout, Mode
from pixelwire.descriptor import Decoded, PassThrough, PublishedSlot
from pixelwire.fetch import Fetcher
from pixelwire.frontend.errors import OpenAIError
from pixelwire.frontend.inspect import image_settings, video_sampling
from pixelwire.frontend.media import FRONTEND_MEDIA, Fetched, bytes_url
from pixelwire.frontend.settings import FrontendConfig
from pixelwire.frontend.video_parts import VideoParts
from pixelwire.loader_input import FrameListRefused, checked_container, image_format
from pixelwire.media import AUDIO, IMAGE, PROCESSED_IMAGE, VIDEO
from pixelwire.media_parts import MediaPart
from pixelwire.metrics import MediaMetrics
from pixelwire.processed import PatchLayout
from pixelwire.publisher import Publisher
from pixelwire.resent_reference import MIN_URL_CHARS, encode_resent
from pixelwire.resize import ResizePolicy
from pixelwire.signing import encode_reference

# The package's one logger: its name is what the frontend's log lines carry.
log = logging.getLogger("pixelwire.frontend")


# The frontend setting behind each VideoLimits setting a video went over.
_VIDEO_FLAGS = {
    "max_bytes": "--max-video-bytes",
    "max_frames": "--max-video-frames",
    "max_pixels": "--max-video-pixels",
    "max_frame_bytes": "--max-video-frame-bytes (and half of --pool-bytes, what videos may hold)",
    "max_seconds": "--max-video-seconds",
    "max_decode_pixels": "--max-video-decode-pixels",
}


def _media_error(part: MediaPart, error: BaseException) -> OpenAIError:
    medium = part.kind
    if isinstance(error, (VideoTooLarge, FrameListRefused)) and error.setting is not None:
        flag = _VIDEO_FLAGS.get(error.setting, error.setting)
        return OpenAIError(400, f"{part.where}: {error}; the frontend's setting is {flag}", param=part.where)
    if isinstance(error, PoolExhausted):
        return OpenAIError(503, f"{part.where}: the frontend's image pool is full; retry shortly")
    if isinstance(error, BlockedURL):
        return OpenAIError(400, f"{part.where}: {medium} URL refused: {error}", param=part.where)
    if isinstance(error, FetchError):
        return OpenAIError(400, f"{part.where}: could not fetch the {medium}: {error}", param=part.where)
    if isinstance(error, DecodeError):
        return OpenAIError(400, f"{part.where}: could not decode the {medium}: {error}", param=part.where)
    if isinstance(error, (PixelwireError, ValueError)):
        return OpenAIError(400, f"{part.where}: {error}", param=part.where)
    log.error("unexpected error handling %s", part.where, exc_info=error)
    return OpenAIError(500, f"{part.where}: internal error handling the {medium}")


def _shipped_channels(mode: Mode, layout: Layout, resize: ResizePolicy | PatchLayout | None) -> int:
    """Bytes a pixel (of the shipped size) takes in the pool, as published."""
    if isinstance(resize, PatchLayout):
        return resize.bytes_per_pixel
    return 4 if layout == "RGBX" or mode == "RGBA" else 3 if mode == "RGB" else 1


class MediaPipeline:
    """The media of one request: :meth:`run` once, then release
    :attr:`published` when the request ends, however it ends."""

    def __init__(
        self,
        config: FrontendConfig,
        fetcher: Fetcher,
        publisher: Publisher,
        metrics: MediaMetrics,
        body: dict[str, Any],
        parts: list[MediaPart],
        sent: DataUrlMemo | None = None,
        client: str = "?",
    ) -> None:
        self.config = config
        # Who sent the request (its peer address): whose share of the video
        # decoding its videos take.
        self.client = client
        self.fetcher = fetcher
        self.publisher = publisher
        self.metrics = metrics
        self.parts = parts
        self.mode, self.background = image_settings(config.image_kwargs, body)
        self.native = config.decode_at == "frontend" and self.mode in DECODED_MODES
        # A request with its own mm_processor_kwargs may change the
        # processor's size: its images ship at full resolution (within the
        # request's pixel and pool budget, checked before any decode).
        self.resize: ResizePolicy | PatchLayout | None = (
            config.resize if self.mode == "RGB" and "mm_processor_kwargs" not in body else None
        )
        # vLLM wants PIL images: RGB goes in Pillow's layout, mapped not copied.
        self.layout: Layout = "RGBX" if self.mode == "RGB" else "HWC"
        if self.resize is not None and config.processed is not None:
            # Processed inputs: what the model's processor would make of
            # each image, so that vLLM's API server makes nothing of it.
            self.resize, self.layout = config.processed, "PATCHES"
        # What is left of the request's budget: decoded pixels and pool bytes.
        self.pixels_left = config.max_pixels_per_request
        self.pool_bytes = config.publisher.pool_bytes
        self.pool_bytes_left = self.pool_bytes
        # Encoded bytes fetched so far, and the error of the fetch that went
        # over the request's cap: every fetch after it fails with it too.
        self.fetched_bytes = 0
        self.over: OpenAIError | None = None
        # Each part's outcome, in its place: its new URL, its fetched bytes
        # (until decoded) or its error.
        self.results: list[str | Fetched | BaseException | None] = [None] * len(parts)
        # How the worker will sample the request's videos (None: passed on),
        # and resize their frames (not for a request with its own
        # mm_processor_kwargs, as for images).
        self.video = video_sampling(config, body) if config.decode_at == "frontend" else None
        self.video_resize = config.video_resize if "mm_processor_kwargs" not in body else None
        # Every image and video published for the request, to be released at its end.
        self.published: list[PublishedSlot] = []
        # vLLM's tenant salt: requests with different salts (or one with
        # and one without) never share a cached image.
        self.cache_salt = body.get("cache_salt")
        if self.cache_salt is not None and not (isinstance(self.cache_salt, str) and self.cache_salt):
            raise OpenAIError(400, "cache_salt must be a non-empty string", param="cache_salt")
        # Worker mode: the data: URLs the worker was sent before, by digest
        # (None: every URL goes in full). An image's URL found there goes on
        # as a resent image's reference (pixelwire.resent_reference).
        self.sent = sent if config.decode_at == "worker" and config.secret is not None else None
        # The image data: URLs sent as such references, and those sent in full.
        self.referenced: list[str] = []
        self.sent_in_full: list[str] = []

    async def run(self) -> None:
        """Puts each part's new URL in its place in the body, or raises the
        request's answer (an :class:`OpenAIError`) when one of them fails."""
        # One request's fetches share a few connections, so a request full of
        # slow URLs cannot hold every pooled connection the others need.
        # Images are decoded in batches of those whose bytes have arrived:
        # a request of data: URLs is one batch; fetches still running go on
        # while a batch decodes, and what they bring is the next batch. The
        # first failure stops the rest (nothing more is decoded, fetches
        # still running are cancelled) and fails the request.
        with self.fetcher.concurrency_limit(self.config.max_fetches_per_request):
            fetching = {asyncio.ensure_future(self._fetch_part(part)): i for i, part in enumerate(self.parts)}
            pending = set(fetching)
            try:
                while pending and not self._failed():
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        error = task.exception()
                        self.results[fetching[task]] = error if error is not None else task.result()
                    if self._failed():
                        break
                    batch = sorted((fetching[task], self.results[fetching[task]]) for task in done)
                    to_decode = [(index, item) for index, item in batch if isinstance(item, Fetched)]
                    if to_decode:
                        self._spend([(self.parts[i], item) for i, item in to_decode])
                        await self._decode_fetched(to_decode)
            finally:
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.gather(*pending, return_exceptions=True)
        if self.over is not None:
            raise self.over
        self._raise_first_failure()
        for part, result in zip(self.parts, self.results, strict=True):
            assert isinstance(result, str)
            part.holder[part.key] = result

    def _failed(self) -> bool:
        return any(isinstance(r, BaseException) for r in self.results)

    async def fetch(self, part: MediaPart) -> bytes:
        """The part's bytes, fetched through the guard and counted against
        the request's encoded-bytes cap."""
        if self.over is not None:
            raise self.over
        return self._count(part, await self.fetcher.fetch(part.url))

    def _count(self, part: MediaPart, data: bytes) -> bytes:
        """``data`` (the part's bytes, fetched or remembered), counted
        against the request's encoded-bytes cap (:meth:`count_bytes`)."""
        self.count_bytes(part, len(data))
        return data

    def count_bytes(self, part: MediaPart, nbytes: int) -> None:
        """Counts ``nbytes`` of the part's against the request's
        encoded-bytes cap: the part that goes over it fails with the cap's
        error, and so does every part after it."""
        if self.over is not None:
            raise self.over
        self.fetched_bytes += nbytes
        limit = self.config.max_image_bytes_per_request
        if self.fetched_bytes > limit:
            self.over = OpenAIError(
                400,
                f"{part.where}: the request's media reach {self.fetched_bytes} encoded bytes, over the limit "
                f"of {limit} bytes per request (max_image_bytes_per_request)",
                param=part.where,
            )
            raise self.over

    async def fetch_remembered(self, part: MediaPart) -> bytes:
        """An image's (or a video's) bytes: a ``data:`` URL this frontend decoded lately
        for the same salt gives the same bytes object (and the publisher
        its digest) without decoding it again, counted as a fetch is."""
        memo = self.publisher.data_urls
        if not (self.native and memo.budget and part.url[:5].lower() == "data:"):
            return await self.fetch(part)
        known = memo.lookup(part.url, self.cache_salt)
        if known is None:
            data = await self.fetch(part)
            memo.remember(part.url, self.cache_salt, data)
            return data
        return self._count(part, known)

    async def _fetch_part(self, part: MediaPart) -> str | Fetched:
        """The part's new URL, by its kind's handler in FRONTEND_MEDIA; for
        an image to decode here, its bytes."""
        handler = FRONTEND_MEDIA.get(part.kind)
        if self.config.decode_at == "worker":
            # The worker fetches, with its own guard (vLLM's allowed
            # domains); refuse here what this one would refuse too.
            self.fetcher.check(part.url)
            return handler.passed_on(self, part)
        return await handler.decoded_here(self, part)

    def passed_url(self, url: str) -> str:
        """A worker-mode image's (or video's) URL as it goes on: a large
        ``data:`` URL the worker was sent before (the same text, under the
        same salt) as a resent reference, else as it came."""
        if len(url) < MIN_URL_CHARS or url[:5].lower() != "data:":
            return url
        known = self.sent.lookup_digest(url, self.cache_salt) if self.sent is not None else None
        if known is None:
            self.sent_in_full.append(url)
            return url
        assert self.config.secret is not None
        self.referenced.append(url)
        return encode_resent(*known, self.config.secret, self.config.publisher.lease_seconds)

    def _spend(self, fetched: list[tuple[MediaPart, Fetched]]) -> None:
        """Takes the images about to be decoded out of the request's budget,
        from their headers (no pixel memory yet): decoded pixels, and pool
        bytes at the size they ship. Over either, the request is refused
        before they are decoded. An image whose header cannot be read is
        left to the decode, which says why."""
        channels = _shipped_channels(self.mode, self.layout, self.resize)
        for part, item in fetched:
            try:
                height, width = probe_image(item.data)["oriented_size"]
            except (PixelwireError, ValueError):
                continue
            self.pixels_left -= height * width
            if self.pixels_left < 0:
                limit = self.config.max_pixels_per_request
                raise OpenAIError(
                    400,
                    f"{part.where}: the request's images reach more than {limit} decoded pixels, the "
                    "limit per request (max_pixels_per_request)",
                    param=part.where,
                )
            shipped = self.resize.target(height, width) if self.resize is not None else (height, width)
            self.pool_bytes_left -= shipped[0] * shipped[1] * channels
            if self.pool_bytes_left < 0:
                raise OpenAIError(
                    400,
                    f"{part.where}: the request's images need more than the frontend's whole image pool "
                    f"({self.pool_bytes} bytes) at once, so it could never be served (pool_bytes)",
                    param=part.where,
                )

    async def _decode_fetched(self, fetched: list[tuple[int, Fetched]]) -> None:
        """Decodes and publishes the request's fetched images (each with its
        index in ``results``) in one batch on native threads, and puts each
        one's new URL, or its error, in its place. Everything published goes
        into ``published`` before any result is looked at, so whatever fails,
        the request's end releases every slot."""
        outcomes = await self.publisher.decode_and_publish_many(
            [item.data for _, item in fetched],
            mode=self.mode,
            background=self.background,
            layout=self.layout,
            resize=self.resize,
            cache_salt=self.cache_salt,
        )
        done = perf_counter()
        self.published.extend(outcome for outcome in outcomes if isinstance(outcome, Decoded))
        for (index, item), outcome in zip(fetched, outcomes, strict=True):
            assert not isinstance(outcome, PassThrough), "images are fetched only to be decoded here"
            if isinstance(outcome, UnsupportedFormat):
                # Not a format pixelwire decodes: the bytes already fetched go
                # on to the worker, whose plug-in hands them to vLLM's loader,
                # once they are one image format.
                try:
                    image_format(item.data)
                except UnidentifiedMedia as error:
                    self.results[index] = error
                    continue
                self.metrics.handled("passthrough", 0)
                self.results[index] = bytes_url(item.data)
            elif isinstance(outcome, Exception):
                self.results[index] = outcome
            else:
                # Fetch and decode, as the request waited for them.
                self.metrics.observe("nixl", done - item.started)
                source = outcome.resize["source"] if outcome.resize else None
                if outcome.processed is not None:
                    # Patch rows: counted as the bytes they are, of an RGB source.
                    height, width = source if source is not None else outcome.shape[:2]
                    self.metrics.handled(
                        "nixl", outcome.size, height * width * 3, medium=PROCESSED_IMAGE.metrics_label
                    )
                else:
                    self.metrics.handled_image("nixl", outcome.shape, source)
                self.results[index] = encode_reference(outcome.to_dict(), self.config.secret)

    def _raise_first_failure(self) -> None:
        """The request's answer when one of its media failed: the first one's error."""
        for part, result in zip(self.parts, self.results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                self.metrics.failed(result)
                raise _media_error(part, result)


class ImageParts:
    """An image part: fetched (a ``data:`` URL decoded lately, from the
    memo), then decoded and published in the request's batch (as the
    processor's patch rows where the request's images are processed
    inputs), or passed on as its bytes in a mode pixelwire does not decode;
    in worker mode, its URL (or a resent image's reference)."""

    async def decoded_here(self, pipeline: MediaPipeline, part: MediaPart) -> str | Fetched:
        started = perf_counter()
        data = await pipeline.fetch_remembered(part)
        if not pipeline.native:
            # A mode pixelwire does not decode: fetched here, through this
            # guard, and handed on as the bytes, never as a URL the worker
            # would fetch again (its answer could differ); only once they
            # are one image format.
            image_format(data)
            pipeline.metrics.handled("passthrough", 0)
            return bytes_url(data)
        return Fetched(data, started)

    def passed_on(self, pipeline: MediaPipeline, part: MediaPart) -> str:
        pipeline.metrics.handled("passthrough", 0)
        return pipeline.passed_url(part.url)


class AudioParts:
    """An audio part, which vLLM decodes: its bytes, fetched here through this
    guard and identified as one real container; in worker mode, its URL."""

    async def decoded_here(self, pipeline: MediaPipeline, part: MediaPart) -> str:
        return bytes_url(checked_container(await pipeline.fetch(part), "audio"))

    def passed_on(self, pipeline: MediaPipeline, part: MediaPart) -> str:
        return part.url


FRONTEND_MEDIA.register(IMAGE.part, ImageParts())
FRONTEND_MEDIA.register(VIDEO.part, VideoParts())
FRONTEND_MEDIA.register(AUDIO.part, AudioParts())
