"""Processed videos (``pixelwire.processed_video``): which video processors
get a layout and what names it, and the rows laid out of resized frames as
transformers' ``Qwen2VLVideoProcessor`` and ``Qwen3VLVideoProcessor`` lay
them out (the reference below spells out their padding, reshape and
permute with numpy), uint8 or float32 normalised values. The comparison
with vLLM's own processor is the vLLM group's
(tests/e2e/test_processed_videos.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pixelwire.processed import Normalisation
from pixelwire.processed_video import VideoPatchLayout, video_identity, video_patch_layout
from pixelwire.resize.families.smart import SmartPolicy
from pixelwire.resize.families.smart_video import SmartVideoPolicy

QWEN2 = SmartPolicy(factor=28, min_pixels=3136, max_pixels=50176)
QWEN3 = SmartVideoPolicy(factor=32, min_pixels=4096, max_pixels=1 << 20, temporal_factor=2)
CLIP_MEAN, CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
VALUES = Normalisation("torchvision", CLIP_MEAN, CLIP_STD, 1 / 255)
QWEN2_CONFIG: dict[str, Any] = {
    "video_processor_type": "Qwen2VLVideoProcessor",
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "do_sample_frames": False,
    "image_mean": list(CLIP_MEAN),
    "image_std": list(CLIP_STD),
    "rescale_factor": 1 / 255,
}


def processor_rows(frames: np.ndarray, patch: int, temporal: int, merge: int) -> np.ndarray:
    """The video processor's rows of (T, H, W, 3) frames: channels first,
    the last frame repeated up to a whole temporal patch, reshaped and
    permuted as its ``patchify`` does."""
    video = frames.transpose(0, 3, 1, 2)
    if pad := -len(video) % temporal:
        video = np.concatenate([video, np.repeat(video[-1:], pad, axis=0)])
    count, channels, height, width = video.shape
    gt, gh, gw = count // temporal, height // patch, width // patch
    blocks = video.reshape(gt, temporal, channels, gh // merge, merge, patch, gw // merge, merge, patch)
    rows = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return rows.reshape(gt * gh * gw, channels * temporal * patch * patch)


def _frames(count: int, height: int, width: int) -> np.ndarray:
    return np.random.default_rng(count * 1000 + height).integers(
        0, 256, (count, height, width, 3), dtype=np.uint8
    )


@pytest.mark.parametrize("count", [1, 2, 5, 8])
@pytest.mark.parametrize(("patch", "temporal", "merge"), [(14, 2, 2), (16, 2, 2), (14, 3, 1)])
def test_rows_are_the_processors_layout_of_the_frames(
    count: int, patch: int, temporal: int, merge: int
) -> None:
    """Whole temporal groups and a last one filled with the last frame, on
    each grid: the rows, row for row, and the grid (t, h, w)."""
    policy = SmartPolicy(factor=patch * merge, min_pixels=1, max_pixels=1 << 30)
    layout = VideoPatchLayout("Qwen2VLVideoProcessor", patch, temporal, merge, policy)
    frames = _frames(count, 3 * patch * merge, 2 * patch * merge)
    rows, grid = layout.rows(frames)
    expected = processor_rows(frames, patch, temporal, merge)
    assert rows.dtype == np.uint8 and np.array_equal(rows, expected)
    assert grid == [-(-count // temporal), 3 * merge, 2 * merge]


def test_float_rows_are_the_torchvision_backends_values() -> None:
    """Without device normalisation: each byte's value as the processors'
    torchvision backend computes it (mean and std times 1/rescale in
    float32, then (x - mean) / std), on the same layout."""
    layout = VideoPatchLayout("Qwen2VLVideoProcessor", 14, 2, 2, QWEN2, VALUES)
    frames = _frames(3, 56, 84)
    rows, _ = layout.rows(frames)
    scale = np.float32(1 / VALUES.rescale)
    mean, std = (np.array(v, dtype=np.float32) * scale for v in (VALUES.mean, VALUES.std))
    uint8_rows = processor_rows(frames, 14, 2, 2).reshape(-1, 3, 2 * 14 * 14).astype(np.float32)
    expected = ((uint8_rows - mean[None, :, None]) / std[None, :, None]).reshape(rows.shape)
    assert rows.dtype == np.float32 and np.array_equal(rows, expected)


def test_rows_need_rgb_frames_on_the_merge_grid() -> None:
    layout = VideoPatchLayout("Qwen2VLVideoProcessor", 14, 2, 2, QWEN2)
    with pytest.raises(ValueError, match="merge windows"):
        layout.rows(_frames(2, 56, 70))
    with pytest.raises(ValueError, match="uint8"):
        layout.rows(_frames(2, 56, 56).astype(np.float32))


def test_only_frames_at_the_processors_size_are_taken() -> None:
    """Frames the processor would resize again are not laid out here, nor
    fewer than a temporal patch for Qwen3-VL's processor (it refuses them)."""
    qwen2 = VideoPatchLayout("Qwen2VLVideoProcessor", 14, 2, 2, QWEN2)
    assert qwen2.takes(3, 112, 196) and qwen2.takes(1, 112, 196)
    assert not qwen2.takes(3, 120, 200), "not on the grid: the processor resizes them"
    assert not qwen2.takes(3, 1120, 1960), "over the budget: the processor downsizes them"
    qwen3 = VideoPatchLayout("Qwen3VLVideoProcessor", 16, 2, 2, QWEN3)
    assert qwen3.takes(4, 128, 160) and not qwen3.takes(1, 128, 160)


def test_covered_video_processors_get_a_layout_named_by_every_setting() -> None:
    """Qwen2-VL's and Qwen3-VL's video processors get one; its identity
    changes with the processor, the grid, the resize and the values; a
    processor that samples again, another processor, a grid off the resize
    or a normalisation pixelwire does not make get none."""
    layout = video_patch_layout(QWEN2_CONFIG, QWEN2, device_normalize=True)
    assert layout is not None and layout.normalisation is None
    assert layout.identity == video_identity("Qwen2VLVideoProcessor", 14, 2, 2, QWEN2.identity, None)
    floats = video_patch_layout(QWEN2_CONFIG, QWEN2, device_normalize=False)
    assert floats is not None and floats.normalisation == VALUES
    qwen3 = video_patch_layout(
        {
            **QWEN2_CONFIG,
            "video_processor_type": "Qwen3VLVideoProcessor",
            "patch_size": 16,
            "do_sample_frames": True,
        },
        QWEN3,
        device_normalize=True,
    )
    assert qwen3 is not None, "vLLM tells Qwen3-VL's processor per call whether it samples"
    identities = {
        layout.identity,
        floats.identity,
        qwen3.identity,
        VideoPatchLayout("Qwen2VLVideoProcessor", 14, 3, 2, QWEN2).identity,
        VideoPatchLayout(
            "Qwen2VLVideoProcessor", 14, 2, 2, SmartPolicy(factor=28, min_pixels=1, max_pixels=50176)
        ).identity,
        VideoPatchLayout(
            "Qwen2VLVideoProcessor",
            14,
            2,
            2,
            QWEN2,
            Normalisation("torchvision", CLIP_MEAN, CLIP_STD, 1 / 256),
        ).identity,
    }
    assert len(identities) == 6
    assert (
        video_patch_layout({**QWEN2_CONFIG, "do_sample_frames": True}, QWEN2, device_normalize=True) is None
    )
    assert (
        video_patch_layout(
            {**QWEN2_CONFIG, "video_processor_type": "LlavaOnevisionVideoProcessor"},
            QWEN2,
            device_normalize=True,
        )
        is None
    )
    assert video_patch_layout({**QWEN2_CONFIG, "patch_size": 16}, QWEN2, device_normalize=True) is None
    assert video_patch_layout(QWEN2_CONFIG, QWEN3, device_normalize=True) is None, (
        "a per-video resize for Qwen2-VL"
    )
    assert video_patch_layout({**QWEN2_CONFIG, "do_normalize": False}, QWEN2, device_normalize=False) is None
    assert video_patch_layout(QWEN2_CONFIG, None, device_normalize=True) is None
