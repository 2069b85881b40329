"""Processed videos: a video handed to vLLM's engine as what its video
processor would make of vLLM's own sampled frames (``pixel_values_videos``
and ``video_grid_thw``), so that the API server never calls that processor
for it.

Covered: the video processors of the models :mod:`pixelwire.processed`
covers, transformers' ``Qwen2VLVideoProcessor`` (Qwen2-VL, Qwen2.5-VL) and
``Qwen3VLVideoProcessor`` (Qwen3-VL), which lay a video out as its images
are laid out, a temporal patch of consecutive frames in each row
(``[C][T][P][P]``) instead of one picture repeated, the last group filled
by repeating the last frame. The frames are pixelwire's own (sampled
exactly as vLLM's loader samples, :mod:`pixelwire.video`), resized exactly
as the video processor resizes them (:mod:`pixelwire.resize`): the
processor's resize then leaves them as they are, and its output is their
bytes laid out (uint8, vLLM's device normalisation) or those bytes'
float32 normalised values (:class:`~pixelwire.processed.Normalisation`,
the image processors' torchvision arithmetic, which the video processors
share). The frames travel as frames (a video's rows are its frames' bytes
in another order, so they cost what the frames cost); the rows are laid
out at the worker in the one pass that takes them out of its memory
(:mod:`pixelwire.vllm.processed_inputs`).

:func:`video_identity` names such an output: the plug-in computes it from
the model it serves and from the video processor its vLLM would run, and a
video goes to vLLM as rows only when the two are equal (otherwise its
frames go to the processor, as any video's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pixelwire._native import video_patch_rows
from pixelwire.processed import CHANNELS, NativeNormalize, Normalisation, normalisation
from pixelwire.resize import ResizePolicy
from pixelwire.resize.families.smart import SmartPolicy

# The video processors whose output these rows are (transformers' names,
# as video_processor_type and the live processor's class give them).
COVERED_VIDEO_PROCESSORS = ("Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor")
# Their class defaults for the patch grid (both).
_DEFAULT_GRID = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}
_QWEN3_GRID = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}


def video_identity(
    processor: str, patch: int, temporal: int, merge: int, resize_identity: str, values: Normalisation | None
) -> str:
    """What names a processed video's form: ``processor``'s patch rows of a
    ``patch``-pixel grid, ``temporal`` frames a row, ``merge`` windows, of
    frames resized by the policy ``resize_identity`` and not sampled again
    by the processor; uint8 (the frames' bytes) or the float32 values of
    ``values``."""
    kind = "uint8" if values is None else values.identity
    return (
        f"{processor}_patches:{kind}:patch={patch}:temporal={temporal}:merge={merge}:"
        f"resample=off:{resize_identity}"
    )


@dataclass(frozen=True)
class VideoPatchLayout:
    """How a model's video processor turns resized frames into its rows."""

    processor: str
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    resize: SmartPolicy
    # None: uint8 rows (vLLM normalises on the device); else float32 rows.
    normalisation: Normalisation | None = None

    @property
    def identity(self) -> str:
        grid = (self.patch_size, self.temporal_patch_size, self.merge_size)
        return video_identity(self.processor, *grid, self.resize.identity, self.normalisation)

    @property
    def native_normalize(self) -> NativeNormalize | None:
        """The native ``normalize=`` (None: uint8 rows)."""
        return None if self.normalisation is None else self.normalisation.native

    def takes(self, frames: int, height: int, width: int) -> bool:
        """Whether ``frames`` frames of (height, width) are at the size the
        processor resizes them to (its resize then leaves them as they are)
        and at least one temporal patch where the processor refuses fewer
        (Qwen3-VL's): only such frames are laid out here."""
        if self.resize.video_frames and frames < self.temporal_patch_size:
            return False
        if frames < 1:
            return False
        return self.resize.target(height, width, frames) == (height, width)

    def grid_thw(self, frames: int, height: int, width: int) -> list[int]:
        """``video_grid_thw`` of ``frames`` frames of (height, width)."""
        groups = -(-frames // self.temporal_patch_size)
        return [groups, height // self.patch_size, width // self.patch_size]

    def rows(self, frames: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """The processor's ``pixel_values_videos`` of ``frames`` (T, H, W, 3
        uint8, at the processor's size), with their ``video_grid_thw``:
        each row a merge window's patch over ``temporal_patch_size``
        consecutive frames, channel-major, the last group filled with the
        last frame; uint8, or the float32 values of :attr:`normalisation`.
        Laid out natively in one pass (``video_patch_rows``,
        ``PatchGrid::write_video`` in ``src/patches.rs``), the GIL
        released, the float values made in the same pass."""
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != CHANNELS:
            raise ValueError(f"video rows need (T, H, W, 3) uint8 frames, not {frames.dtype} {frames.shape}")
        count, height, width, _ = frames.shape
        p, t, m = self.patch_size, self.temporal_patch_size, self.merge_size
        if height % (p * m) or width % (p * m) or count < 1:
            raise ValueError(
                f"{count} frames of {height}x{width} do not divide into {p * m}-pixel merge windows"
            )
        joined = video_patch_rows(np.ascontiguousarray(frames), (p, t, m), normalize=self.native_normalize)
        rows = joined.reshape(joined.shape[0], -1)
        return (rows if self.normalisation is None else rows.view(np.float32)), self.grid_thw(
            count, height, width
        )


def video_patch_layout(
    config: Mapping[str, Any] | None, policy: ResizePolicy | None, *, device_normalize: bool
) -> VideoPatchLayout | None:
    """The layout of the video processor of ``config`` (its saved config,
    or a live one's ``to_dict()``) whose frames' resize is ``policy``, in a
    vLLM that normalises on the device (``device_normalize``: uint8 rows)
    or not (float32 rows); None where pixelwire does not make its rows
    (another processor or backend, a processor that samples frames again,
    a resize or normalisation it does not reproduce)."""
    if config is None or not isinstance(policy, SmartPolicy) or policy.kernel != "torchvision":
        return None
    name = str(config.get("video_processor_type") or "").removesuffix("Fast")
    if name not in COVERED_VIDEO_PROCESSORS:
        return None
    # Qwen2-VL's processor resizes each frame as an image (no temporal
    # factor); Qwen3-VL's sizes the whole video (SmartVideoPolicy).
    if policy.video_frames != (name == "Qwen3VLVideoProcessor") or (
        not policy.video_frames and policy.temporal_factor
    ):
        return None
    if config.get("do_resize", True) is False:
        return None
    # Qwen2-VL's processor samples again when its config says so; vLLM
    # tells Qwen3-VL's per call (the seam checks that call).
    if name == "Qwen2VLVideoProcessor" and config.get("do_sample_frames") is True:
        return None
    defaults = _QWEN3_GRID if name == "Qwen3VLVideoProcessor" else _DEFAULT_GRID
    grid = [config.get(key, value) for key, value in defaults.items()]
    if not all(type(value) is int and 0 < value <= 1024 for value in grid):
        return None
    patch, temporal, merge = grid
    if patch * merge != policy.factor:
        return None
    if device_normalize:
        return VideoPatchLayout(name, patch, temporal, merge, policy)
    values = normalisation(config, "torchvision")
    return None if values is None else VideoPatchLayout(name, patch, temporal, merge, policy, values)
