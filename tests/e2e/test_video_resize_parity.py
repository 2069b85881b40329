"""Model-aware resize of video frames against transformers 5.19's own video
processors: for Qwen2VLVideoProcessor (per frame) and Qwen3VLVideoProcessor
(per video: its budget counts the frames), the processor's
``pixel_values_videos`` and ``video_grid_thw`` on pixelwire's resized frames
(``decode_video(resize=...)``) are ``torch.equal`` to its outputs on the
full-size frames vLLM's own loader returns, called as vLLM calls it (the
loader's metadata; Qwen3-VL's ``do_sample_frames`` from it).

Clips: a moving pattern, an odd 853x480, a portrait (rotated) one, a
camera-like scene and two made here (tiny 30x18, portrait odd 181x321);
frame counts from one (under the temporal patch: the processor fails on
both) to every frame (vLLM has the processor sample again, with its own
fps and bounds); budgets that scale up, keep and force a downscale. Each policy is read back from the
processor's saved config. Processor-level only: no vLLM server."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pixelwire
from pixelwire.resize import ResizePolicy, video_resize_policy
from pixelwire.resize.families.smart import SmartPolicy

import video_clips as clips_module

pytestmark = pytest.mark.vllm

CLIPS = ("h264_high_bframes.mp4", "h264_odd_853x480_444.mp4", "h264_rotated_90.mp4", "h264_scene.mp4")
# Made here: a tiny clip (under Qwen3-VL's factor: scaled up first) and an
# odd-sized portrait one.
EXTRA = {
    "tiny_30x18.mp4": ["-f", "lavfi", "-i", "testsrc2=size=30x18:rate=25", "-frames:v", "10"],
    "portrait_181x321.mp4": ["-f", "lavfi", "-i", "testsrc2=size=181x321:rate=25", "-frames:v", "12"],
}
for _args in EXTRA.values():
    _args += ["-c:v", "libx264", "-pix_fmt", "yuv444p"]

# (id, class, constructor kwargs)
PROCESSORS = [
    ("qwen2-default", "Qwen2VLVideoProcessor", {}),
    ("qwen2-downscale", "Qwen2VLVideoProcessor", {"min_pixels": 3136, "max_pixels": 12544}),
    ("qwen3-default", "Qwen3VLVideoProcessor", {}),
    ("qwen3-downscale", "Qwen3VLVideoProcessor", {"size": {"shortest_edge": 4096, "longest_edge": 200000}}),
    (
        # The per-frame pixel cap binding: 64 tokens of 32 x 32 a frame.
        "qwen3-capped",
        "Qwen3VLVideoProcessor",
        {
            "size": {"shortest_edge": 4096, "longest_edge": 786432},
            "cap_pixels_per_frame": True,
            "max_video_tokens": 64,
        },
    ),
    (
        # Also its own sampling of a whole video: 4 fps, at least 2 frames.
        "qwen3-patch14-bilinear-4fps",
        "Qwen3VLVideoProcessor",
        {
            "patch_size": 14,
            "resample": 2,
            "size": {"shortest_edge": 3136, "longest_edge": 401408},
            "fps": 4,
            "min_frames": 2,
        },
    ),
]
# (loader, kwargs): 4 frames (qwen3_vl at 2 fps), an odd count, five, one,
# and every frame of the clip (do_sample_frames).
SAMPLINGS = [
    ("qwen3_vl", {}),
    ("qwen3_vl", {"fps": 10}),
    ("qwen2_vl", {}),
    ("opencv", {"num_frames": 5}),
    ("opencv", {"num_frames": 1}),
    ("opencv", {"num_frames": 32}),
]


@pytest.fixture(scope="module")
def clips(video_clips: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    made = clips_module.make_all(EXTRA, tmp_path_factory.mktemp("resize_clips"))
    return {**{name: video_clips[name] for name in CLIPS}, **made}


def _processor(cls: str, kwargs: dict[str, Any]) -> Any:
    import transformers

    return getattr(transformers, cls)(**kwargs)


def _policy(processor: Any, folder: Path) -> ResizePolicy | None:
    """The policy of the processor's config as a model folder holds it."""
    folder.mkdir()
    (folder / "video_preprocessor_config.json").write_text(processor.to_json_string())
    return video_resize_policy(folder)


def _outputs(processor: Any, frames: np.ndarray, metadata: dict[str, Any]) -> dict[str, Any] | str:
    """The processor's outputs as vLLM gets them, or its error."""
    import warnings

    from transformers.video_utils import VideoMetadata

    kwargs: dict[str, Any] = {}
    if type(processor).__name__ == "Qwen3VLVideoProcessor":
        # vLLM's Qwen3-VL processing: the loader's do_sample_frames.
        kwargs["do_sample_frames"] = metadata["do_sample_frames"]
    video_metadata = VideoMetadata(**{k: v for k, v in metadata.items() if k != "do_sample_frames"})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = processor(videos=[frames], video_metadata=[video_metadata], return_tensors="pt", **kwargs)
    except ValueError as error:
        return f"ValueError: {error}"
    return {key: out[key] for key in ("pixel_values_videos", "video_grid_thw")}


def _equal(a: dict[str, Any] | str, b: dict[str, Any] | str) -> bool:
    import torch

    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return all(torch.equal(a[key], b[key]) for key in a)


def _vllm_load(data: bytes, loader: str, kwargs: dict[str, Any]) -> tuple[np.ndarray, dict[str, Any]]:
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    return VIDEO_LOADER_REGISTRY.load(loader).load_bytes(data, **kwargs)


@pytest.mark.parametrize(("setting", "cls", "kwargs"), PROCESSORS, ids=[p[0] for p in PROCESSORS])
def test_processor_outputs_on_resized_frames_equal_its_outputs_on_vllms_frames(
    setting: str, cls: str, kwargs: dict[str, Any], clips: dict[str, bytes], tmp_path: Path
) -> None:
    """Every clip x sampling: pixelwire's frames (resized, or kept at their
    size where the processor's size is not known here) give the processor's
    outputs on vLLM's full-size frames exactly; and most cases do ship
    smaller or resized frames (the resize is not vacuous)."""
    processor = _processor(cls, kwargs)
    policy = _policy(processor, tmp_path / "model")
    assert policy is not None and policy.video_frames == (cls == "Qwen3VLVideoProcessor")
    failures, resized = [], 0
    for name, data in clips.items():
        for loader, sampling in SAMPLINGS:
            full, metadata = _vllm_load(data, loader, sampling)
            frames, ours = pixelwire.decode_video(data, loader=loader, resize=policy, **sampling)
            assert ours == metadata, (name, loader, sampling)
            resized += frames.shape != full.shape
            expected, got = _outputs(processor, full, metadata), _outputs(processor, frames, ours)
            if not _equal(got, expected):
                failures.append(f"{name} {loader} {sampling}: {full.shape} -> {frames.shape}")
    assert not failures, failures
    print(f"\n  {setting}: {resized} of {len(clips) * len(SAMPLINGS)} videos shipped resized")
    assert resized >= len(clips) * 3


# (what is wrong, the processor's pixel budget, the wrong policy): each
# budget puts the 9 frames of 320x240 where that mistake changes the size
# (a temporal patch of one counts 9 frames in the rounding, not 8: over
# 700000 pixels, where 8 are not).
WRONG = [
    ("max_pixels x 2", 200000, lambda p: dataclasses.replace(p, max_pixels=p.max_pixels * 2)),
    ("temporal patch 1", 700000, lambda p: dataclasses.replace(p, temporal_factor=1)),
    (
        "per frame",
        200000,
        lambda p: SmartPolicy(
            filter=p.filter,
            kernel=p.kernel,
            factor=p.factor,
            min_pixels=p.min_pixels,
            max_pixels=p.max_pixels,
        ),
    ),
]


@pytest.mark.parametrize(("wrong_name", "budget", "mistake"), WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_setting_gives_other_outputs(
    wrong_name: str, budget: int, mistake: Any, clips: dict[str, bytes], tmp_path: Path
) -> None:
    """The comparison catches a wrong policy: Qwen3-VL frames resized with a
    doubled pixel budget, a temporal patch of one, or the budget counted per
    frame (Qwen2-VL's rule) get another size, which the processor resizes
    again: its outputs are no longer vLLM's."""
    processor = _processor("Qwen3VLVideoProcessor", {"size": {"shortest_edge": 4096, "longest_edge": budget}})
    policy = _policy(processor, tmp_path / "model")
    assert policy is not None
    data = clips["h264_high_bframes.mp4"]
    full, metadata = _vllm_load(data, "qwen3_vl", {"fps": 10})
    assert len(metadata["frames_indices"]) == 9
    expected = _outputs(processor, full, metadata)
    right, _ = pixelwire.decode_video(data, loader="qwen3_vl", fps=10, resize=policy)
    assert _equal(_outputs(processor, right, metadata), expected)
    frames, _ = pixelwire.decode_video(data, loader="qwen3_vl", fps=10, resize=mistake(policy))
    assert frames.shape != right.shape
    assert not _equal(_outputs(processor, frames, metadata), expected)


def test_the_policy_is_the_saved_configs(tmp_path: Path) -> None:
    """A Qwen3VLVideoProcessor saved with save_pretrained (transformers'
    own file layout) reads back as the policy of its settings."""
    processor = _processor("Qwen3VLVideoProcessor", {"size": {"shortest_edge": 4096, "longest_edge": 200000}})
    processor.save_pretrained(tmp_path)
    saved = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert saved.get("video_processor_type") == "Qwen3VLVideoProcessor" or "video_processor" in saved
    policy = video_resize_policy(tmp_path)
    assert policy is not None
    settings = (policy.factor, policy.min_pixels, policy.max_pixels, policy.temporal_factor)
    assert settings == (32, 4096, 200000, 2)
