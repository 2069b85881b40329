"""Videos in the plug-in. A descriptor reference is read over NIXL into
the ``(frames, metadata)`` vLLM's video loader would have returned, after
checking that the frontend sampled as this vLLM samples; a URL's bytes
(fetched by pixelwire's guard) are decoded natively when pixelwire
reproduces the loader, and otherwise go to vLLM's own loader."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import sys
import weakref
from typing import Any

import vllm.envs as envs
from vllm.multimodal.media import MediaWithBytes
from vllm.multimodal.media.video import VideoMediaIO
from vllm.multimodal.video import get_video_loader_backend_for_processor

from pixelwire import config
from pixelwire._native import BatchControl, DescriptorError, UnsupportedVideo
from pixelwire.config import secret_from_env
from pixelwire.descriptor import RemoteImage, parse_descriptor
from pixelwire.loader_input import checked_container
from pixelwire.metrics import MediaMetrics
from pixelwire.resize import ResizePolicy, video_resize_policy
from pixelwire.video import decode_video
from pixelwire.video.decode import video_decode_executor
from pixelwire.video.sampling import NotReproduced, VideoSampling
from pixelwire.video.shares import ClientShares
from pixelwire.video_client import signed_client
from pixelwire.vllm.identity import keyed_identity
from pixelwire.vllm.served_model import served_model
from pixelwire.vllm.video_memo import kept_or_read

# The video threads one worker-mode client (one video's bytes) may hold at
# once, per event loop (a share's waiters are that loop's futures): the same
# bomb sent many times cannot take every thread.
_shares: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ClientShares] = weakref.WeakKeyDictionary()


def vllm_video_settings(
    media_io_kwargs: dict[str, Any], video_processor: str | None
) -> tuple[dict[str, Any], str]:
    """The ``video`` media-io kwargs and the loader this vLLM samples a
    video with, chosen as vLLM's ``fetch_video`` chooses it: the kwargs'
    ``video_backend``, else the model's video processor's loader, else
    ``VLLM_VIDEO_LOADER_BACKEND``."""
    kwargs = dict(media_io_kwargs.get("video", {}))
    loader = (
        kwargs.get("video_backend")
        or get_video_loader_backend_for_processor(video_processor)
        or envs.VLLM_VIDEO_LOADER_BACKEND
    )
    return kwargs, loader


def video_identity(source_sha256: str, sampling: dict[str, Any], policy: str) -> bytes:
    """What vLLM's caches key a frontend-decoded video on: its source
    digest, how it was sampled and the frames' resize policy, keyed (see
    :func:`keyed_identity`)."""
    return keyed_identity(f"pixelwire-video:{source_sha256}:{json.dumps(sampling, sort_keys=True)}:{policy}")


async def read_video_descriptor(
    descriptor: dict[str, Any], video_kwargs: dict[str, Any], loader: str, metrics: MediaMetrics
) -> MediaWithBytes:
    """The frames and metadata a verified video descriptor names, read over
    NIXL, once its sampling is checked against this vLLM's
    (:mod:`pixelwire.vllm.reading` dispatches here)."""
    remote = parse_descriptor(descriptor)
    assert remote.video is not None
    try:
        expected = VideoSampling.from_video_kwargs(video_kwargs, loader).to_dict()
    except NotReproduced as error:
        raise DescriptorError(
            f"the frontend sampled this video, but this vLLM samples videos in a way pixelwire does "
            f"not reproduce ({error}): the frontend should pass such videos on (give it the same "
            "--media-io-kwargs as vLLM)"
        ) from error
    made = remote.video.sampling
    if made != expected:
        raise DescriptorError(
            f"the frontend sampled this video as {made} but this vLLM samples as {expected}: give the "
            "frontend the same --model and --media-io-kwargs video settings as vLLM"
        )
    if remote.resize is not None:
        _check_frame_resize(remote)
    # vLLM's hasher keys a MediaWithBytes on its bytes: the signed identity
    # (a client cannot choose it: the frontend takes out their uuids).
    source = remote.source_sha256 or f"content:{remote.content_hash}"
    policy = remote.resize.policy if remote.resize is not None else ""
    identity = video_identity(source, made, policy)
    frames = await kept_or_read(remote, identity, metrics)
    metrics.handled_video("nixl", remote.size)
    metadata = dict(remote.video.loader_metadata)
    return MediaWithBytes((frames, metadata), identity)


@functools.cache
def worker_video_resize_policy() -> ResizePolicy | None:
    """The per-frame resize of the video processor of the model this vLLM
    serves (:func:`pixelwire.vllm.served_model.served_model`, as for
    images); None when the model is unknown or pixelwire does not reproduce
    its video processor."""
    served = served_model(sys.argv)
    if served.model is None:
        return None
    try:
        return video_resize_policy(served.model, served.mm_processor_kwargs)
    except (OSError, ValueError):
        if served.explicit:
            raise
        return None


def _check_frame_resize(remote: RemoteImage) -> None:
    """Frontend-resized frames must carry this vLLM's video processor's
    policy and its target size (for their count, where the size is per
    video)."""
    assert remote.resize is not None
    policy, (height, width) = remote.resize.policy, remote.resize.source
    expected = worker_video_resize_policy()
    if expected is None:
        raise DescriptorError(
            f"the frontend resized this video's frames for {policy}, but this vLLM's plug-in resizes no "
            "frames for its model (model unknown, another video processor, or "
            "--mm-processor-kwargs set): give the frontend the same --model and "
            "--mm-processor-kwargs as vLLM"
        )
    assert remote.frames is not None and remote.video is not None
    metadata = remote.video.loader_metadata
    total, fps = metadata["total_num_frames"], metadata["fps"]
    if policy != expected.identity or remote.shape[:2] != expected.video_target(
        height, width, remote.frames, total, fps
    ):
        raise DescriptorError(
            f"the frontend resized this video's frames for {policy}, but this vLLM's video processor "
            f"resizes for {expected.identity}: give the frontend the same --model and "
            "--mm-processor-kwargs as vLLM"
        )


async def decode_video_bytes(
    data: bytes,
    video_kwargs: dict[str, Any],
    loader: str,
    vllm_io: VideoMediaIO,
    metrics: MediaMetrics,
    resize: ResizePolicy | None = None,
    client: str | None = None,
) -> MediaWithBytes:
    """A fetched video as vLLM's loader would return it: decoded natively
    when pixelwire reproduces the loader and the codec, each frame at the
    size the served model's video processor resizes it to (``resize``: its
    policy, or None), else by vLLM's own loader (``vllm_io``) on the same
    bytes, at full size. Its decoding is ``client``'s (the client the
    frontend signed for, :func:`signed_video_client`), else its bytes'
    (:func:`video_client`)."""
    try:
        sampling = VideoSampling.from_video_kwargs(video_kwargs, loader)
    except NotReproduced:
        return await _vllm_load(data, vllm_io, metrics)
    control = BatchControl()
    if client is None:
        client = await asyncio.to_thread(video_client, data)

    def decode() -> tuple[Any, dict[str, Any]]:
        return decode_video(
            data,
            loader=sampling.loader,
            num_frames=sampling.num_frames,
            fps=sampling.fps,
            resize=resize,
            control=control,
            client=client,
            **sampling.loader_kwargs,
        )

    try:
        with metrics.timed("url"):
            # The videos' own bounded pool (never the event loop's default
            # executor, which vLLM's other work uses), of which one client's
            # videos hold at most their share; a request that goes away stops
            # its decode within a frame.
            loop = asyncio.get_running_loop()
            shares = _shares.setdefault(loop, ClientShares(config.VIDEO_DECODES_PER_CLIENT))
            async with shares.held(client):
                work = loop.run_in_executor(video_decode_executor(), decode)
                try:
                    frames, metadata = await work
                except asyncio.CancelledError:
                    control.cancel()
                    raise
    except UnsupportedVideo:
        # A codec or container pixelwire does not decode.
        return await _vllm_load(data, vllm_io, metrics)
    metrics.handled_video("url", int(frames.nbytes))
    return MediaWithBytes((frames, metadata), data)


def signed_video_client(url: str) -> str | None:
    """Whose decoding a worker-mode video ``data:`` URL is, for the decode
    turns and the per-client share of the threads, when a frontend signed
    it with this plug-in's ``PIXELWIRE_SECRET`` (:mod:`pixelwire.video_client`);
    None otherwise (the bytes stand for the client)."""
    client = signed_client(url, secret_from_env())
    return None if client is None else f"client:{client}"


def video_client(data: bytes) -> str:
    """Whose decoding a worker-mode video is when no frontend signed its
    client: its bytes' digest. vLLM does not tell a media loader whose
    request it is (and behind a frontend every request comes from the
    frontend's address), so the video stands for its client: the same
    bytes sent again, at once or after a hang-up, count as one client, and
    the turns remember the decoding time of a client whose decode ended
    early past its last decode, so a video resent after a hang-up resumes
    where its last attempt stopped. Bytes varied per attempt are new
    clients each."""
    return f"video-sha256:{hashlib.sha256(data).hexdigest()}"


async def _vllm_load(data: bytes, vllm_io: VideoMediaIO, metrics: MediaMetrics) -> MediaWithBytes:
    """vLLM's loader (FFmpeg with every demuxer) on bytes identified first
    as one real video container."""
    checked_container(data, "video")
    metrics.handled_video("vllm", 0)
    loop = asyncio.get_running_loop()
    result: MediaWithBytes = await loop.run_in_executor(video_decode_executor(), vllm_io.load_bytes, data)
    return result
