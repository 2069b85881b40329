"""``decode_video``: open, sample as the loader samples, decode the sampled
frames (GIL released), and return vLLM's ``(frames, metadata)``."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import numpy.typing as npt

from pixelwire import config
from pixelwire._native import (
    BatchControl,
    VideoCapture,
    VideoDecodeError,
    VideoFrameCountChanged,
    VideoLimits,
    configure_video_turns,
)
from pixelwire.video.loaders import LOADERS, SourceMetadata

if TYPE_CHECKING:
    from pixelwire._native import Buffer
    from pixelwire.resize import ResizePolicy

T = TypeVar("T")


def decode_video(
    data: Buffer,
    *,
    loader: str = "opencv",
    num_frames: int = config.VIDEO_NUM_FRAMES,
    fps: float | None = None,
    resize: ResizePolicy | None = None,
    threads: int = 0,
    limits: VideoLimits | None = None,
    backend: str = "opencv",
    frame_recovery: bool = False,
    control: BatchControl | None = None,
    client: str | None = None,
    **loader_kwargs: Any,
) -> tuple[npt.NDArray[np.uint8], dict[str, Any]]:
    """Decodes the frames vLLM's ``loader`` samples from ``data``.

    ``num_frames`` and ``fps`` mean what they mean to vLLM's loader
    (``-1``: no bound; ``fps=None``: the loader's own default, -1 for
    ``opencv``, 2 for ``qwen2_vl`` and ``qwen3_vl``); ``loader_kwargs`` are its sampling
    options (``min_frames``, ``max_frames``, ``temporal_patch_size``). ``threads``: decoder threads,
    0 for min(cores, 16). Returns a C-contiguous uint8 ``(T, H, W, 3)`` RGB
    array and vLLM's metadata dict (``total_num_frames``, ``fps``,
    ``duration``, ``video_backend``, ``frames_indices``,
    ``do_sample_frames``). With ``resize`` (a model's video processor's
    policy, :func:`pixelwire.resize.video_resize_policy`) each frame comes
    back at the size that processor would resize it to, resized as the
    frontend's publish does (:func:`frame_resize`); the metadata is the
    same. Frames that do not decode are left out, as vLLM
    leaves them out; a video with no decodable frame raises
    ``VideoDecodeError``. ``limits`` (default: the ``PIXELWIRE_MAX_VIDEO_*``
    environment, else ``VideoLimits()``) are checked before any frame memory
    is taken (``VideoTooLarge``). ``backend`` and ``frame_recovery`` are
    vLLM's: only its default decoding backend (``opencv``) without frame
    recovery is reproduced, anything else is a ``ValueError``. Once
    ``control`` (a ``pixelwire._native.BatchControl``) is cancelled, the open
    and the read stop within a frame and raise ``Cancelled``. With
    ``client`` (whose decoding this is), the open and the read take turns
    with the process's other decodes that name one
    (:func:`video_decode_executor`).
    """
    check_backend(backend, frame_recovery)
    if limits is None:
        limits = config.video_limits_from_env()

    def decode(settle_count: bool) -> tuple[npt.NDArray[np.uint8], dict[str, Any]]:
        open_video = capture_opener(data, threads, limits, settle_count, control, client)
        return _decode_opened(open_video, loader, num_frames, fps, resize, loader_kwargs)

    return with_settled_count(decode)


_executor_lock = threading.Lock()
_video_executor: concurrent.futures.ThreadPoolExecutor | None = None


def _lower_priority() -> None:
    """This thread's nice value raised to ``VIDEO_DECODE_NICE``: the decoder
    threads FFmpeg starts from it inherit it."""
    if hasattr(os, "setpriority"):
        # A failure leaves the thread at the process's priority: only
        # latency, never correctness, depends on it.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), config.VIDEO_DECODE_NICE)


def video_decode_executor() -> concurrent.futures.ThreadPoolExecutor:
    """The threads videos are decoded on, the frontend's and the plug-in's:
    ``VIDEO_DECODE_THREADS`` of them (a video waits for one), at a lowered
    priority, apart from every other pool (images, the event loop's). Of
    the decodes on them that name a client, ``VIDEO_DECODE_CALLS`` run at
    once; the others wait for a turn, handed on between packets to the
    client that has had least decoding time."""
    global _video_executor
    with _executor_lock:
        if _video_executor is None:
            configure_video_turns(config.VIDEO_DECODE_CALLS)
            _video_executor = concurrent.futures.ThreadPoolExecutor(
                config.VIDEO_DECODE_THREADS, "pixelwire-video", initializer=_lower_priority
            )
        return _video_executor


def capture_opener(
    data: Buffer,
    threads: int,
    limits: VideoLimits | None,
    settle_count: bool,
    control: BatchControl | None,
    client: str | None,
) -> Callable[[], VideoCapture]:
    """What opens ``data`` as a :class:`VideoCapture` with these settings,
    once or again (a read that must start afresh opens it again)."""
    return functools.partial(
        VideoCapture,
        data,
        threads=threads,
        limits=limits,
        settle_count=settle_count,
        control=control,
        client=client,
    )


def with_settled_count(attempt: Callable[[bool], T]) -> T:
    """``attempt(settle_count)`` once with the frame count's check shared
    with the read, and once more with it settled at open when the read
    found the provisional count wrong (the frames were sampled over it)."""
    try:
        return attempt(False)
    except VideoFrameCountChanged:
        return attempt(True)


def _decode_opened(
    open_video: Callable[[], VideoCapture],
    loader: str,
    num_frames: int,
    fps: float | None,
    resize: ResizePolicy | None,
    loader_kwargs: dict[str, Any],
) -> tuple[npt.NDArray[np.uint8], dict[str, Any]]:
    capture = open_video()
    info = capture.info()
    size = (info["height"], info["width"])
    source, wanted = sample_video(capture, loader, num_frames, fps, loader_kwargs)
    options = frame_resize(resize, size, len(set(wanted)), source)
    frames, valid = capture.read(wanted, **options)
    if not valid:
        raise VideoDecodeError(f"no frame of the video could be decoded ({info['codec']})")
    settled = frame_resize(resize, size, len(valid), source)
    if settled != options:
        # A frame that did not decode changed the count a per-video size
        # depends on: the decoded frames again, at the size for that count.
        frames, again = open_video().read(valid, **settled)
        if again != valid:
            raise VideoDecodeError(f"the video's frames {valid} decoded as {again} when read again")
    return frames, loader_metadata(source, valid)


def frame_resize(
    policy: ResizePolicy | None, size: tuple[int, int], frames: int, source: SourceMetadata
) -> dict[str, Any]:
    """The resize options (``resize``, ``resize_kernel``, ``resize_filter``)
    that ``VideoCapture.read`` and ``NativePublisher.publish_video`` take
    for ``frames`` frames of ``size`` sampled from ``source`` (as the
    loader sees it: its metadata's frame count and fps):
    ``policy``'s :meth:`~pixelwire.resize.ResizePolicy.video_target`,
    none where the frames keep their size. The one place both paths get
    their frame size from; a caller whose decoded count differs from the
    one it asked with asks again, and redoes the frames if the answer
    changed."""
    if policy is None:
        return {}
    target = policy.video_target(*size, frames, source.total_frames_num, source.original_fps)
    if target == size:
        return {}
    return {"resize": target, "resize_kernel": policy.kernel, "resize_filter": policy.filter}


def check_backend(backend: str, frame_recovery: bool) -> None:
    """Refuses vLLM decoding options pixelwire does not reproduce."""
    if backend != "opencv" or frame_recovery:
        raise ValueError("pixelwire reproduces vLLM's opencv backend without frame_recovery only")


def sample_video(
    capture: VideoCapture, loader: str, num_frames: int, fps: float | None, loader_kwargs: dict[str, Any]
) -> tuple[SourceMetadata, list[int]]:
    """The source as ``loader`` sees it and the frame indices it samples
    from the opened ``capture``."""
    sampler = LOADERS.get(loader)
    if sampler is None:
        raise ValueError(f"unknown video loader {loader!r}; pixelwire has {sorted(LOADERS)}")
    info = capture.info()
    source = sampler.prepare_source(SourceMetadata.from_stream(info["frame_count"], info["fps"]))
    try:
        wanted = sampler.frame_indices(
            source, num_frames, sampler.default_fps if fps is None else fps, **loader_kwargs
        )
    except ArithmeticError as error:
        # A frame count or rate from a hostile header that the loader's
        # arithmetic cannot use (vLLM's own loader fails on it too).
        raise VideoDecodeError(
            f"the video's header ({source.total_frames_num} frames at {source.original_fps} fps) "
            f"gives the {loader} loader nothing it can sample ({type(error).__name__}: {error})"
        ) from error
    return source, wanted


def loader_metadata(source: SourceMetadata, valid: list[int]) -> dict[str, Any]:
    """vLLM's metadata dict for the frames ``valid`` decoded from ``source``."""
    return {
        "total_num_frames": source.total_frames_num,
        "fps": source.original_fps,
        "duration": source.duration,
        "video_backend": "opencv",
        "frames_indices": valid,
        "do_sample_frames": len(valid) == source.total_frames_num,
    }
