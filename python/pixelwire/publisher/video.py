"""A video sampled as vLLM's loader samples it and its frames decoded
straight into one slot (:func:`publish_video`), and its descriptor
(:func:`video_descriptor`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pixelwire import _native
from pixelwire._native import SLOT_HEADER_BYTES
from pixelwire.caches.data_urls import DataUrlMemo
from pixelwire.caches.published_images import VideoCacheKey
from pixelwire.descriptor import DecodedVideo
from pixelwire.publisher.images import sha256s
from pixelwire.publisher.off_loop import publish_executor
from pixelwire.publisher.slots import release_slot, slot_fields
from pixelwire.video.decode import (
    capture_opener,
    frame_resize,
    loader_metadata,
    sample_video,
    video_decode_executor,
    with_settled_count,
)
from pixelwire.video.sampling import VideoSampling
from pixelwire.video.shares import PoolShare

if TYPE_CHECKING:
    from pixelwire.resize import ResizePolicy


@dataclass(frozen=True)
class PublishedVideo:
    """What one video publish found and made."""

    fields: _native.PublishedVideo
    loader_metadata: dict[str, Any]
    codec: str
    source_sha256: str
    # The decoded frames' (height, width) before any resize.
    source_size: tuple[int, int]


def publish_video(
    native: _native.NativePublisher,
    data: bytes | bytearray,
    sampling: VideoSampling,
    limits: _native.VideoLimits | None,
    threads: int,
    resize: ResizePolicy | None,
    control: _native.BatchControl,
    client: str,
    holding: Callable[[int], contextlib.AbstractContextManager[None]],
) -> PublishedVideo:
    """Opens the video, samples it as the loader does and decodes the
    sampled frames into a slot, each resized as `resize` says (GIL released
    throughout), in turns as `client`'s; stops with :class:`Cancelled` once
    `control` is cancelled. Its slot is taken within `holding(bytes)`
    (the videos' share of the pool)."""

    def publish(settle_count: bool) -> PublishedVideo:
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
) -> PublishedVideo:
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
            release_slot(native, fields)
            decoded = fields["indices"]
            fields = native.publish_video(open_video(), decoded, control=control, **settled)
            if fields["indices"] != decoded:
                release_slot(native, fields)
                raise _native.VideoDecodeError(
                    f"the video's frames {decoded} decoded as {fields['indices']} when read again"
                )
    return PublishedVideo(
        fields,
        loader_metadata(source, fields["indices"]),
        info["codec"],
        hashlib.sha256(data).hexdigest(),
        size,
    )


def release_video(native: _native.NativePublisher, published: PublishedVideo) -> None:
    """Frees the video an abandoned publish published."""
    release_slot(native, published.fields)


@dataclass(frozen=True)
class VideoPublish:
    """One video sampled and published (:func:`publish_video`) as a
    :class:`pixelwire.publisher.medium.MediumPublish`, its slot taken
    within the videos' share of the pool (``pool``, waiting up to
    ``acquire_timeout``), on the videos' own threads."""

    data: bytes | bytearray
    sampling: VideoSampling
    limits: _native.VideoLimits | None
    threads: int
    resize: ResizePolicy | None
    client: str
    pool: PoolShare
    acquire_timeout: float

    def executor(self) -> concurrent.futures.Executor:
        return video_decode_executor()

    def run(self, native: _native.NativePublisher, control: _native.BatchControl) -> PublishedVideo:
        holding = functools.partial(self.pool.taken, timeout=self.acquire_timeout, control=control)
        return publish_video(
            native,
            self.data,
            self.sampling,
            self.limits,
            self.threads,
            self.resize,
            control,
            self.client,
            holding,
        )

    def release(self, native: _native.NativePublisher, result: PublishedVideo) -> None:
        release_video(native, result)

    def described(self, agent: str, result: PublishedVideo, published_at: float) -> DecodedVideo:
        return video_descriptor(agent, result, self.sampling, self.resize, published_at)


async def video_cache_key(
    data_urls: DataUrlMemo,
    data: bytes | bytearray,
    sampling: VideoSampling,
    resize: ResizePolicy | None,
    salt: str | None,
) -> VideoCacheKey:
    """The published-media cache's key of a video: its bytes' SHA-256 (a
    resent ``data:`` URL's from ``data_urls``, else computed off the loop
    and noted there), how it is sampled and its frames resized, the salt."""
    digest = data_urls.sha256(data)
    if digest is None:
        loop = asyncio.get_running_loop()
        digest = (await loop.run_in_executor(publish_executor(), sha256s, [data]))[0]
        data_urls.note_sha256(data, digest)
    sampled = json.dumps(sampling.to_dict(), sort_keys=True)
    return VideoCacheKey(digest, len(data), sampled, None if resize is None else resize.identity, salt)


def video_descriptor(
    agent: str,
    published: PublishedVideo,
    sampling: VideoSampling,
    resize: ResizePolicy | None,
    published_at: float,
) -> DecodedVideo:
    """The descriptor of one video `agent` published."""
    fields = published.fields
    return DecodedVideo(
        **slot_fields(agent, fields),
        shape=fields["shape"],
        loader_metadata=published.loader_metadata,
        sampling=sampling.to_dict(),
        codec=published.codec,
        published_at=published_at,
        source_sha256=published.source_sha256,
        resize=None if resize is None else {"policy": resize.identity, "source": list(published.source_size)},
    )
