"""What the plug-in decodes itself (worker mode's URLs), within the
decoder's limits under vLLM's settings: an image at the served model's
size or as its processor's patch rows, and a JPEG-frame list's frames
checked from their headers."""

from __future__ import annotations

from typing import Any

from pixelwire._native import Limits, decode_image, probe_image
from pixelwire.config import Mode, video_limits_from_env
from pixelwire.loader_input import check_frames, frame_list_frames
from pixelwire.processed import PatchLayout
from pixelwire.resize import ResizePolicy
from pixelwire.vllm.data_urls import strict_b64decode
from pixelwire.vllm.image_info import vllm_image_metadata
from pixelwire.vllm.media_settings import VllmMediaSettings


def worker_limits() -> Limits:
    """The decoder's limits under vLLM's settings: VLLM_MAX_IMAGE_PIXELS
    (pixelwire's own when it is 0) and, for the encoded bytes, vLLM's
    download limit, which the fetch has applied already."""
    settings = VllmMediaSettings.from_env()
    max_bytes = settings.body_limit(None)
    if settings.max_image_pixels > 0:
        return Limits(max_bytes=max_bytes, max_pixels=settings.max_image_pixels)
    return Limits(max_bytes=max_bytes)


def check_frame_list(url: str) -> None:
    """A JPEG frame list's frames, decoded as vLLM decodes them, checked
    against the worker's image and video limits."""
    check_frames(frame_list_frames(url, strict_b64decode), worker_limits(), video_limits_from_env())


def decode_for_model(
    data: bytes, mode: Mode, background: tuple[int, int, int], policy: ResizePolicy | None
) -> tuple[Any, int, dict[Any, Any], dict[str, Any] | None]:
    """Decodes (resized to the model's size when there is a policy); returns
    the pixels, the byte count at the decoded size, and the ``info`` and
    ``io_config`` vLLM's loader would leave on the image."""
    limits = worker_limits()
    if policy is None:
        pixels = decode_image(data, mode=mode, background=background, limits=limits)
        source_bytes = int(pixels.nbytes)
    else:
        height, width = probe_image(data, limits=limits)["oriented_size"]
        pixels = decode_image(
            data,
            mode=mode,
            background=background,
            limits=limits,
            resize=policy.steps(height, width),
            resize_kernel=policy.kernel,
            resize_filter=policy.filter,
        )
        source_bytes = height * width * pixels.shape[2]
    return (pixels, source_bytes, *vllm_image_metadata(data, mode, background))


def decode_processed(
    data: bytes, background: tuple[int, int, int], layout: PatchLayout
) -> tuple[Any, list[int], int]:
    """Decodes into the processor's patch rows (worker mode's processed
    inputs); returns the rows (rows x row length), ``image_grid_thw`` and
    the byte count at the decoded size."""
    limits = worker_limits()
    height, width = probe_image(data, limits=limits)["oriented_size"]
    target = layout.target(height, width)
    rows = decode_image(
        data,
        mode="RGB",
        background=background,
        limits=limits,
        resize=[target],
        resize_kernel=layout.kernel,
        resize_filter=layout.filter,
        patches=layout.grid,
        normalize=layout.native_normalize,
    )
    return rows.reshape(rows.shape[0], rows.shape[1]), layout.grid_thw(*target), height * width * 3
