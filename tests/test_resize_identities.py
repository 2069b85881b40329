"""Each resize family's identity, and its resize steps, pinned for
representative configs: an identity is signed into descriptors and compared
between frontend and worker at the handshake, so it must not change for a
config pixelwire already reads.

The MAIN_* values are main's (commit 09d1b3a, the single ``resize.py``),
computed by running its ``ResizePolicy.from_processor_config`` and
``video_resize_policy`` on these configs before the policies became one
module a family (#45)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from processor_configs import (
    GEMMA3,
    IDEFICS3,
    KIMI_K25,
    ONEVISION,
    ONEVISION_MODEL,
    PIXTRAL,
    QWEN,
    QWEN3_VIDEO,
    SIGLIP2,
)

from pixelwire.resize import image_policy_from_config, video_resize_policy

# Image sizes (height, width) whose resize steps are pinned.

SIZES = [(1080, 1920), (1920, 1080), (300, 400), (50, 3000), (2160, 3840), (1900, 2500)]
# name -> (image processor config, --mm-processor-kwargs, other arguments).
IMAGE_CONFIGS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "qwen2_vl": (
        {
            **QWEN,
            "image_processor_type": "Qwen2VLImageProcessorFast",
            "size": {"shortest_edge": 3136, "longest_edge": 12845056},
        },
        {"max_pixels": 1003520},
        {},
    ),
    "qwen2_vl_pillow": (
        {**QWEN, "min_pixels": 3136, "max_pixels": 12544, "resample": 2},
        {},
        {"kernel": "pillow"},
    ),
    "glm4v": (
        {
            "image_processor_type": "Glm4vImageProcessor",
            "temporal_patch_size": 2,
            "size": {"shortest_edge": 12544, "longest_edge": 9633792},
        },
        {},
        {},
    ),
    "siglip": (
        {"image_processor_type": "SiglipImageProcessor", "size": {"height": 384, "width": 384}},
        {},
        {},
    ),
    "gemma3": (GEMMA3, {}, {}),
    "got_ocr2": (
        {
            "image_processor_type": "GotOcr2ImageProcessor",
            "size": {"height": 384, "width": 384},
            "crop_to_patches": False,
        },
        {},
        {},
    ),
    "clip_square": (
        {"image_processor_type": "CLIPImageProcessor", "size": {"height": 224, "width": 224}},
        {},
        {},
    ),
    "clip": ({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 336}}, {}, {}),
    "siglip2": (SIGLIP2, {"max_num_patches": 1024}, {}),
    "pixtral": (PIXTRAL, {}, {"processor_config": {"patch_size": 14, "spatial_merge_size": 2}}),
    "pixtral_bounds": (
        {"image_processor_type": "PixtralImageProcessor", "size": {"height": 1024, "width": 768}},
        {},
        {},
    ),
    "idefics3": (IDEFICS3, {}, {}),
    "smolvlm_unsplit": (
        {**IDEFICS3, "image_processor_type": "SmolVLMImageProcessor", "resample": 3},
        {"do_image_splitting": False},
        {},
    ),
    "kimi_k25": (KIMI_K25, {}, {}),
    "llava_onevision": (ONEVISION, {}, {"approximate": True, "model_config": ONEVISION_MODEL}),
}
# name -> video processor config.
VIDEO_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2_vl_video": {
        "video_processor_type": "Qwen2VLVideoProcessor",
        "size": {"shortest_edge": 3136, "longest_edge": 12845056},
    },
    "qwen3_vl_video": {"video_processor_type": "Qwen3VLVideoProcessorFast"},
    "qwen3_vl_video_capped": {
        **QWEN3_VIDEO,
        "cap_pixels_per_frame": True,
        "max_video_tokens": 256,
        "fps": 1,
        "resample": 2,
    },
    "qwen3_vl_video_fixed_count": {**QWEN3_VIDEO, "num_frames": 8},
}

# name -> (main's identity, main's steps for each of SIZES).
MAIN_IMAGE: dict[str, tuple[str, list[list[tuple[int, int]]]]] = {
    "qwen2_vl": (
        "smart:factor=28:min=3136:max=1003520:torchvision:bicubic",
        [[(728, 1316)], [(1316, 728)], [(308, 392)], [(56, 2996)], [(728, 1316)], [(868, 1148)]],
    ),
    "qwen2_vl_pillow": (
        "smart:factor=28:min=3136:max=12544:pillow:bilinear",
        [[(84, 140)], [(140, 84)], [(84, 112)], [(50, 3000)], [(84, 140)], [(84, 112)]],
    ),
    "glm4v": (
        "smart:factor=28:min=12544:max=9633792:temporal=2:torchvision:bicubic",
        [[(1092, 1932)], [(1932, 1092)], [(308, 392)], [(56, 2996)], [(1624, 2912)], [(1904, 2492)]],
    ),
    "siglip": (
        "fixed:384x384:torchvision:bicubic",
        [[(384, 384)], [(384, 384)], [(384, 384)], [(384, 384)], [(384, 384)], [(384, 384)]],
    ),
    "gemma3": (
        "fixed:896x896:torchvision:bilinear",
        [[(896, 896)], [(896, 896)], [(896, 896)], [(896, 896)], [(896, 896)], [(896, 896)]],
    ),
    "got_ocr2": (
        "fixed:384x384:torchvision:bicubic",
        [[(384, 384)], [(384, 384)], [(384, 384)], [(384, 384)], [(384, 384)], [(384, 384)]],
    ),
    "clip_square": (
        "fixed:224x224:torchvision:bicubic",
        [[(224, 224)], [(224, 224)], [(224, 224)], [(224, 224)], [(224, 224)], [(224, 224)]],
    ),
    "clip": (
        "shortest_edge:336:torchvision:bicubic",
        [[(336, 597)], [(597, 336)], [(336, 448)], [(336, 20160)], [(336, 597)], [(336, 442)]],
    ),
    "siglip2": (
        "max_num_patches:1024:patch=16:torchvision:bilinear",
        [[(384, 672)], [(672, 384)], [(432, 576)], [(64, 3840)], [(384, 672)], [(448, 576)]],
    ),
    "pixtral": (
        "longest_edge:1540x1540:patch=28:torchvision:bicubic",
        [[(868, 1540)], [(1540, 868)], [(308, 420)], [(28, 1540)], [(868, 1540)], [(1176, 1540)]],
    ),
    "pixtral_bounds": (
        "longest_edge:1024x768:patch=16:torchvision:bicubic",
        [[(432, 768)], [(1024, 576)], [(304, 400)], [(16, 768)], [(432, 768)], [(592, 768)]],
    ),
    "idefics3": (
        "longest_edge_tiles:1456:tile=364:torchvision:lanczos",
        [
            [(820, 1456), (1092, 1456)],
            [(1456, 820), (1456, 1092)],
            [(1092, 1456)],
            [(24, 1456), (364, 1456)],
            [(820, 1456), (1092, 1456)],
            [(1106, 1456), (1456, 1456)],
        ],
    ),
    "smolvlm_unsplit": (
        "longest_edge_tiles:1456:tile=0:torchvision:bicubic",
        [[(820, 1456)], [(1456, 820)], [(1092, 1456)], [(24, 1456)], [(820, 1456)], [(1106, 1456)]],
    ),
    "kimi_k25": (
        "navit:16384:side=512:patch=14:pillow:bicubic",
        [[(1080, 1920)], [(1920, 1080)], [(300, 400)], [(50, 3000)], [(1345, 2392)], [(1900, 2500)]],
    ),
    "llava_onevision": (
        "anyres:384x384:grid=9fbacea6e971525c:patches=27:torchvision:bicubic:approximate",
        [[(1080, 1920)], [(1920, 1080)], [(300, 400)], [(50, 3000)], [(1296, 2304)], [(1752, 2304)]],
    ),
}
# name -> (main's identity, main's video_target of 8 of 300 frames of 1080x1920
# at 30 fps, of all 24 of 1080x1920 at 25 fps, of 1 of 300 frames of 720x1280 at 30 fps).
MAIN_VIDEO: dict[str, tuple[str, list[tuple[int, int]]]] = {
    "qwen2_vl_video": (
        "smart:factor=28:min=3136:max=12845056:torchvision:bicubic",
        [(1092, 1932), (1092, 1932), (728, 1288)],
    ),
    "qwen3_vl_video": (
        "smart:factor=32:min=131072:max=786432:temporal=2:per_video:sample=2fps/4-768:torchvision:bicubic",
        [(224, 416), (320, 576), (720, 1280)],
    ),
    "qwen3_vl_video_capped": (
        "smart:factor=32:min=131072:max=786432:temporal=2:per_video:sample=1fps/4-768:cap=256:torchvision:bilinear",
        [(256, 480), (320, 576), (720, 1280)],
    ),
    "qwen3_vl_video_fixed_count": (
        "smart:factor=32:min=131072:max=786432:temporal=2:per_video:sample=0fps/0-0:torchvision:bicubic",
        [(224, 416), (1080, 1920), (720, 1280)],
    ),
}


@pytest.mark.parametrize("name", IMAGE_CONFIGS)
def test_an_image_policys_identity_and_steps_are_mains(name: str) -> None:
    """The family read from the config names the same resize and resizes
    each size in the same steps as main did."""
    config, kwargs, arguments = IMAGE_CONFIGS[name]
    policy = image_policy_from_config(config, kwargs, **arguments)
    assert policy is not None
    assert (policy.identity, [policy.steps(height, width) for height, width in SIZES]) == MAIN_IMAGE[name]


@pytest.mark.parametrize("name", VIDEO_CONFIGS)
def test_a_video_policys_identity_and_frame_sizes_are_mains(name: str, tmp_path: Path) -> None:
    """A model's video processor policy names the same resize and sizes
    frames as main did: a sampled few, all of a video (sampled again by the
    processor), and one frame (under the temporal patch)."""
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_CONFIGS[name]))
    policy = video_resize_policy(tmp_path)
    assert policy is not None
    sizes = [
        policy.video_target(1080, 1920, 8, 300, 30.0),
        policy.video_target(1080, 1920, 24, 24, 25.0),
        policy.video_target(720, 1280, 1, 300, 30.0),
    ]
    assert (policy.identity, sizes) == MAIN_VIDEO[name]
