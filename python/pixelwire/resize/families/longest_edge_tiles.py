"""The ``longest_edge_tiles`` family: Idefics3 and SmolVLM
(``Idefics3ImageProcessor``, ``SmolVLMImageProcessor``): two resizes in a
row, Lanczos by default: the longest edge to ``size.longest_edge`` (up or
down, the other side rounded up to even, both kept within 4096), then,
with ``do_image_splitting``, that image to multiples of
``max_image_size.longest_edge`` (the tile side). The tiles and the global
image are cut and resized from the second result, so shipping it is exact:
the processor's two resizes leave it as it is. The native decoder resizes
through the first size to the second (:meth:`LongestEdgeTilesPolicy.steps`).
Without splitting, the processor squares the first result, which it would
do again from the square, so the first result is shipped."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from pixelwire.resize.policy import ResizePolicy
from pixelwire.resize.reading import ImageConfig, NoPolicy, positive

# Idefics3's resize keeps both sides within this (transformers' MAX_IMAGE_SIZE).
IDEFICS3_MAX_SIDE = 4096
# Its tile side where max_image_size does not say.
_TILE = 364


@dataclass(frozen=True, kw_only=True)
class LongestEdgeTilesPolicy(ResizePolicy):
    """The longest edge to ``longest_edge``, then the sides up to multiples
    of ``tile`` (0: no splitting, no second resize)."""

    family: ClassVar[str] = "longest_edge_tiles"
    longest_edge: int
    tile: int = 0

    @property
    def shape(self) -> str:
        return f"longest_edge_tiles:{self.longest_edge}:tile={self.tile}"

    def processor_target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        height, width = idefics3_longest_edge(height, width, self.longest_edge)
        return idefics3_tile_grid(height, width, self.tile) if self.tile else (height, width)

    def leaves_alone(self, height: int, width: int, num_frames: int | None = None) -> bool:
        """Each of the processor's two resizes keeps the image as it is."""
        if idefics3_longest_edge(height, width, self.longest_edge) != (height, width):
            return False
        return super().leaves_alone(height, width, num_frames)

    def steps(self, height: int, width: int) -> list[tuple[int, int]]:
        """:meth:`target`, through the first of the processor's two resizes."""
        shipped = self.target(height, width)
        if not self.tile or shipped == (height, width):
            return [shipped]
        first = idefics3_longest_edge(height, width, self.longest_edge)
        return [shipped] if first == shipped else [first, shipped]


def idefics3_longest_edge(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """Idefics3's first resize, as transformers 5.19 computes it
    (``get_resize_output_image_size``): the longest edge to
    ``longest_edge``, up or down, the other side truncated and rounded up
    to even; then both sides kept within 4096."""
    aspect = width / height
    if width >= height:
        width = longest_edge
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest_edge
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > IDEFICS3_MAX_SIDE:
        width = IDEFICS3_MAX_SIDE
        height = int(width / aspect)
    elif height > width and height > IDEFICS3_MAX_SIDE:
        height = IDEFICS3_MAX_SIDE
        width = int(height * aspect)
    return max(height, 1), max(width, 1)


def idefics3_tile_grid(height: int, width: int, tile: int) -> tuple[int, int]:
    """Idefics3's second resize (``resize_for_vision_encoder``): the longest
    side rounded up to the tile side, the other from the aspect ratio, then
    rounded up too."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def read(image: ImageConfig) -> LongestEdgeTilesPolicy:
    # Lanczos, its default, is reproduced for this family.
    filter_ = image.resize_filter(default=1, lanczos=True)
    size, settings = image.size(), image.settings
    longest: Any = size.get("longest_edge")
    if not positive(longest):
        raise NoPolicy(f"{image.name}: size {size} is not {{longest_edge}}")
    if not settings.get("do_image_splitting", True):
        return LongestEdgeTilesPolicy(filter=filter_, kernel=image.kernel, longest_edge=int(longest))
    tile: Any = (settings.get("max_image_size") or {}).get("longest_edge", _TILE)
    if not positive(tile):
        raise NoPolicy(
            f"{image.name}: max_image_size {settings.get('max_image_size')} is not {{longest_edge}}"
        )
    return LongestEdgeTilesPolicy(
        filter=filter_, kernel=image.kernel, longest_edge=int(longest), tile=int(tile)
    )
