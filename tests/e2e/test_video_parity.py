"""decode_video against vLLM 0.32's own video loaders (the ``opencv``
decoding backend, i.e. the opencv-python-headless 5.1 in vLLM's venv):
frames byte for byte and metadata equal on every test video (codecs x
containers, B-frames and open GOP, an odd size, 10-bit, full range and
BT.709, variable frame rate, rotation, truncated and corrupt streams), and
the sampled indices equal to vLLM's ``compute_frames_index_to_sample`` over
a grid of sources and targets (opencv, qwen2_vl, qwen3_vl). The max |d| of every clip is printed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import pixelwire
from pixelwire.video import LOADERS, SourceMetadata

import video_clips

pytestmark = pytest.mark.vllm

# (loader, keyword arguments) as a request's media_io_kwargs would give them.
SETTINGS = [
    ("opencv", {"num_frames": 32}),
    ("opencv", {"num_frames": 5}),
    ("opencv", {"num_frames": -1, "fps": 10}),
    ("qwen2_vl", {"num_frames": 32}),
    ("qwen2_vl", {"num_frames": -1, "fps": 10, "min_frames": 2}),
    ("qwen3_vl", {"num_frames": 32}),
    ("qwen3_vl", {"num_frames": -1, "fps": 4, "min_frames": 2}),
]


# vLLM bounds no duration; pixelwire refuses a thousand-hour claim by default
# (max_seconds, tests/test_video.py), so the comparison lifts that bound.
LIMITS = pixelwire.VideoLimits(max_seconds=10**7)


def _vllm_load(data: bytes, loader: str, kwargs: dict) -> tuple[np.ndarray, dict]:
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    return VIDEO_LOADER_REGISTRY.load(loader).load_bytes(data, **kwargs)


def _damaged(clips: dict[str, bytes]) -> dict[str, bytes]:
    """Truncated and corrupt versions of two clips, and one that claims a
    thousand hours."""
    out = {}
    for name in ("h264_open_gop.mkv", "hevc.mp4"):
        data = clips[name]
        out[f"truncated_{name}"] = data[: len(data) * 6 // 10]
        corrupt = bytearray(data)
        at = len(data) // 3
        corrupt[at : at + 2000] = np.random.default_rng(1).integers(0, 256, 2000, np.uint8).tobytes()
        out[f"corrupt_{name}"] = bytes(corrupt)
    out["claims_1000_hours.mkv"] = video_clips.claim_duration_mkv(clips["h264_open_gop.mkv"], 3.6e9)
    return out


def test_frames_and_metadata_equal_vllms_on_every_clip(video_clips):
    clips = {**video_clips, **_damaged(video_clips)}
    failures = []
    for name, data in clips.items():
        worst = 0
        for loader, kwargs in SETTINGS:
            try:
                expected, expected_metadata = _vllm_load(data, loader, kwargs)
            except ValueError:
                # vLLM cannot open it ("Could not open video stream"): a
                # clear error here too.
                with pytest.raises(pixelwire.VideoDecodeError):
                    pixelwire.decode_video(data, loader=loader, limits=LIMITS, **kwargs)
                continue
            frames, metadata = pixelwire.decode_video(data, loader=loader, limits=LIMITS, **kwargs)
            if metadata != expected_metadata:
                failures.append(f"{name} {loader} {kwargs}: {metadata} != {expected_metadata}")
            if frames.shape != expected.shape:
                failures.append(f"{name} {loader} {kwargs}: shape {frames.shape} != {expected.shape}")
                continue
            assert frames.flags.c_contiguous and frames.dtype == np.uint8
            if frames.size:
                worst = max(worst, int(np.abs(frames.astype(np.int16) - expected).max()))
        print(f"{name}: max|d| {worst}")
        if worst:
            failures.append(f"{name}: max|d| {worst}")
    assert failures == []


def _grid() -> list[tuple[SourceMetadata, int, float]]:
    cases = []
    totals = (0, 1, 2, 3, 7, 24, 31, 100, 451, 1000, 9001)
    source_fps = (0.0, 0.5, 1.0, 23.976, 25.0, 29.97, 60.0, 120.0)
    num_frames_asked = (-1, 1, 2, 4, 8, 16, 32, 64, 768)
    fps_asked = (-1, 0.5, 1, 2, 2.5, 30, 60)
    for total, original_fps in itertools.product(totals, source_fps):
        for num_frames, fps in itertools.product(num_frames_asked, fps_asked):
            cases.append((SourceMetadata.from_stream(total, original_fps), num_frames, fps))
    # Header durations that do not follow from the count (a wrong header).
    for total, duration in ((100, 0.01), (5, 1000.0), (10**6, 3.0)):
        cases.append((SourceMetadata(total, 25.0, duration), 32, 2))
    return cases


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_frame_indices_equal_vllms_over_a_grid(loader):
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY
    from vllm.multimodal.video_decoders.base import VideoSourceMetadata, VideoTargetMetadata

    theirs = VIDEO_LOADER_REGISTRY.load(loader)
    ours = LOADERS[loader]
    checked = 0
    for source, num_frames, fps in _grid():
        vllm_source = theirs._prepare_source(
            VideoSourceMetadata(source.total_frames_num, source.original_fps, source.duration)
        )
        target = VideoTargetMetadata(num_frames=num_frames, fps=fps, max_duration=300)
        try:
            expected = theirs.compute_frames_index_to_sample(source=vllm_source, target=target)
        except (ZeroDivisionError, ValueError):
            # Where vLLM's sampling fails (a ZeroDivisionError for a video
            # too short to sample), pixelwire refuses with a ValueError (400).
            with pytest.raises(ValueError):
                ours.frame_indices(ours.prepare_source(source), num_frames, fps)
            continue
        got = ours.frame_indices(ours.prepare_source(source), num_frames, fps)
        assert got == expected, (source, num_frames, fps)
        assert tuple(ours.prepare_source(source).__dict__.values()) == tuple(vllm_source)
        checked += 1
    assert checked > 1000


def test_torch_arange_float32_equals_torchs():
    """qwen2_vl's indices come from torch.arange in float32, which ATen fills
    in vector runs: the emulation must agree value for value."""
    import torch

    from pixelwire.video.loaders import torch_arange_float32

    for total in range(2, 40001, 7):
        for count in (2, 4, 6, 8, 16, 32, 34, 64, 100, 128, 256, 300, 512, 766, 768):
            if count <= total:
                expected = torch.arange(0, total, total / count).numpy()
                assert np.array_equal(torch_arange_float32(total, count), expected), (total, count)
