"""How a video is sampled, as vLLM's ``VideoMediaIO`` reads its settings:
``--media-io-kwargs '{"video": {...}}'`` (merged with a request's
``media_io_kwargs``) and the loader vLLM picks for the model's video
processor. One :class:`VideoSampling` is what the frontend samples with and
what the worker checks a descriptor's frames against."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from pixelwire import config
from pixelwire.model_files import video_processor_config
from pixelwire.resize.registry import VIDEO_PROCESSORS
from pixelwire.video.loaders import LOADERS

# Options each loader's frame sampling reads (beyond num_frames and fps).
_LOADER_OPTIONS = {
    "opencv": frozenset(),
    "qwen2_vl": frozenset({"min_frames", "max_frames", "temporal_patch_size"}),
    "qwen3_vl": frozenset({"min_frames", "max_frames"}),
}
# Options vLLM's loaders take that change nothing pixelwire reproduces:
# max_duration is read by the dynamic loaders only; backend and
# frame_recovery are checked to be vLLM's defaults.
_IGNORED = frozenset({"max_duration"})


class NotReproduced(ValueError):
    """Video settings pixelwire does not sample or decode as vLLM would: the
    video goes to vLLM's own loader instead."""


@dataclass(frozen=True)
class VideoSampling:
    """A loader (``opencv``, ``qwen2_vl``, ``qwen3_vl``), its ``num_frames``
    and ``fps`` (None: the loader's default) and its own options."""

    loader: str = "opencv"
    num_frames: int = config.VIDEO_NUM_FRAMES
    fps: float | None = None
    loader_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_video_kwargs(cls, video_kwargs: dict[str, Any], loader: str) -> VideoSampling:
        """What vLLM's ``VideoMediaIO(**video_kwargs)`` samples with when it
        would pick ``loader`` (``video_backend`` in the kwargs wins, as in
        vLLM). Raises :class:`NotReproduced` for a loader, decoding backend
        or option pixelwire does not reproduce."""
        kwargs = dict(video_kwargs)
        loader = kwargs.pop("video_backend", None) or loader
        if loader not in LOADERS:
            raise NotReproduced(
                f"the {loader!r} video loader is vLLM's own (pixelwire has {sorted(LOADERS)})"
            )
        if kwargs.pop("backend", "opencv") != "opencv" or kwargs.pop("frame_recovery", False):
            raise NotReproduced("pixelwire reproduces vLLM's opencv decoding without frame_recovery only")
        num_frames = kwargs.pop("num_frames", config.VIDEO_NUM_FRAMES)
        fps = kwargs.pop("fps", None)
        if isinstance(num_frames, bool) or not isinstance(num_frames, int):
            raise NotReproduced(f"num_frames must be an integer, not {num_frames!r}")
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, (int, float))):
            raise NotReproduced(f"fps must be a number, not {fps!r}")
        for name in _IGNORED:
            kwargs.pop(name, None)
        unknown = set(kwargs) - _LOADER_OPTIONS[loader]
        if unknown:
            raise NotReproduced(
                f"video options {sorted(unknown)} are not read by pixelwire's {loader} sampling"
            )
        # The loader's default fps, spelt out: a descriptor records what was used.
        return cls(loader, num_frames, float(LOADERS[loader].default_fps if fps is None else fps), kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form a descriptor records."""
        return {"loader": self.loader, "num_frames": self.num_frames, "fps": self.fps, **self.loader_kwargs}


def model_video_loader(model: str | os.PathLike[str]) -> str | None:
    """The loader vLLM samples ``model``'s videos with, from its video
    processor's type, when it is one pixelwire reproduces; None otherwise,
    or when the model's files name no video processor (pixelwire cannot
    tell which loader vLLM would pick)."""
    config = video_processor_config(str(model))
    name = config.get("video_processor_type") if config is not None else None
    processor = VIDEO_PROCESSORS.get(name) if isinstance(name, str) else None
    return processor.loader if processor is not None else None
