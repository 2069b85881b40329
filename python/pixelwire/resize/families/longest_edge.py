"""The ``longest_edge`` family: Pixtral and Mistral 3
(``PixtralImageProcessor`` called by ``PixtralProcessor``): scaled down to
fit ``size.longest_edge`` (or ``size.height`` x ``size.width``), each side
then rounded up to the patch grid, whose side is the *processor's*
``patch_size`` x ``spatial_merge_size`` (``processor_config.json``; it
overrides the image processor's own ``patch_size``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from pixelwire.resize.policy import ResizePolicy
from pixelwire.resize.reading import ImageConfig, NoPolicy, positive

# PixtralProcessor's defaults for its patch grid.
_PATCH, _MERGE = 16, 1


@dataclass(frozen=True, kw_only=True)
class LongestEdgePolicy(ResizePolicy):
    """Within (height, width), on a grid of ``patch_size``-pixel sides."""

    family: ClassVar[str] = "longest_edge"
    height: int
    width: int
    patch_size: int

    @property
    def shape(self) -> str:
        return f"longest_edge:{self.height}x{self.width}:patch={self.patch_size}"

    def processor_target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        return fit_to_patch_grid(height, width, self.height, self.width, self.patch_size)


def fit_to_patch_grid(
    height: int, width: int, max_height: int, max_width: int, patch: int
) -> tuple[int, int]:
    """Pixtral's target size, as transformers 5.19 computes it
    (``get_resize_output_image_size``): scaled down (never up) to fit the
    bounds, floored, then each side rounded up to the patch grid."""
    ratio = max(height / max_height, width / max_width)
    if ratio > 1:
        height = math.floor(height / ratio)
        width = math.floor(width / ratio)
    return ((height - 1) // patch + 1) * patch, ((width - 1) // patch + 1) * patch


def read(image: ImageConfig) -> LongestEdgePolicy:
    filter_ = image.resize_filter()
    # vLLM hands --mm-processor-kwargs to the processor (its patch_size
    # and spatial_merge_size) and to the call (size).
    size = image.size()
    patch = image.overrides.get("patch_size", image.processor.get("patch_size", _PATCH))
    merge = image.overrides.get("spatial_merge_size", image.processor.get("spatial_merge_size", _MERGE))
    if not (positive(patch) and positive(merge)):
        raise NoPolicy(
            f"{image.name}: the processor's patch_size and spatial_merge_size must be positive integers"
        )
    longest = size.get("longest_edge")
    bounds = (longest, longest) if longest else (size.get("height"), size.get("width"))
    if not all(positive(side) for side in bounds):
        raise NoPolicy(f"{image.name}: size {size} is not {{longest_edge}} or {{height, width}}")
    return LongestEdgePolicy(
        filter=filter_,
        kernel=image.kernel,
        height=int(bounds[0] or 0),
        width=int(bounds[1] or 0),
        patch_size=int(patch) * int(merge),
    )
