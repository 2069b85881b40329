"""The ``anyres`` family, only with ``approximate`` (``--resize-approximate``):
LLaVA-OneVision (``LlavaOnevisionImageProcessor``) resizes the original
twice: to the grid resolution it picks from ``image_grid_pinpoints`` (then
padded and cut into tiles) and to its base tile. No one image gives both
exactly. The approximate policy ships the grid-size image, resized as the
processor resizes it, where that is smaller than the original and each
side is at least twice the base tile's (the base tile is then a downscale
of a smaller source): the processor picks the same grid for it and leaves
it as it is, so the tiles are exact and only the base tile is a resize of
the resized image. A size where the processor would pick another grid,
resize again, or where vLLM would count other image tokens for the prompt
(its unpadded feature grid, from the image's size) ships at its own size.

LLaVA-NeXT's anyres is the same, but its grid sizes are too close to its
base tile for the approximation (benches/resize_approximate.py --processor
next measures it): it has no policy."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from pixelwire.resize.policy import ResizePolicy
from pixelwire.resize.reading import ImageConfig, NoPolicy, positive

# LLaVA-OneVision's anyres_max_9: a prompt keeps at most nine tiles' worth of features.
ANYRES_MAX_TILES = 9
# The aspect setting whose arithmetic is reproduced: vLLM 0.32's
# LLaVA-OneVision shrinks a feature grid over ANYRES_MAX_TILES tiles' worth
# (its "anyres_max_9", fixed in its token count).
_ASPECT = f"anyres_max_{ANYRES_MAX_TILES}"


@dataclass(frozen=True, kw_only=True)
class AnyresPolicy(ResizePolicy):
    """The grid resolutions (height, width) the processor picks from, its
    base tile (height x width) and the vision tower's patches a tile side
    (vLLM counts the prompt's image tokens with them)."""

    family: ClassVar[str] = "anyres"
    approximate: ClassVar[bool] = True
    height: int
    width: int
    grid: tuple[tuple[int, int], ...]
    tile_patches: int

    @property
    def shape(self) -> str:
        grid = hashlib.sha256(json.dumps(self.grid).encode()).hexdigest()[:16]
        return f"anyres:{self.height}x{self.width}:grid={grid}:patches={self.tile_patches}"

    def processor_target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        return fit_in_resolution(height, width, select_best_resolution(height, width, self.grid))

    def target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        """:meth:`ResizePolicy.target`, where it ships (:meth:`ships`)."""
        resized = super().target(height, width, num_frames)
        return resized if self.ships(height, width, resized) else (height, width)

    def ships(self, height: int, width: int, resized: tuple[int, int]) -> bool:
        """Whether an image of (height, width) ships at its grid size
        ``resized``: smaller than the original (else the original is exact)
        but each side at least twice the base tile's (so the base tile is
        still a downscale by 2 or more, of a smaller source: a resize by
        little more than 1 moves sharp edges by many steps), the processor
        picking the same grid for it, and vLLM counting the prompt's image
        tokens for it as for the original."""
        if resized[0] * resized[1] >= height * width:
            return False
        if resized[0] < 2 * self.height or resized[1] < 2 * self.width:
            return False
        best = select_best_resolution(height, width, self.grid)
        if select_best_resolution(*resized, self.grid) != best:
            return False
        return anyres_features(height, width, best, self.height, self.tile_patches) == anyres_features(
            *resized, best, self.height, self.tile_patches
        )


def select_best_resolution(height: int, width: int, grid: tuple[tuple[int, int], ...]) -> tuple[int, int]:
    """The grid resolution (height, width) anyres picks for an image, as
    transformers 5.19 (``select_best_resolution``) and vLLM pick it: the
    most of the image's pixels kept, then the least padding, the first of
    equals."""
    best, most, least = grid[0], 0, math.inf
    for grid_height, grid_width in grid:
        scale = min(grid_width / width, grid_height / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        wasted = grid_width * grid_height - kept
        if kept > most or (kept == most and wasted < least):
            best, most, least = (grid_height, grid_width), kept, wasted
    return best


def fit_in_resolution(height: int, width: int, resolution: tuple[int, int]) -> tuple[int, int]:
    """The size anyres resizes an image to within its grid resolution
    (transformers' ``get_patch_output_size``): one side to the
    resolution's, the other scaled and rounded up, within it."""
    target_height, target_width = resolution
    scale_width, scale_height = target_width / width, target_height / height
    if scale_width < scale_height:
        return min(math.ceil(height * scale_width), target_height), target_width
    return target_height, min(math.ceil(width * scale_height), target_width)


def anyres_features(
    height: int, width: int, resolution: tuple[int, int], tile: int, tile_patches: int
) -> tuple[int, int]:
    """The (rows, columns) of the feature grid vLLM 0.32's LLaVA-OneVision
    keeps for an image of (height, width) tiled at ``resolution``: the
    padding's rows or columns cut from the tiles' patch grid (by the
    image's aspect ratio), then shrunk when over nine tiles' worth; the
    prompt's image tokens follow from it (rows x columns plus a newline a row)."""
    rows = resolution[0] // tile * tile_patches
    columns = resolution[1] // tile * tile_patches
    if width / height > columns / rows:
        kept = int(round(height * (columns / width), 7))
        rows -= 2 * ((rows - kept) // 2)
    else:
        kept = int(round(width * (rows / height), 7))
        columns -= 2 * ((columns - kept) // 2)
    ratio = math.sqrt(rows * columns / (ANYRES_MAX_TILES * tile_patches**2))
    if ratio > 1.1:
        return int(rows // ratio), int(columns // ratio)
    return rows, columns


def read(image: ImageConfig) -> AnyresPolicy:
    """The policy of LLaVA-OneVision's config, checked against the model's
    ``config.json`` (vLLM counts the prompt's tokens from its grid and
    vision tower; a checkpoint whose processor says otherwise is not one
    whose tokens pixelwire can keep)."""
    filter_ = image.resize_filter()
    if not image.approximate:
        raise NoPolicy(
            f"{image.name} resizes the original twice (to its grid resolution and to its base tile); "
            "--resize-approximate ships the grid-size image (the base tile then differs slightly)"
        )
    settings, size = image.settings, image.size()
    grid: Any = settings.get("image_grid_pinpoints")
    if not (
        isinstance(grid, list)
        and grid
        and all(isinstance(pair, list) and len(pair) == 2 and all(map(positive, pair)) for pair in grid)
    ):
        raise NoPolicy(f"{image.name}: image_grid_pinpoints {grid!r} is not a list of [height, width]")
    height: Any = size.get("height")
    width: Any = size.get("width")
    # the tile side is crop_size's where it has one (None by default)
    tile = (settings.get("crop_size") or {}).get("height", height)
    if not (positive(height) and height == width == tile):
        raise NoPolicy(f"{image.name}: size {size} is not a square {{height, width}} tile")
    model = image.model
    vision: Any = model.get("vision_config") or {}
    side, patch = vision.get("image_size"), vision.get("patch_size")
    if model.get("image_grid_pinpoints", grid) != grid:
        raise NoPolicy(f"{image.name}: config.json's image_grid_pinpoints are not the processor's")
    if not (positive(side) and positive(patch) and side == height):
        raise NoPolicy(f"{image.name}: config.json's vision_config has no image_size {height} and patch_size")
    aspect = model.get("vision_aspect_ratio", _ASPECT)
    if aspect != _ASPECT:
        raise NoPolicy(f"{image.name}: vision_aspect_ratio {aspect!r} is not {_ASPECT!r}, vLLM's")
    return AnyresPolicy(
        filter=filter_,
        kernel=image.kernel,
        height=int(height),
        width=int(width),
        grid=tuple((int(h), int(w)) for h, w in grid),
        tile_patches=int(side) // int(patch),
    )
