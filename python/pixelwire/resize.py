"""Model-aware resize: the size a model's image processor will resize an
image to, so the frontend can ship exactly those pixels.

A :class:`ResizePolicy` is read from a model's Hugging Face
``preprocessor_config.json`` plus vLLM-style ``--mm-processor-kwargs``
overrides. Given a decoded image's (height, width) it returns the size the
processor resizes to; the native decoder then resizes with the processor's
own arithmetic (transformers 5's torchvision backend, or Pillow for the PIL
backend), bit for bit, so the worker's processor finds the image already at
its target size and leaves it as is.

Families (what transformers 5.19 does for each):

- ``smart``: Qwen2-VL, Qwen2.5-VL, Qwen3-VL (``Qwen2VLImageProcessor``):
  ``smart_resize`` with factor = patch_size x merge_size, min/max pixels from
  ``size.shortest_edge``/``size.longest_edge`` (or ``min_pixels``/``max_pixels``);
  GLM-4.1V/4.5V/4.6V (``Glm4vImageProcessor``) with GLM's own
  ``smart_resize``, whose pixel budget counts the temporal patch; and the
  video processors (:func:`video_resize_policy`): Qwen2-VL's per frame as
  its images, Qwen3-VL's per video (the budget counts the video's frames).
- ``fixed``: ``size: {height, width}`` (SigLIP; Gemma 3 without
  pan-and-scan, which would resize crops of the original beside it;
  GOT-OCR2 without ``crop_to_patches``, Aya Vision's tiles and thumbnail).
- ``max_num_patches``: SigLIP2 NaFlex (``Siglip2ImageProcessor``): the
  largest patch grid of ``max_num_patches`` that keeps the aspect ratio, by
  its binary search; its ``size`` is not used.
- ``shortest_edge``: ``size: {shortest_edge}`` (CLIP, LLaVA-1.5; the worker
  still does its centre crop).
- ``longest_edge``: Pixtral and Mistral 3 (``PixtralImageProcessor`` called
  by ``PixtralProcessor``): scaled down to fit ``size.longest_edge`` (or
  ``size.height`` x ``size.width``), each side then rounded up to the patch
  grid, whose side is the *processor's* ``patch_size`` x
  ``spatial_merge_size`` (``processor_config.json``; it overrides the image
  processor's own ``patch_size``).
- ``longest_edge_tiles``: Idefics3 and SmolVLM (``Idefics3ImageProcessor``,
  ``SmolVLMImageProcessor``): two resizes in a row, Lanczos by default: the
  longest edge to ``size.longest_edge`` (up or down, the other side rounded
  up to even, both kept within 4096), then, with ``do_image_splitting``,
  that image to multiples of ``max_image_size.longest_edge`` (the tile
  side). The tiles and the global image are cut and resized from the second
  result, so shipping it is exact: the processor's two resizes leave it as
  it is. The native decoder resizes through the first size to the second
  (:meth:`ResizePolicy.steps`). Without splitting, the processor squares the
  first result, which it would do again from the square, so the first
  result is shipped.
- ``anyres``, only with ``approximate`` (``--resize-approximate``):
  LLaVA-OneVision (``LlavaOnevisionImageProcessor``) resizes the original
  twice: to the grid resolution it picks from ``image_grid_pinpoints``
  (then padded and cut into tiles) and to its base tile. No one image gives
  both exactly. The approximate policy ships the grid-size image, resized
  as the processor resizes it, where that is smaller than the original and
  each side is at least twice the base tile's (the base tile is then a
  downscale of a smaller source): the processor picks the same grid for it
  and leaves it as it is, so the tiles are exact and only the base tile is
  a resize of the resized image. A size where the processor would pick
  another grid, resize again, or where vLLM would count other image tokens
  for the prompt (its unpadded feature grid, from the image's size) ships
  at its own size.
- ``navit``: Kimi-K2.5 (``KimiK25ForConditionalGeneration``, whose image
  processor vLLM 0.32 runs as its own ``KimiK25FusedVisionProcessor``,
  configured by the checkpoint's ``media_proc_cfg``): scaled down (never
  up) to fit ``in_patch_limit`` patches and ``patch_limit_on_one_side``
  patches a side, floored, with Pillow's bicubic; then zero-padded to the
  merged patch grid. vLLM hands it no ``--mm-processor-kwargs``.

Anything else (tiling, pan-and-scan, unknown processors) gets no policy and
one log line saying why.

The size arithmetic itself is :mod:`pixelwire.processor_sizes`; a model's
config files are found and read by :mod:`pixelwire.model_files`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pixelwire import model_files
from pixelwire.processor_sizes import (
    ANYRES_MAX_TILES,
    anyres_features,
    fit_in_resolution,
    fit_to_patch_grid,
    idefics3_longest_edge,
    idefics3_tile_grid,
    navit_size,
    select_best_resolution,
    size_for_max_num_patches,
    smart_resize,
    temporal_smart_resize,
)

log = logging.getLogger("pixelwire.resize")

Family = Literal[
    "smart",
    "fixed",
    "shortest_edge",
    "max_num_patches",
    "longest_edge",
    "longest_edge_tiles",
    "navit",
    "anyres",
]
Kernel = Literal["torchvision", "pillow"]
Filter = Literal["bicubic", "bilinear", "lanczos"]

# PIL's resample numbers, as preprocessor configs spell them. Lanczos (1) is
# taken only for the families whose parity tests run it.
_RESAMPLE: dict[int, Filter] = {1: "lanczos", 2: "bilinear", 3: "bicubic"}
# image_processor_type (or processor_class) -> family. Qwen2.5-VL and
# Qwen3-VL load Qwen2VLImageProcessor in transformers 5.
_SMART = ("Qwen2VLImageProcessor", "Qwen2_5_VLImageProcessor", "Qwen3VLImageProcessor")
_SMART_GLM = ("Glm4vImageProcessor",)
_FIXED = ("SiglipImageProcessor", "Gemma3ImageProcessor", "GotOcr2ImageProcessor")
_MAX_NUM_PATCHES = ("Siglip2ImageProcessor",)
_SHORTEST = ("CLIPImageProcessor",)
_LONGEST = ("PixtralImageProcessor",)
_LONGEST_TILES = ("Idefics3ImageProcessor", "SmolVLMImageProcessor")
# Kimi-K2.5's image processor, as its checkpoint names it (remote code; vLLM
# runs its own equivalent, KimiK25FusedVisionProcessor, in its place).
_NAVIT = ("KimiK25VisionProcessor",)
# Processors that resize the original twice (grid tiles and a base tile),
# served only approximately. LLaVA-NeXT's anyres is the same, but its grid
# sizes are too close to its base tile for the approximation
# (benches/resize_approximate.py --processor next measures it): no policy.
_ANYRES = ("LlavaOnevisionImageProcessor",)
# The aspect setting whose arithmetic is reproduced: vLLM 0.32's
# LLaVA-OneVision shrinks a feature grid over ANYRES_MAX_TILES tiles' worth
# (its "anyres_max_9", fixed in its token count).
_ANYRES_ASPECT = f"anyres_max_{ANYRES_MAX_TILES}"
# PixtralProcessor's defaults for its patch grid.
_PIXTRAL_PATCH, _PIXTRAL_MERGE = 16, 1


def _processor_name(config: Mapping[str, Any]) -> str:
    auto_map = config.get("auto_map")
    # A remote-code processor may be named only by its auto_map entry ("module.Class").
    remote = auto_map.get("AutoImageProcessor") if isinstance(auto_map, dict) else None
    remote_name = remote.rsplit(".", 1)[-1] if isinstance(remote, str) else ""
    name = str(config.get("image_processor_type") or config.get("processor_class") or remote_name)
    for suffix in ("Fast", "Pil"):
        name = name.removesuffix(suffix)
    return name.replace("Processor", "ImageProcessor") if name.endswith("VLProcessor") else name


@dataclass(frozen=True)
class ResizePolicy:
    """The resize a model's processor applies; see the module docstring."""

    family: Family
    filter: Filter = "bicubic"
    kernel: Kernel = "torchvision"
    # smart
    factor: int = 0
    min_pixels: int = 0
    max_pixels: int = 0
    temporal_factor: int = 0  # GLM's and Qwen3-VL video's smart_resize; 0 for Qwen's
    # Qwen3-VL's video smart_resize: the pixel budget counts the video's
    # frames, not the temporal patch, so the size is per video.
    video_frames: bool = False
    # How that processor samples a video given whole (vLLM's
    # do_sample_frames): its fps (0: not reproduced) and frame bounds.
    sample_fps: float = 0.0
    min_frames: int = 0
    max_frames: int = 0
    # Its cap_pixels_per_frame: the tokens a frame may take
    # (max_video_tokens); 0 without the cap.
    frame_tokens: int = 0
    # fixed; longest_edge's bounds
    height: int = 0
    width: int = 0
    # shortest_edge
    shortest_edge: int = 0
    # max_num_patches (and its patch side; longest_edge's patch grid)
    max_num_patches: int = 0
    patch_size: int = 0
    # longest_edge_tiles: the first resize's longest edge, and the tile side
    # the second rounds up to (0: no splitting, no second resize)
    longest_edge: int = 0
    tile: int = 0
    # navit: the patches an image may take, and a side
    patch_limit: int = 0
    side_patches: int = 0
    # anyres: the grid resolutions (height, width) the processor picks
    # from, and the vision tower's patches a tile side (vLLM counts the
    # prompt's image tokens with them); height x width is the base tile
    grid: tuple[tuple[int, int], ...] = ()
    tile_patches: int = 0
    # Ships images the processor turns into outputs that differ from its
    # outputs on the original (only anyres's base tile); opted into by
    # --resize-approximate and PIXELWIRE_RESIZE_APPROXIMATE.
    approximate: bool = False

    @property
    def identity(self) -> str:
        """One string naming everything that shapes the output; equal
        identities resize every image alike."""
        if self.family == "smart":
            shape = f"smart:factor={self.factor}:min={self.min_pixels}:max={self.max_pixels}"
            shape += f":temporal={self.temporal_factor}" if self.temporal_factor else ""
            if self.video_frames:
                shape += f":per_video:sample={self.sample_fps:g}fps/{self.min_frames}-{self.max_frames}"
                shape += f":cap={self.frame_tokens}" if self.frame_tokens else ""
        elif self.family == "fixed":
            shape = f"fixed:{self.height}x{self.width}"
        elif self.family == "max_num_patches":
            shape = f"max_num_patches:{self.max_num_patches}:patch={self.patch_size}"
        elif self.family == "longest_edge":
            shape = f"longest_edge:{self.height}x{self.width}:patch={self.patch_size}"
        elif self.family == "longest_edge_tiles":
            shape = f"longest_edge_tiles:{self.longest_edge}:tile={self.tile}"
        elif self.family == "navit":
            shape = f"navit:{self.patch_limit}:side={self.side_patches}:patch={self.patch_size}"
        elif self.family == "anyres":
            grid = hashlib.sha256(json.dumps(self.grid).encode()).hexdigest()[:16]
            shape = f"anyres:{self.height}x{self.width}:grid={grid}:patches={self.tile_patches}"
        else:
            shape = f"shortest_edge:{self.shortest_edge}"
        return f"{shape}:{self.kernel}:{self.filter}" + (":approximate" if self.approximate else "")

    def target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        """The (height, width) to ship a (height, width) image at: the size
        the processor resizes it to, or its own size when the processor would
        resize that result again (a side clamped to the factor at an extreme
        aspect ratio leaves it over the pixel budget): only a size the
        processor leaves alone gives its outputs exactly. ``num_frames``:
        the frames of the video a ``video_frames`` policy resizes (fewer
        than the temporal patch: the processor fails on them, as it will on
        vLLM's own, so they keep their size)."""
        if self.video_frames and num_frames is not None and num_frames < self.temporal_factor:
            return height, width
        resized = self.processor_target(height, width, num_frames)
        if min(resized) < 1:
            # Pixtral's floor at an extreme aspect ratio: the processor
            # fails on the image, as it will on vLLM's own.
            return height, width
        if resized != (height, width) and not self._leaves_alone(*resized, num_frames):
            return height, width
        if self.family == "anyres" and not self._anyres_ships(height, width, resized):
            return height, width
        return resized

    def _anyres_ships(self, height: int, width: int, resized: tuple[int, int]) -> bool:
        """Whether an anyres image of (height, width) ships at its grid size
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

    def _leaves_alone(self, height: int, width: int, num_frames: int | None = None) -> bool:
        """Whether the processor keeps a (height, width) image (or frames of
        a ``num_frames`` video) as it is: each of its resizes, where it makes two."""
        size = (height, width)
        tiles = self.family == "longest_edge_tiles"
        if tiles and idefics3_longest_edge(height, width, self.longest_edge) != size:
            return False
        return self.processor_target(height, width, num_frames) == size

    def steps(self, height: int, width: int) -> list[tuple[int, int]]:
        """The sizes the native decoder resizes a (height, width) image to,
        in turn (its ``resize=``): :meth:`target`, through the first of the
        processor's two resizes where it makes two."""
        shipped = self.target(height, width)
        if self.family != "longest_edge_tiles" or not self.tile or shipped == (height, width):
            return [shipped]
        first = idefics3_longest_edge(height, width, self.longest_edge)
        return [shipped] if first == shipped else [first, shipped]

    def video_target(
        self, height: int, width: int, frames: int, total_frames: int, fps: float = 0.0
    ) -> tuple[int, int]:
        """The (height, width) to ship each of ``frames`` frames sampled
        from a video of ``total_frames`` at (``total_frames`` and ``fps``:
        vLLM's ``total_num_frames`` and ``fps`` metadata). A
        ``video_frames`` policy's size depends on the count the processor
        resizes: when the frames are all of the video's, vLLM has the
        processor sample them again (``do_sample_frames``), so it is the
        count that sampling keeps (:meth:`processor_sampled_frames`); where
        that is not known they keep their size."""
        if self.video_frames and frames == total_frames:
            sampled = self.processor_sampled_frames(total_frames, fps)
            if sampled is None:
                return height, width
            frames = sampled
        return self.target(height, width, frames)

    def processor_sampled_frames(self, total_frames: int, fps: float) -> int | None:
        """How many frames Qwen3VLVideoProcessor's ``sample_frames`` keeps of
        a video of ``total_frames`` at ``fps`` (transformers 5.19's
        arithmetic, in its order); None where it is not reproduced (no fps
        of its own, or a source fps it would divide by zero with)."""
        if self.sample_fps <= 0 or fps <= 0:
            return None
        count = int(total_frames / fps * self.sample_fps)
        return min(max(count, self.min_frames), self.max_frames, total_frames)

    def processor_target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        """The (height, width) the processor resizes a (height, width) image
        (or a video of ``num_frames`` such frames, for a ``video_frames``
        policy) to."""
        if self.family == "longest_edge_tiles":
            height, width = idefics3_longest_edge(height, width, self.longest_edge)
            return idefics3_tile_grid(height, width, self.tile) if self.tile else (height, width)
        if self.family == "fixed":
            return self.height, self.width
        if self.family == "navit":
            return navit_size(height, width, self.patch_size, self.patch_limit, self.side_patches)
        if self.family == "anyres":
            return fit_in_resolution(height, width, select_best_resolution(height, width, self.grid))
        if self.family == "max_num_patches":
            return size_for_max_num_patches(height, width, self.patch_size, self.max_num_patches)
        if self.family == "longest_edge":
            return fit_to_patch_grid(height, width, self.height, self.width, self.patch_size)
        if self.family == "shortest_edge":
            # transformers' get_resize_output_image_size(default_to_square=False)
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = self.shortest_edge, int(self.shortest_edge * long / short)
            return (new_long, new_short) if width <= height else (new_short, new_long)
        if self.temporal_factor:
            frames, budget = self.temporal_factor, self.max_pixels  # GLM's image: one temporal patch
            if self.video_frames:
                if num_frames is None:
                    raise ValueError(f"{self.identity} sizes a whole video: give its num_frames")
                frames = num_frames
                if self.frame_tokens:
                    # cap_pixels_per_frame: a frame's share is the token cap
                    # or an even share of the budget, at least 1.05 x the minimum.
                    cap = self.frame_tokens * self.factor * self.factor
                    per_frame = max(min(cap, self.max_pixels // frames), int(self.min_pixels * 1.05))
                    budget = per_frame * frames
            return temporal_smart_resize(
                frames, height, width, self.factor, self.temporal_factor, self.min_pixels, budget
            )
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    @classmethod
    def from_processor_config(
        cls,
        config: Mapping[str, Any],
        mm_processor_kwargs: Mapping[str, Any] | None = None,
        *,
        kernel: Kernel = "torchvision",
        processor_config: Mapping[str, Any] | None = None,
        model_config: Mapping[str, Any] | None = None,
        approximate: bool = False,
    ) -> ResizePolicy | None:
        """The policy of a ``preprocessor_config.json`` with vLLM's
        ``--mm-processor-kwargs`` applied the way vLLM applies them (``size``
        first, then ``min_pixels``/``max_pixels``); None, logged, when
        pixelwire cannot reproduce the processor's resize.
        ``processor_config``: the processor's own settings (the top level of
        ``processor_config.json``), which Pixtral's resize depends on.
        ``model_config``: the model's ``config.json``, which vLLM counts an
        anyres image's tokens with. ``approximate``: also the policies whose
        outputs are not the processor's own on the original (anyres)."""
        kwargs = dict(mm_processor_kwargs or {})
        name = _processor_name(config)
        if name in _NAVIT:
            return cls._navit(name, config)
        settings = {**config, **{k: v for k, v in kwargs.items() if k not in ("size",)}}
        if settings.get("do_resize", True) is False:
            return _none(f"{name or 'the processor'} does not resize (do_resize is false)")
        resample = settings.get("resample", 1 if name in _LONGEST_TILES else 3)
        filter_: Filter | None = _RESAMPLE.get(resample) if isinstance(resample, int) else None
        if filter_ is None or (filter_ == "lanczos" and name not in _LONGEST_TILES):
            return _none(f"{name}: resample {resample!r} is not one pixelwire resizes with for it")
        size = dict(config.get("size") or {})
        if name in _SMART_GLM:
            if any(key in source for source in (config, kwargs) for key in ("min_pixels", "max_pixels")):
                return _none(f"{name} takes its pixel budget from size, not min_pixels/max_pixels")
            size.update(kwargs.get("size") or {})
            patch, merge = settings.get("patch_size", 14), settings.get("merge_size", 2)
            temporal = settings.get("temporal_patch_size", 2)
            low, high = size.get("shortest_edge", 0), size.get("longest_edge", 0)
            if not all(_positive(value) for value in (patch, merge, temporal, low, high)):
                return _none(f"{name}: patch, merge and temporal sizes and min/max pixels must be positive")
            return cls(
                "smart",
                filter_,
                kernel,
                factor=int(patch) * int(merge),
                min_pixels=int(low),
                max_pixels=int(high),
                temporal_factor=int(temporal),
            )
        if name in _SMART:
            # The processor's own config first (its min/max_pixels win over
            # its size), then the overrides in the same order.
            _pixel_aliases(size, config)
            size.update(kwargs.get("size") or {})
            _pixel_aliases(size, kwargs)
            patch, merge = settings.get("patch_size", 14), settings.get("merge_size", 2)
            low, high = size.get("shortest_edge", 0), size.get("longest_edge", 0)
            if not (_positive(patch) and _positive(merge) and _positive(low) and _positive(high)):
                return _none(f"{name}: patch_size, merge_size and min/max pixels must be positive integers")
            return cls(
                "smart",
                filter_,
                kernel,
                factor=int(patch) * int(merge),
                min_pixels=int(low),
                max_pixels=int(high),
            )
        if name in _ANYRES:
            if not approximate:
                return _none(
                    f"{name} resizes the original twice (to its grid resolution and to its base tile); "
                    "--resize-approximate ships the grid-size image (the base tile then differs slightly)"
                )
            size.update(kwargs.get("size") or {})
            return cls._anyres(name, settings, size, filter_, kernel, model_config or {})
        if name in _LONGEST:
            return cls._longest_edge(name, config, kwargs, filter_, kernel, processor_config or {})
        if name in _LONGEST_TILES:
            size.update(kwargs.get("size") or {})
            return cls._longest_edge_tiles(name, settings, size, filter_, kernel)
        if name in _MAX_NUM_PATCHES:
            patch, most = settings.get("patch_size", 16), settings.get("max_num_patches", 256)
            if not (_positive(patch) and _positive(most)):
                return _none(f"{name}: patch_size and max_num_patches must be positive integers")
            return cls("max_num_patches", filter_, kernel, max_num_patches=int(most), patch_size=int(patch))
        if settings.get("do_pan_and_scan"):
            return _none(f"{name}: pan-and-scan resizes crops of the original beside the whole image")
        if settings.get("crop_to_patches"):
            return _none(f"{name}: crop_to_patches resizes the original to tiles and again to a thumbnail")
        size.update(kwargs.get("size") or {})
        if name in _FIXED or (name in _SHORTEST and "height" in size):
            height, width = size.get("height"), size.get("width")
            if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
                return _none(f"{name}: size {size} is not {{height, width}}")
            return cls("fixed", filter_, kernel, height=height, width=width)
        if name in _SHORTEST:
            edge = size.get("shortest_edge")
            if not isinstance(edge, int) or edge <= 0 or size.get("longest_edge"):
                return _none(f"{name}: size {size} is not {{shortest_edge}}")
            return cls("shortest_edge", filter_, kernel, shortest_edge=edge)
        return _none(f"{name or 'an unnamed image processor'} is not a family pixelwire resizes for")

    @classmethod
    def _longest_edge(
        cls,
        name: str,
        config: Mapping[str, Any],
        kwargs: Mapping[str, Any],
        filter_: Filter,
        kernel: Kernel,
        processor: Mapping[str, Any],
    ) -> ResizePolicy | None:
        # vLLM hands --mm-processor-kwargs to the processor (its patch_size
        # and spatial_merge_size) and to the call (size).
        size = {**dict(config.get("size") or {}), **dict(kwargs.get("size") or {})}
        patch = kwargs.get("patch_size", processor.get("patch_size", _PIXTRAL_PATCH))
        merge = kwargs.get("spatial_merge_size", processor.get("spatial_merge_size", _PIXTRAL_MERGE))
        if not (_positive(patch) and _positive(merge)):
            return _none(
                f"{name}: the processor's patch_size and spatial_merge_size must be positive integers"
            )
        longest = size.get("longest_edge")
        bounds = (longest, longest) if longest else (size.get("height"), size.get("width"))
        if not all(_positive(side) for side in bounds):
            return _none(f"{name}: size {size} is not {{longest_edge}} or {{height, width}}")
        return cls(
            "longest_edge",
            filter_,
            kernel,
            height=int(bounds[0] or 0),
            width=int(bounds[1] or 0),
            patch_size=int(patch) * int(merge),
        )

    @classmethod
    def _longest_edge_tiles(
        cls, name: str, settings: Mapping[str, Any], size: Mapping[str, Any], filter_: Filter, kernel: Kernel
    ) -> ResizePolicy | None:
        longest: Any = size.get("longest_edge")
        if not _positive(longest):
            return _none(f"{name}: size {dict(size)} is not {{longest_edge}}")
        if not settings.get("do_image_splitting", True):
            return cls("longest_edge_tiles", filter_, kernel, longest_edge=int(longest))
        tile: Any = (settings.get("max_image_size") or {}).get("longest_edge", 364)
        if not _positive(tile):
            return _none(f"{name}: max_image_size {settings.get('max_image_size')} is not {{longest_edge}}")
        return cls("longest_edge_tiles", filter_, kernel, longest_edge=int(longest), tile=int(tile))

    @classmethod
    def _anyres(
        cls,
        name: str,
        settings: Mapping[str, Any],
        size: Mapping[str, Any],
        filter_: Filter,
        kernel: Kernel,
        model: Mapping[str, Any],
    ) -> ResizePolicy | None:
        grid: Any = settings.get("image_grid_pinpoints")
        if not (
            isinstance(grid, list)
            and grid
            and all(isinstance(pair, list) and len(pair) == 2 and all(map(_positive, pair)) for pair in grid)
        ):
            return _none(f"{name}: image_grid_pinpoints {grid!r} is not a list of [height, width]")
        height: Any = size.get("height")
        width: Any = size.get("width")
        # the tile side is crop_size's where it has one (None by default)
        tile = (settings.get("crop_size") or {}).get("height", height)
        if not (_positive(height) and height == width == tile):
            return _none(f"{name}: size {dict(size)} is not a square {{height, width}} tile")
        # vLLM counts the prompt's tokens from config.json's grid and
        # vision tower; a checkpoint whose processor says otherwise is not
        # one whose tokens pixelwire can keep.
        vision: Any = model.get("vision_config") or {}
        side, patch = vision.get("image_size"), vision.get("patch_size")
        if model.get("image_grid_pinpoints", grid) != grid:
            return _none(f"{name}: config.json's image_grid_pinpoints are not the processor's")
        if not (_positive(side) and _positive(patch) and side == height):
            return _none(f"{name}: config.json's vision_config has no image_size {height} and patch_size")
        aspect = model.get("vision_aspect_ratio", _ANYRES_ASPECT)
        if aspect != _ANYRES_ASPECT:
            return _none(f"{name}: vision_aspect_ratio {aspect!r} is not {_ANYRES_ASPECT!r}, vLLM's")
        return cls(
            "anyres",
            filter_,
            kernel,
            height=int(height),
            width=int(width),
            grid=tuple((int(h), int(w)) for h, w in grid),
            tile_patches=int(side) // int(patch),
            approximate=True,
        )

    @classmethod
    def _navit(cls, name: str, config: Mapping[str, Any]) -> ResizePolicy | None:
        media = config.get("media_proc_cfg")
        if not isinstance(media, dict):
            return _none(f"{name}: the config has no media_proc_cfg")
        patch: Any = media.get("patch_size")
        limit: Any = media.get("in_patch_limit")
        side: Any = media.get("patch_limit_on_one_side")
        if not all(_positive(value) for value in (patch, limit, side)):
            return _none(
                f"{name}: media_proc_cfg's patch_size, in_patch_limit and patch_limit_on_one_side "
                "must be positive integers"
            )
        # Its processor resizes with Pillow, whatever backend transformers'
        # own processors use.
        return cls(
            "navit",
            "bicubic",
            "pillow",
            patch_size=int(patch),
            patch_limit=int(limit),
            side_patches=int(side),
        )

    @classmethod
    def from_pretrained(
        cls,
        model: str | os.PathLike[str],
        mm_processor_kwargs: Mapping[str, Any] | None = None,
        *,
        kernel: Kernel = "torchvision",
        approximate: bool = False,
    ) -> ResizePolicy | None:
        """The policy of a model: a local folder, or a Hub id resolved
        through the Hugging Face cache. Read: the image processor's config
        (``preprocessor_config.json``, or the ``image_processor`` part of
        ``processor_config.json``, where transformers 5 saves it), the
        processor's own settings, and ``config.json`` where the family
        needs it. ``approximate``: see :meth:`from_processor_config`."""
        config = model_files.image_processor_config(str(model))
        name = _processor_name(config)
        return cls.from_processor_config(
            config,
            mm_processor_kwargs,
            kernel=kernel,
            processor_config=model_files.processor_settings(str(model)),
            model_config=model_files.model_config(str(model)) if name in _ANYRES else None,
            approximate=approximate,
        )


# The video processors whose per-frame resize is the image family's:
# Qwen2VLVideoProcessor (Qwen2-VL, Qwen2.5-VL) resizes every frame with
# smart_resize over its own size, as Qwen2VLImageProcessor does an image.
_SMART_VIDEO = ("Qwen2VLVideoProcessor",)
# Qwen3VLVideoProcessor sizes a whole video (its smart_resize counts the
# frames); its class defaults, which a config without them keeps.
_QWEN3_VIDEO = "Qwen3VLVideoProcessor"
_QWEN3_VIDEO_DEFAULTS: dict[str, Any] = {
    "size": {"shortest_edge": 128 * 32 * 32, "longest_edge": 32 * 32 * 768},
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "resample": 3,
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
    "num_frames": None,
    "cap_pixels_per_frame": None,
    "max_video_tokens": 768,
}


def video_resize_policy(
    model: str | os.PathLike[str], mm_processor_kwargs: Mapping[str, Any] | None = None
) -> ResizePolicy | None:
    """The resize ``model``'s video processor applies to each frame, read
    from its ``video_preprocessor_config.json`` or the ``video_processor``
    part of ``processor_config.json``: ``Qwen2VLVideoProcessor``'s per frame,
    ``Qwen3VLVideoProcessor``'s per video (see
    :meth:`ResizePolicy.video_target`). None, logged, when pixelwire does
    not reproduce it: another video processor, ``--mm-processor-kwargs``
    (vLLM passes them on to videos by rules of its own) or Qwen2-VL's
    per-frame pixel cap (``cap_pixels_per_frame``, which divides a token
    budget among frames; Qwen3-VL's is reproduced)."""
    config = model_files.video_processor_config(str(model))
    if config is None:
        return _no_video_resize(f"{model}: no video processor config")
    name = str(config.get("video_processor_type") or "").removesuffix("Fast")
    if name not in (*_SMART_VIDEO, _QWEN3_VIDEO):
        return _no_video_resize(f"{name or 'an unnamed video processor'} is not one pixelwire resizes for")
    if mm_processor_kwargs:
        return _no_video_resize("not with --mm-processor-kwargs")
    if name == _QWEN3_VIDEO:
        return qwen3_video_policy(config)
    if config.get("cap_pixels_per_frame"):
        return _no_video_resize(f"{name} caps the pixels per frame from a token budget")
    return ResizePolicy.from_processor_config({**config, "image_processor_type": "Qwen2VLImageProcessor"})


def qwen3_video_policy(config: Mapping[str, Any]) -> ResizePolicy | None:
    """The per-video resize of a ``Qwen3VLVideoProcessor`` config (its class
    defaults where the config has none; a ``size`` replaces the default
    whole, as the processor takes it); None, logged, where it does not
    resize or pixelwire does not reproduce it."""
    settings = {**_QWEN3_VIDEO_DEFAULTS, **config}
    if settings.get("do_resize", True) is False:
        return _no_video_resize(f"{_QWEN3_VIDEO} does not resize (do_resize is false)")
    if any(key in config for key in ("min_pixels", "max_pixels")):
        # The processor has no such aliases: its budget is size's alone.
        return _no_video_resize(f"{_QWEN3_VIDEO} takes its pixel budget from size, not min_pixels/max_pixels")
    resample = settings["resample"]
    filter_ = _RESAMPLE.get(resample) if isinstance(resample, int) else None
    if filter_ is None:
        return _no_video_resize(f"{_QWEN3_VIDEO}: resample {resample!r} is not bicubic or bilinear")
    size = settings["size"] if isinstance(settings["size"], Mapping) else {}
    patch, merge, temporal = (settings[key] for key in ("patch_size", "merge_size", "temporal_patch_size"))
    low, high = size.get("shortest_edge", 0), size.get("longest_edge", 0)
    if not all(_positive(value) for value in (patch, merge, temporal, low, high)):
        return _no_video_resize(
            f"{_QWEN3_VIDEO}: patch, merge and temporal sizes and size's shortest/longest_edge must be "
            "positive integers"
        )
    # Its sampling of a whole video: fps frames a second within
    # [min_frames, max_frames]; not reproduced with a fixed num_frames
    # (which it refuses beside fps) or without an fps.
    tokens = settings["max_video_tokens"] if settings["cap_pixels_per_frame"] else 0
    if settings["cap_pixels_per_frame"] and not _positive(tokens):
        return _no_video_resize(f"{_QWEN3_VIDEO}: max_video_tokens {tokens!r} is not a positive integer")
    fps, least, most = settings["fps"], settings["min_frames"], settings["max_frames"]
    samples = settings["num_frames"] is None and _positive(least) and _positive(most)
    samples = samples and isinstance(fps, (int, float)) and not isinstance(fps, bool) and fps > 0
    return ResizePolicy(
        "smart",
        filter_,
        "torchvision",
        factor=int(patch) * int(merge),
        min_pixels=int(low),
        max_pixels=int(high),
        temporal_factor=int(temporal),
        video_frames=True,
        sample_fps=float(fps) if samples else 0.0,
        min_frames=int(least) if samples else 0,
        max_frames=int(most) if samples else 0,
        frame_tokens=int(tokens),
    )


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _pixel_aliases(size: dict[str, Any], source: Mapping[str, Any]) -> None:
    """Qwen's ``min_pixels``/``max_pixels`` are ``size``'s two edges."""
    for edge, alias in (("shortest_edge", "min_pixels"), ("longest_edge", "max_pixels")):
        if source.get(alias) is not None:
            size[edge] = source[alias]


def _no_video_resize(why: str) -> ResizePolicy | None:
    log.info("no model-aware resize of video frames: %s; frames travel at full resolution", why)
    return None


def _none(why: str) -> ResizePolicy | None:
    log.info("no model-aware resize: %s; images travel at full resolution", why)
    return None
