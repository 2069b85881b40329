"""The ``fixed`` family: ``size: {height, width}``, whatever the image's
(SigLIP; CLIP with such a size; Gemma 3 without pan-and-scan, which would
resize crops of the original beside it; GOT-OCR2 without
``crop_to_patches``, Aya Vision's tiles and thumbnail)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pixelwire.resize.policy import Filter, ResizePolicy
from pixelwire.resize.reading import ImageConfig, NoPolicy


@dataclass(frozen=True, kw_only=True)
class FixedPolicy(ResizePolicy):
    """Every image to (height, width)."""

    family: ClassVar[str] = "fixed"
    height: int
    width: int

    @property
    def shape(self) -> str:
        return f"fixed:{self.height}x{self.width}"

    def processor_target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        return self.height, self.width


def read(image: ImageConfig) -> FixedPolicy:
    filter_ = image.resize_filter()
    check_whole_image(image)
    return sized(image, filter_)


def check_whole_image(image: ImageConfig) -> None:
    """Raises :class:`NoPolicy` where the processor also resizes crops of
    the original (pan-and-scan, ``crop_to_patches``): no one image gives
    both."""
    if image.settings.get("do_pan_and_scan"):
        raise NoPolicy(f"{image.name}: pan-and-scan resizes crops of the original beside the whole image")
    if image.settings.get("crop_to_patches"):
        raise NoPolicy(
            f"{image.name}: crop_to_patches resizes the original to tiles and again to a thumbnail"
        )


def sized(image: ImageConfig, filter_: Filter) -> FixedPolicy:
    """The policy of the config's ``size: {height, width}``."""
    size = image.size()
    height, width = size.get("height"), size.get("width")
    if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
        raise NoPolicy(f"{image.name}: size {size} is not {{height, width}}")
    return FixedPolicy(filter=filter_, kernel=image.kernel, height=height, width=width)
