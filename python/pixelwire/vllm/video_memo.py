"""Videos in the plug-in's cache (:mod:`pixelwire.caches.worker_images`),
as images are kept there. A repeated video reference (the same signed
identity and content hash: a frontend cache hit) is served without a READ
(:func:`kept_or_read`). In worker mode a resent video (the same bytes,
sampled the same way, its frames resized the same way, for the same image
mode) is handed to vLLM from the cache instead of decoded again, and a
resent ``data:`` URL of the same text is not even base64-decoded or hashed
again (:func:`video_data_url`, :func:`remembered_video`). Each is kept in
a memory file and handed out as a private copy-on-write mapping of it
(:mod:`pixelwire.caches.mapped_frames`): as independent as a copy, and
free where vLLM's processor cache spares it reading the frames."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vllm.multimodal.media import MediaWithBytes

from pixelwire.caches.mapped_frames import kept_frames
from pixelwire.caches.worker_images import worker_image_cache
from pixelwire.descriptor import RemoteMedia
from pixelwire.metrics import MediaMetrics
from pixelwire.resize import ResizePolicy
from pixelwire.transfer import default_reader
from pixelwire.video.sampling import NotReproduced, VideoSampling
from pixelwire.vllm.data_urls import decode_data_url_async
from pixelwire.vllm.reading import read_timed


async def kept_or_read(remote: RemoteMedia, identity: bytes, metrics: MediaMetrics) -> Any:
    """A video reference's frames: a copy of those kept for the same signed
    ``identity``, content hash and shape (checked as a read would be, and
    not READ: the frontend ends that hand-out when its request ends), else
    read over NIXL (and kept)."""
    cache = worker_image_cache()
    if not (cache.enabled and remote.content_hash):
        return await read_timed(remote, "numpy", metrics)
    remote.check(default_reader().settings.max_pixels, time.time())
    key = ("nixl-video", identity, remote.content_hash, remote.frames, remote.shape)
    kept = cache.get(key)
    if kept is not None:
        return kept[0]
    frames = await read_timed(remote, "numpy", metrics)
    cache.keep(key, kept_frames(frames), remote.size)
    return frames


async def video_data_url(url: str) -> tuple[bytes, str | None]:
    """A video ``data:`` URL's bytes (vLLM's grammar and decoder, as for
    images) and their SHA-256 when a resend of the same text found them in
    the worker's memo."""
    cache = worker_image_cache()
    known = cache.data_urls.lookup(url, None) if cache.enabled else None
    if known is not None:
        return known, cache.data_urls.sha256(known)
    data = await decode_data_url_async(url)
    if cache.enabled:
        cache.data_urls.remember(url, None, data)
    return data, None


async def remembered_video(
    data: bytes,
    digest: str | None,
    video_kwargs: dict[str, Any],
    loader: str,
    image_mode: str | None,
    resize: ResizePolicy | None,
    metrics: MediaMetrics,
    decode: Callable[[], Awaitable[MediaWithBytes]],
) -> MediaWithBytes:
    """The video ``decode`` makes of ``data``, through the worker's cache,
    keyed by the bytes' SHA-256 (``digest`` when known) and length, the
    sampling, the frames' resize and the image mode. A sampling pixelwire
    does not reproduce is decoded every time."""
    cache = worker_image_cache()
    try:
        sampling = VideoSampling.from_video_kwargs(video_kwargs, loader).to_dict()
    except NotReproduced:
        return await decode()
    if not cache.enabled:
        return await decode()
    if digest is None:
        digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        cache.data_urls.note_sha256(data, digest)
    policy = None if resize is None else resize.identity
    key = ("video", digest, len(data), json.dumps(sampling, sort_keys=True), policy, image_mode)
    kept = cache.get(key)
    if kept is not None:
        frames, metadata = kept
        metrics.handled_video("url", int(frames.nbytes))
        return MediaWithBytes((frames, copy.deepcopy(metadata)), data)
    loaded = await decode()
    frames, metadata = loaded.media
    cache.keep(key, kept_frames(frames), int(frames.nbytes), copy.deepcopy(metadata))
    return loaded
