"""The processors' size arithmetic: the size each image processor resizes
an image (or a video's frames) to, as transformers 5.19 and vLLM 0.32
compute it, the same operations in the same order so the same rounding.
Pure functions of sizes; :mod:`pixelwire.resize` chooses among them."""

from __future__ import annotations

import math

# LLaVA-OneVision's anyres_max_9: a prompt keeps at most nine tiles' worth of features.
ANYRES_MAX_TILES = 9
# Idefics3's resize keeps both sides within this (transformers' MAX_IMAGE_SIZE).
IDEFICS3_MAX_SIDE = 4096


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


def navit_size(height: int, width: int, patch: int, patch_limit: int, side_patches: int) -> tuple[int, int]:
    """Kimi-K2.5's target size, as vLLM 0.32 computes it
    (``navit_resize_image`` of its fused processor, in the same
    floating-point steps): scaled down to fit ``patch_limit`` whole patches
    and ``side_patches`` patches a side, floored, never up."""
    within_limit = math.sqrt(patch_limit / (max(1.0, width // patch) * max(1.0, height // patch)))
    side = side_patches * patch
    scale = min(1.0, within_limit, side / width, side / height)
    return min(max(1, int(height * scale)), side), min(max(1, int(width * scale)), side)


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
