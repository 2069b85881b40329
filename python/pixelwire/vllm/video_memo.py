"""Worker mode's videos in the plug-in's cache
(:mod:`pixelwire.caches.worker_images`): a resent video (the same bytes,
sampled the same way, its frames resized the same way, for the same image
mode) is handed to vLLM from the cache, as a copy, instead of decoded
again; a resent ``data:`` URL of the same text is not even base64-decoded
or hashed again."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from vllm.multimodal.media import MediaWithBytes

from pixelwire.caches.worker_images import worker_image_cache
from pixelwire.metrics import MediaMetrics
from pixelwire.resize import ResizePolicy
from pixelwire.video.sampling import NotReproduced, VideoSampling
from pixelwire.vllm.data_urls import decode_data_url_async


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
    cache.put(key, frames, int(frames.nbytes), copy.deepcopy(metadata))
    return loaded
