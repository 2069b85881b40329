"""The processor classes pixelwire knows, by the name a model's config
gives them: each image processor's resize family, and each video
processor's loader and resize. The one place a processor is named: adding
a family is its module under :mod:`pixelwire.resize.families` and its
lines here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pixelwire.resize.families import (
    anyres,
    fixed,
    longest_edge,
    longest_edge_tiles,
    max_num_patches,
    navit,
    shortest_edge,
    smart,
    smart_video,
)
from pixelwire.resize.policy import ResizePolicy
from pixelwire.resize.reading import ImageConfig

# A family's reader: the policy of a processor config, or NoPolicy raised.
ImageReader = Callable[[ImageConfig], ResizePolicy]
VideoReader = Callable[[Mapping[str, Any]], ResizePolicy]

# Image processor class (as reading.processor_name spells it) -> its reader.
IMAGE_PROCESSORS: dict[str, ImageReader] = {
    # Qwen2.5-VL and Qwen3-VL load Qwen2VLImageProcessor in transformers 5.
    "Qwen2VLImageProcessor": smart.read_qwen2_vl,
    "Qwen2_5_VLImageProcessor": smart.read_qwen2_vl,
    "Qwen3VLImageProcessor": smart.read_qwen2_vl,
    "Glm4vImageProcessor": smart.read_glm4v,
    "SiglipImageProcessor": fixed.read,
    "Gemma3ImageProcessor": fixed.read,
    "GotOcr2ImageProcessor": fixed.read,
    "CLIPImageProcessor": shortest_edge.read,
    "Siglip2ImageProcessor": max_num_patches.read,
    "PixtralImageProcessor": longest_edge.read,
    "Idefics3ImageProcessor": longest_edge_tiles.read,
    "SmolVLMImageProcessor": longest_edge_tiles.read,
    # Kimi-K2.5's, as its checkpoint names it (remote code; vLLM runs its
    # own equivalent, KimiK25FusedVisionProcessor, in its place).
    "KimiK25VisionProcessor": navit.read,
    "LlavaOnevisionImageProcessor": anyres.read,
}

# Image processors whose PIL backend (vLLM's --mm-processor-kwargs
# ``backend`` "pil", or ``use_fast`` false) resizes as Pillow does, which
# the "pillow" kernel reproduces (tests/e2e/test_resize_parity.py runs each
# against its PIL backend; Kimi-K2.5's resizes with Pillow on either). Any
# other processor under that backend gets no policy.
PILLOW_BACKENDS = frozenset(
    {
        "Qwen2VLImageProcessor",
        "Qwen2_5_VLImageProcessor",
        "Qwen3VLImageProcessor",
        "Glm4vImageProcessor",
        "SiglipImageProcessor",
        "Gemma3ImageProcessor",
        "CLIPImageProcessor",
        "Siglip2ImageProcessor",
        "PixtralImageProcessor",
        "Idefics3ImageProcessor",
        "KimiK25VisionProcessor",
        "LlavaOnevisionImageProcessor",
    }
)


@dataclass(frozen=True)
class VideoProcessor:
    """What vLLM does with a video processor's videos: the loader it
    samples them with (vLLM 0.32's VIDEO_LOADER_REGISTRY registrations)
    and, where pixelwire reproduces it, the resize of their frames."""

    loader: str
    read: VideoReader | None = None


# video_processor_type -> what pixelwire reproduces of it.
VIDEO_PROCESSORS: dict[str, VideoProcessor] = {
    "Qwen2VLVideoProcessor": VideoProcessor("qwen2_vl", smart.read_qwen2_vl_video),
    "Qwen3VLVideoProcessor": VideoProcessor("qwen3_vl", smart_video.read_qwen3_vl_video),
    "Cosmos3EdgeVideoProcessor": VideoProcessor("qwen3_vl"),
}
