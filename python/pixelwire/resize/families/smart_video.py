"""The ``smart`` family sized per video: Qwen3-VL's video processor
(``Qwen3VLVideoProcessor``), whose ``smart_resize`` counts the video's
frames in its pixel budget (not the temporal patch), so the size of each
frame depends on how many the processor resizes; and how it samples a
video given whole (vLLM's ``do_sample_frames``), which decides that count."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from pixelwire.resize.families.smart import SmartPolicy, temporal_smart_resize
from pixelwire.resize.reading import RESAMPLE, NoPolicy, positive

_PROCESSOR = "Qwen3VLVideoProcessor"
# Its class defaults, which a config without them keeps.
_QWEN3_VL_VIDEO_DEFAULTS: dict[str, Any] = {
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


@dataclass(frozen=True, kw_only=True)
class SmartVideoPolicy(SmartPolicy):
    """A pixel budget over a whole video's frames."""

    video_frames: ClassVar[bool] = True
    # How the processor samples a video given whole: its fps (0: not
    # reproduced) and frame bounds.
    sample_fps: float = 0.0
    min_frames: int = 0
    max_frames: int = 0
    # Its cap_pixels_per_frame: the tokens a frame may take
    # (max_video_tokens); 0 without the cap.
    frame_tokens: int = 0

    @property
    def shape(self) -> str:
        shape = f"{super().shape}:per_video:sample={self.sample_fps:g}fps/{self.min_frames}-{self.max_frames}"
        return shape + (f":cap={self.frame_tokens}" if self.frame_tokens else "")

    def target(self, height: int, width: int, num_frames: int | None = None) -> tuple[int, int]:
        """:meth:`ResizePolicy.target` of frames of a ``num_frames`` video;
        fewer frames than the temporal patch keep their size (the processor
        fails on them, as it will on vLLM's own)."""
        if num_frames is not None and num_frames < self.temporal_factor:
            return height, width
        return super().target(height, width, num_frames)

    def video_target(
        self, height: int, width: int, frames: int, total_frames: int, fps: float = 0.0
    ) -> tuple[int, int]:
        """The size depends on the count the processor resizes: when the
        frames are all of the video's, vLLM has the processor sample them
        again (``do_sample_frames``), so it is the count that sampling keeps
        (:meth:`processor_sampled_frames`); where that is not known they
        keep their size."""
        if frames == total_frames:
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
        if num_frames is None:
            raise ValueError(f"{self.identity} sizes a whole video: give its num_frames")
        budget = self.max_pixels
        if self.frame_tokens:
            # cap_pixels_per_frame: a frame's share is the token cap or an
            # even share of the budget, at least 1.05 x the minimum.
            cap = self.frame_tokens * self.factor * self.factor
            per_frame = max(min(cap, self.max_pixels // num_frames), int(self.min_pixels * 1.05))
            budget = per_frame * num_frames
        return temporal_smart_resize(
            num_frames, height, width, self.factor, self.temporal_factor, self.min_pixels, budget
        )


def read_qwen3_vl_video(config: Mapping[str, Any]) -> SmartVideoPolicy:
    """The per-video resize of a ``Qwen3VLVideoProcessor`` config (its class
    defaults where the config has none; a ``size`` replaces the default
    whole, as the processor takes it)."""
    settings = {**_QWEN3_VL_VIDEO_DEFAULTS, **config}
    if settings.get("do_resize", True) is False:
        raise NoPolicy(f"{_PROCESSOR} does not resize (do_resize is false)")
    if any(key in config for key in ("min_pixels", "max_pixels")):
        # The processor has no such aliases: its budget is size's alone.
        raise NoPolicy(f"{_PROCESSOR} takes its pixel budget from size, not min_pixels/max_pixels")
    resample = settings["resample"]
    filter_ = RESAMPLE.get(resample) if isinstance(resample, int) else None
    if filter_ is None:
        raise NoPolicy(f"{_PROCESSOR}: resample {resample!r} is not bicubic or bilinear")
    size = settings["size"] if isinstance(settings["size"], Mapping) else {}
    patch, merge, temporal = (settings[key] for key in ("patch_size", "merge_size", "temporal_patch_size"))
    low, high = size.get("shortest_edge", 0), size.get("longest_edge", 0)
    if not all(positive(value) for value in (patch, merge, temporal, low, high)):
        raise NoPolicy(
            f"{_PROCESSOR}: patch, merge and temporal sizes and size's shortest/longest_edge must be "
            "positive integers"
        )
    # Its sampling of a whole video: fps frames a second within
    # [min_frames, max_frames]; not reproduced with a fixed num_frames
    # (which it refuses beside fps) or without an fps.
    tokens = settings["max_video_tokens"] if settings["cap_pixels_per_frame"] else 0
    if settings["cap_pixels_per_frame"] and not positive(tokens):
        raise NoPolicy(f"{_PROCESSOR}: max_video_tokens {tokens!r} is not a positive integer")
    fps, least, most = settings["fps"], settings["min_frames"], settings["max_frames"]
    samples = settings["num_frames"] is None and positive(least) and positive(most)
    samples = samples and isinstance(fps, (int, float)) and not isinstance(fps, bool) and fps > 0
    return SmartVideoPolicy(
        filter=filter_,
        factor=int(patch) * int(merge),
        min_pixels=int(low),
        max_pixels=int(high),
        temporal_factor=int(temporal),
        sample_fps=float(fps) if samples else 0.0,
        min_frames=int(least) if samples else 0,
        max_frames=int(most) if samples else 0,
        frame_tokens=int(tokens),
    )
