"""The ``max_num_patches`` family: SigLIP2 NaFlex (``Siglip2ImageProcessor``):
the largest patch grid of ``max_num_patches`` that keeps the aspect ratio,
by its binary search; its ``size`` is not used."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from pixelwire.resize.policy import ResizePolicy
from pixelwire.resize.reading import ImageConfig, NoPolicy, positive


@dataclass(frozen=True, kw_only=True)
class MaxNumPatchesPolicy(ResizePolicy):
    """At most ``max_num_patches`` patches of ``patch_size`` pixels a side."""

    family: ClassVar[str] = "max_num_patches"
    max_num_patches: int
    patch_size: int

    @property
    def shape(self) -> str:
        return f"max_num_patches:{self.max_num_patches}:patch={self.patch_size}"

    def processor_target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        return size_for_max_num_patches(height, width, self.patch_size, self.max_num_patches)


def size_for_max_num_patches(height: int, width: int, patch: int, max_num_patches: int) -> tuple[int, int]:
    """SigLIP2 NaFlex's target size, as transformers 5.19 computes it
    (``get_image_size_for_max_num_patches``: the same binary search over
    the scale, in the same floating-point steps)."""
    eps = 1e-5

    def scaled(scale: float, size: int) -> int:
        return int(max(patch, math.ceil(size * scale / patch) * patch))

    low, high = eps / 10, 100.0
    while (high - low) >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch) * (scaled(scale, width) / patch) <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def read(image: ImageConfig) -> MaxNumPatchesPolicy:
    filter_ = image.resize_filter()
    patch, most = image.settings.get("patch_size", 16), image.settings.get("max_num_patches", 256)
    if not (positive(patch) and positive(most)):
        raise NoPolicy(f"{image.name}: patch_size and max_num_patches must be positive integers")
    return MaxNumPatchesPolicy(
        filter=filter_, kernel=image.kernel, max_num_patches=int(most), patch_size=int(patch)
    )
