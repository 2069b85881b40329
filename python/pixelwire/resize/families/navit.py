"""The ``navit`` family: Kimi-K2.5 (``KimiK25ForConditionalGeneration``,
whose image processor, named ``KimiK25VisionProcessor`` by its checkpoint,
vLLM 0.32 runs as its own ``KimiK25FusedVisionProcessor``, configured by the
checkpoint's ``media_proc_cfg``): scaled down (never up) to fit
``in_patch_limit`` patches and ``patch_limit_on_one_side`` patches a side,
floored, with Pillow's bicubic; then zero-padded to the merged patch grid.
vLLM hands it no ``--mm-processor-kwargs``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from pixelwire.resize.policy import ResizePolicy
from pixelwire.resize.reading import ImageConfig, NoPolicy, positive


@dataclass(frozen=True, kw_only=True)
class NavitPolicy(ResizePolicy):
    """Within ``patch_limit`` patches of ``patch_size``, ``side_patches`` a side."""

    family: ClassVar[str] = "navit"
    patch_size: int
    patch_limit: int
    side_patches: int

    @property
    def shape(self) -> str:
        return f"navit:{self.patch_limit}:side={self.side_patches}:patch={self.patch_size}"

    def processor_target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        return navit_size(height, width, self.patch_size, self.patch_limit, self.side_patches)


def navit_size(height: int, width: int, patch: int, patch_limit: int, side_patches: int) -> tuple[int, int]:
    """Kimi-K2.5's target size, as vLLM 0.32 computes it
    (``navit_resize_image`` of its fused processor, in the same
    floating-point steps): scaled down to fit ``patch_limit`` whole patches
    and ``side_patches`` patches a side, floored, never up."""
    within_limit = math.sqrt(patch_limit / (max(1.0, width // patch) * max(1.0, height // patch)))
    side = side_patches * patch
    scale = min(1.0, within_limit, side / width, side / height)
    return min(max(1, int(height * scale)), side), min(max(1, int(width * scale)), side)


def read(image: ImageConfig) -> NavitPolicy:
    """The policy of the checkpoint's ``media_proc_cfg``; neither the
    overrides nor ``do_resize``/``resample`` play a part."""
    media = image.config.get("media_proc_cfg")
    if not isinstance(media, dict):
        raise NoPolicy(f"{image.name}: the config has no media_proc_cfg")
    patch: Any = media.get("patch_size")
    limit: Any = media.get("in_patch_limit")
    side: Any = media.get("patch_limit_on_one_side")
    if not all(positive(value) for value in (patch, limit, side)):
        raise NoPolicy(
            f"{image.name}: media_proc_cfg's patch_size, in_patch_limit and patch_limit_on_one_side "
            "must be positive integers"
        )
    # Its processor resizes with Pillow, whatever backend transformers'
    # own processors use.
    return NavitPolicy(
        filter="bicubic",
        kernel="pillow",
        patch_size=int(patch),
        patch_limit=int(limit),
        side_patches=int(side),
    )
