"""Which frames a vLLM video loader samples, as vLLM 0.32 computes them
(``compute_frames_index_to_sample`` and ``_prepare_source`` of the loaders
in ``vllm/multimodal/video.py``), written out here so the product does not
import vLLM. ``tests/e2e/test_video_parity.py`` checks them against vLLM's
own classmethods over a grid."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class SourceMetadata:
    """vLLM's ``VideoSourceMetadata``: the header frame count, the stream's
    fps (0 when unknown) and ``total_frames_num / original_fps``."""

    total_frames_num: int
    original_fps: float
    duration: float

    @classmethod
    def from_stream(cls, frame_count: int, fps: float) -> SourceMetadata:
        duration = frame_count / fps if fps > 0 else 0
        return cls(frame_count, fps, duration)


class Loader(Protocol):
    """One of vLLM's video loaders, as far as sampling goes."""

    name: str
    # ``load_bytes``'s default ``fps`` for this loader.
    default_fps: float

    def prepare_source(self, source: SourceMetadata) -> SourceMetadata: ...

    def frame_indices(
        self, source: SourceMetadata, num_frames: int, fps: float, **kwargs: Any
    ) -> list[int]: ...


class Uniform:
    """``opencv``: ``num_frames`` uniformly over the video, or one frame
    every ``1/fps`` seconds, whichever is fewer; every frame if that is all
    of them."""

    name = "opencv"
    default_fps: float = -1

    def prepare_source(self, source: SourceMetadata) -> SourceMetadata:
        return source

    def frame_indices(self, source: SourceMetadata, num_frames: int, fps: float, **kwargs: Any) -> list[int]:
        total = source.total_frames_num
        count = total
        if num_frames > 0:
            count = min(num_frames, total)
        if fps > 0:
            count = min(count, math.floor(source.duration * fps))
        count = max(1, count)
        if count == total:
            return list(range(count))
        indices: list[int] = np.linspace(0, total - 1, count, dtype=int).tolist()
        return indices


class Qwen3VL(Uniform):
    """``qwen3_vl``: ``total / original_fps * fps`` frames (fps capped at
    30), clamped to ``[min_frames, max_frames]`` (4 and 768) and the frame
    count, at rounded linspace positions; an unknown source fps counts as 24
    (HF's Qwen3VLVideoProcessor), also in the metadata. ``num_frames`` is
    ignored."""

    name = "qwen3_vl"
    default_fps: float = 2
    max_frames = 768
    max_fps = 30

    def prepare_source(self, source: SourceMetadata) -> SourceMetadata:
        if source.original_fps > 0:
            return source
        return SourceMetadata(source.total_frames_num, 24.0, source.duration)

    def frame_indices(self, source: SourceMetadata, num_frames: int, fps: float, **kwargs: Any) -> list[int]:
        source = self.prepare_source(source)
        total = source.total_frames_num
        fps = min(fps, self.max_fps)
        min_frames = kwargs.get("min_frames", 4)
        max_frames = min(kwargs.get("max_frames", self.max_frames), self.max_frames)
        count = int(total / source.original_fps * fps)
        count = min(max(count, min_frames), max_frames, total)
        indices: list[int] = np.linspace(0, total - 1, count).round().astype(int).tolist()
        return indices


def torch_arange_float32(total: int, count: int) -> npt.NDArray[np.float32]:
    """``torch.arange(0, total, total / count)`` (float32) on the CPU, value
    for value, without torch. ATen fills it in runs of 16: two 8-lane
    vectors, each from its first value rounded to float32 plus ``lane *
    step`` in double, rounded again; the values after the last full run
    are ``index * step`` rounded once. (Checked against torch over 199,002
    (total, count) pairs: tests/e2e/test_video_parity.py checks the
    indices.)"""
    step = total / count
    size = math.ceil(total / step)
    index = np.arange(size)
    lane = index % 8
    first = ((index - lane) * step).astype(np.float32).astype(np.float64)
    vector = (first + lane * step).astype(np.float32)
    scalar = (index * step).astype(np.float32)
    return np.where(index < size // 16 * 16, vector, scalar)


class Qwen2VL(Uniform):
    """``qwen2_vl`` (Qwen2-VL and Qwen2.5-VL): ``total / original_fps * fps``
    frames (fps capped at 30), clamped to ``[min_frames, max_frames]`` (4 and
    768) and the frame count, floored to a multiple of
    ``temporal_patch_size`` (2), at ``torch.arange(0, total, total / n)``
    truncated to int and clamped to the last frame, as transformers' float32
    index math. An unknown source fps is a ``ValueError``; ``num_frames`` is
    ignored."""

    name = "qwen2_vl"
    default_fps: float = 2
    max_frames = 768
    max_fps = 30

    def frame_indices(self, source: SourceMetadata, num_frames: int, fps: float, **kwargs: Any) -> list[int]:
        total = source.total_frames_num
        temporal_patch_size = kwargs.get("temporal_patch_size", 2)
        min_frames = kwargs.get("min_frames", 4)
        max_frames = min(kwargs.get("max_frames", self.max_frames), self.max_frames)
        if source.original_fps <= 0:
            raise ValueError("Qwen2-VL video sampling needs a known source fps, but the container reported 0")
        max_frames = math.floor(min(max_frames, total) / temporal_patch_size) * temporal_patch_size
        count = total / source.original_fps * min(fps, self.max_fps)
        count = min(max(count, min_frames), max_frames, total)
        count = math.floor(count / temporal_patch_size) * temporal_patch_size
        if count <= 0:
            raise ValueError(
                f"Qwen2-VL samples frames in groups of {temporal_patch_size} (temporal_patch_size): "
                f"a video of {total} frame(s) has none to sample"
            )
        values = torch_arange_float32(total, count).astype(np.int32)
        indices: list[int] = np.minimum(values, total - 1).tolist()
        return indices


LOADERS: dict[str, Loader] = {loader.name: loader for loader in (Uniform(), Qwen2VL(), Qwen3VL())}
