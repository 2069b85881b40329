"""The ``smart`` family: Qwen2-VL, Qwen2.5-VL, Qwen3-VL
(``Qwen2VLImageProcessor``): ``smart_resize`` with factor = patch_size x
merge_size, min/max pixels from ``size.shortest_edge``/``size.longest_edge``
(or ``min_pixels``/``max_pixels``); GLM-4.1V/4.5V/4.6V
(``Glm4vImageProcessor``) with GLM's own ``smart_resize``, whose pixel
budget counts the temporal patch; and Qwen2-VL's video processor, which
resizes each frame as its images. Qwen3-VL's video processor, which sizes
a whole video, is :mod:`pixelwire.resize.families.smart_video`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pixelwire.resize.policy import Filter, ResizePolicy
from pixelwire.resize.reading import ImageConfig, NoPolicy, positive


@dataclass(frozen=True, kw_only=True)
class SmartPolicy(ResizePolicy):
    """A pixel budget on a grid of ``factor``-pixel sides."""

    family: ClassVar[str] = "smart"
    # Whether the policy sizes a whole video's frames together
    # (:class:`~pixelwire.resize.families.smart_video.SmartVideoPolicy`).
    video_frames: ClassVar[bool] = False
    factor: int
    min_pixels: int
    max_pixels: int
    temporal_factor: int = 0  # GLM's (and Qwen3-VL video's) smart_resize; 0 for Qwen's

    @property
    def shape(self) -> str:
        shape = f"smart:factor={self.factor}:min={self.min_pixels}:max={self.max_pixels}"
        return shape + (f":temporal={self.temporal_factor}" if self.temporal_factor else "")

    def processor_target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        if self.temporal_factor:  # GLM's image: one temporal patch of frames
            return temporal_smart_resize(
                self.temporal_factor,
                height,
                width,
                self.factor,
                self.temporal_factor,
                self.min_pixels,
                self.max_pixels,
            )
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's target size, as transformers 5.19 computes it (same
    operations in the same order, so the same rounding)."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def temporal_smart_resize(
    num_frames: int,
    height: int,
    width: int,
    factor: int,
    temporal_factor: int,
    min_pixels: int,
    max_pixels: int,
) -> tuple[int, int]:
    """The target size of ``num_frames`` frames of (height, width), as
    transformers 5.19's ``smart_resize`` of GLM-4.1V (an image is one
    temporal patch of frames) and of Qwen3-VL's video processor (the same
    function) computes it: tiny frames scaled up to the factor first, the
    pixel budget counting the frames rounded to the temporal patch, beta
    the frames themselves."""
    if num_frames < temporal_factor:
        raise ValueError(f"t:{num_frames} must be larger than temporal_factor:{temporal_factor}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height = int(height * scale)
        width = int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def read_qwen2_vl(image: ImageConfig) -> SmartPolicy:
    """Qwen2VLImageProcessor's policy: its own config first (its
    min/max_pixels win over its size), then the overrides in the same
    order, as vLLM merges them."""
    filter_ = image.resize_filter()
    size = dict(image.config.get("size") or {})
    _pixel_aliases(size, image.config)
    size.update(image.overrides.get("size") or {})
    _pixel_aliases(size, image.overrides)
    return _budget_on_grid(image, filter_, size)


def read_glm4v(image: ImageConfig) -> SmartPolicy:
    """Glm4vImageProcessor's policy: its budget from ``size`` alone, over
    a temporal patch of frames."""
    filter_ = image.resize_filter()
    sources = (image.config, image.overrides)
    if any(key in source for source in sources for key in ("min_pixels", "max_pixels")):
        raise NoPolicy(f"{image.name} takes its pixel budget from size, not min_pixels/max_pixels")
    return _budget_on_grid(image, filter_, image.size(), image.settings.get("temporal_patch_size", 2))


def _budget_on_grid(
    image: ImageConfig, filter_: Filter, size: Mapping[str, Any], temporal: Any = None
) -> SmartPolicy:
    """The pixel budget of ``size``'s edges on the processor's patch x
    merge grid; ``temporal``: GLM's temporal patch (None: Qwen's resize)."""
    patch, merge = image.settings.get("patch_size", 14), image.settings.get("merge_size", 2)
    low, high = size.get("shortest_edge", 0), size.get("longest_edge", 0)
    needed = (patch, merge, low, high) + (() if temporal is None else (temporal,))
    if not all(positive(value) for value in needed):
        sizes = "patch, merge" + ("" if temporal is None else " and temporal")
        raise NoPolicy(f"{image.name}: {sizes} sizes and min/max pixels must be positive integers")
    return SmartPolicy(
        filter=filter_,
        kernel=image.kernel,
        factor=int(patch) * int(merge),
        min_pixels=int(low),
        max_pixels=int(high),
        temporal_factor=int(temporal or 0),
    )


def read_qwen2_vl_video(config: Mapping[str, Any]) -> SmartPolicy:
    """Qwen2VLVideoProcessor's policy: each frame resized with smart_resize
    over its own size, as Qwen2VLImageProcessor resizes an image; not its
    per-frame pixel cap (``cap_pixels_per_frame``, which divides a token
    budget among frames)."""
    if config.get("cap_pixels_per_frame"):
        raise NoPolicy("Qwen2VLVideoProcessor caps the pixels per frame from a token budget")
    return read_qwen2_vl(ImageConfig({**config, "image_processor_type": "Qwen2VLImageProcessor"}))


def _pixel_aliases(size: dict[str, Any], source: Mapping[str, Any]) -> None:
    """Qwen's ``min_pixels``/``max_pixels`` are ``size``'s two edges."""
    for edge, alias in (("shortest_edge", "min_pixels"), ("longest_edge", "max_pixels")):
        if source.get(alias) is not None:
            size[edge] = source[alias]
