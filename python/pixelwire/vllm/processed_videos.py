"""Processed videos at the worker (:mod:`pixelwire.processed_video` says
what they are): a video pixelwire sampled and resized, from a frontend's
reference or decoded here in worker mode, handed to vLLM's engine as its
video processor's ``pixel_values_videos`` and ``video_grid_thw``, so that
the API server never calls that processor for it.

The carrier (:class:`ProcessedVideo`) is the frames themselves, tagged
with the identity of the rows the plug-in expects for its served model:
vLLM's parser passes an array of frames through untouched, its hasher keys
the item on the signed identity around it, and the metadata beside it
(which Qwen3-VL turns into the prompt's timestamps, and Qwen2.5-VL into
``second_per_grid_ts``) is vLLM's loader's own, used by vLLM's own code.
The seam (:mod:`pixelwire.vllm.processed_inputs`) lays the rows out of the
frames natively where the processor vLLM would run has that identity and
the frames are at its size; otherwise the frames go to the processor, as
any video's do: never other rows.

Qwen2-VL and Qwen2.5-VL's processor (vLLM's base
``_apply_hf_processor_main``) calls the HF processor once for the whole
request: the seam takes the processed videos out of that call and puts
their rows in place. Qwen3-VL's calls it for each video apart, after
computing the video's timestamps and prompt tokens itself: the seam
answers that one call (:func:`answer_video_call`), where vLLM also says
whether the processor would sample the frames again (then it is called).
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from pixelwire import model_files
from pixelwire.media import PROCESSED_VIDEO
from pixelwire.processed import COVERED_MODEL_TYPES
from pixelwire.processed_video import VideoPatchLayout, video_patch_layout
from pixelwire.resize import video_policy_from_config, video_resize_policy
from pixelwire.vllm.served_model import served_model
from pixelwire.vllm.worker_layouts import device_normalises

log = logging.getLogger("pixelwire.vllm")

# vLLM's own settings for every HF call with its device normalisation on:
# the processor leaves the values as bytes (pixelwire's uint8 rows).
_DEVICE_NORMALISE_KWARGS = {"do_normalize": False, "do_rescale": False}
# The scopes of vLLM's HF call that are not the video processor's.
_OTHER_SCOPES = ("videos_kwargs", "images_kwargs", "text_kwargs", "audio_kwargs")


class ProcessedVideo(np.ndarray):
    """A video's frames (T, H, W, 3 uint8) on their way to the seam, with
    ``processor``: the identity of the rows the plug-in would lay out of
    them (:attr:`pixelwire.processed_video.VideoPatchLayout.identity`), and
    ``path``: how they came (``nixl`` or ``url``, the media metrics' path)."""

    processor: str
    path: str


def tagged(frames: Any, layout: VideoPatchLayout | None, path: str = "nixl") -> Any:
    """``frames`` as a processed video's carrier where the served model's
    processor takes them as rows (``layout``); else as they are."""
    if layout is None or not isinstance(frames, np.ndarray) or frames.ndim != 4:
        return frames
    count, height, width = frames.shape[:3]
    if frames.dtype != np.uint8 or not layout.takes(count, height, width):
        return frames
    carrier = frames.view(ProcessedVideo)
    carrier.processor, carrier.path = layout.identity, path
    return carrier


@functools.cache
def worker_video_layout() -> VideoPatchLayout | None:
    """The video layout of the model this vLLM serves (from its files, as
    the frames' resize is), or None where it takes no processed videos."""
    served = served_model(sys.argv)
    if served.model is None or served.trusts_request_kwargs or served.mm_processor_kwargs:
        return None
    try:
        if model_files.model_config(served.model).get("model_type") not in COVERED_MODEL_TYPES:
            return None
        config = model_files.video_processor_config(served.model)
        policy = video_resize_policy(served.model)
        return video_patch_layout(config, policy, device_normalize=device_normalises(sys.argv))
    except (OSError, ValueError):
        return None


def live_video_layout(ctx: Any, video_processor: Any) -> VideoPatchLayout | None:
    """The layout of the live HF ``video_processor`` that vLLM's context
    ``ctx`` calls, with vLLM's resolved settings: None where vLLM passes it
    settings of its own (``--mm-processor-kwargs``) or pixelwire does not
    make its rows."""
    model_config = ctx.model_config
    if video_processor is None:
        return None
    if getattr(model_config.hf_config, "model_type", None) not in COVERED_MODEL_TYPES:
        return None
    on_device = bool(model_config.multimodal_config.mm_device_do_normalize)
    merged = ctx.get_merged_mm_kwargs({})
    if merged != (_DEVICE_NORMALISE_KWARGS if on_device else {}):
        return None
    config = video_processor.to_dict()
    if type(video_processor).__name__ != config.get("video_processor_type"):
        return None  # a subclass (another model's processor): not what the config names
    return video_patch_layout(config, video_policy_from_config(config), device_normalize=on_device)


def video_rows(ctx: Any, layout: VideoPatchLayout, frames: ProcessedVideo) -> tuple[Any, Any]:
    """A processed video's ``pixel_values_videos`` and ``video_grid_thw``
    as vLLM's engine gets its processor's: float rows cast to the model's
    dtype as vLLM casts them (``InputProcessingContext._postprocess_output``)."""
    import torch

    rows, grid = layout.rows(np.asarray(frames))
    if isinstance(frames, ProcessedVideo):
        from pixelwire.vllm.worker_settings import install_metrics  # it imports this module's importer

        install_metrics("pixelwire").handled_medium(PROCESSED_VIDEO.metrics_label, frames.path)
    tensor = torch.from_numpy(rows)
    if tensor.is_floating_point():
        tensor = tensor.to(dtype=ctx.model_config.dtype)
    return tensor, torch.tensor([grid], dtype=torch.int64)


def _single_video(data: Mapping[str, object]) -> Any:
    """The one video of a Qwen3-VL per-video call (``videos=[[frames]]``
    beside its placeholder text), or None."""
    videos = data.get("videos")
    if set(data) - {"text", "videos", "video_metadata"} or not isinstance(videos, list) or len(videos) != 1:
        return None
    (video,) = videos
    if isinstance(video, list) and len(video) == 1:
        (video,) = video
    return video if isinstance(video, ProcessedVideo) else None


def answer_video_call(
    ctx: Any, hf_processor: Any, data: Mapping[str, object], kwargs: Mapping[str, Any]
) -> Any:
    """The outputs of a Qwen3-VL per-video HF call whose video is a
    processed one this vLLM's processor would make the same rows of, and
    does not sample again; None where the processor is to be called."""
    frames = _single_video(data)
    if frames is None:
        return None
    scoped = kwargs.get("videos_kwargs")
    scoped = dict(scoped) if isinstance(scoped, Mapping) else {}
    # What vLLM sets per video: whether the processor samples the frames
    # again (then it does, on the frames), and the fps or count it would.
    if scoped.pop("do_sample_frames", False) is not False:
        return None
    scoped.pop("fps", None), scoped.pop("num_frames", None)
    # The settings the video processor gets: the flat ones and its own
    # scope's (the text's and images' scopes are not its).
    flat = {key: value for key, value in kwargs.items() if key not in _OTHER_SCOPES}
    expected = (
        dict(_DEVICE_NORMALISE_KWARGS) if ctx.model_config.multimodal_config.mm_device_do_normalize else {}
    )
    if {**flat, **scoped} != expected:
        return None
    layout = live_video_layout(ctx, getattr(hf_processor, "video_processor", None))
    if layout is None or layout.identity != frames.processor or not layout.takes(*frames.shape[:3]):
        return None
    from transformers.feature_extraction_utils import BatchFeature

    rows, grid = video_rows(ctx, layout, frames)
    return BatchFeature({"pixel_values_videos": rows, "video_grid_thw": grid})


def split_videos(
    processor: Any, mm_items: Any, hf_kwargs: Mapping[str, object]
) -> tuple[Any, list[Any]] | None:
    """For Qwen2-VL's (and Qwen2.5-VL's) one HF call: ``mm_items`` without
    the processed videos its processor would make the same rows of, and
    each video's place (None: left to the processor; else its frames and
    the layout); None where no video is processed."""
    from vllm.multimodal.parse import MultiModalDataItems, VideoProcessorItems

    videos = mm_items.get("video")
    if not isinstance(videos, VideoProcessorItems) or hf_kwargs:
        return None
    ctx = processor.info.ctx
    places: list[Any] = []
    layout = None
    for index in range(videos.get_count()):
        item = videos.get(index)
        frames = item[0] if isinstance(item, tuple) else item
        if isinstance(frames, ProcessedVideo):
            if layout is None:
                layout = live_video_layout(ctx, processor.info.get_hf_processor().video_processor)
            if layout is not None and layout.identity == frames.processor and layout.takes(*frames.shape[:3]):
                places.append((frames, item[1] if isinstance(item, tuple) else None, layout))
                continue
        places.append(None)
    if all(place is None for place in places):
        return None
    rest = MultiModalDataItems({name: items for name, items in mm_items.items() if name != "video"})
    others = [index for index, place in enumerate(places) if place is None]
    if others:
        metadata = videos.metadata
        kept = [metadata[i] for i in others] if isinstance(metadata, list) else metadata
        rest["video"] = VideoProcessorItems([videos.data[i] for i in others], metadata=kept)
    return rest, places


def splice_videos(processor: Any, out: Any, places: list[Any]) -> None:
    """Puts the processed videos' rows and grids in their places among
    those the processor made of the others (``out``, its output); and,
    where the processor makes it (Qwen2.5-VL's), each one's
    ``second_per_grid_ts``: its temporal patch over the sampled frames'
    fps, from vLLM's loader's metadata as transformers reads it."""
    import torch

    ctx = processor.info.ctx
    made_rows, made_grids = out.get("pixel_values_videos"), out.get("video_grid_thw")
    made_seconds = out.get("second_per_grid_ts")
    made = iter(made_grids.split(1) if made_grids is not None else [])
    made_split = iter(made_rows.split(made_grids.prod(-1).tolist()) if made_grids is not None else [])
    seconds_made = iter(made_seconds if made_seconds is not None else [])
    seconds_here = "second_per_grid_ts" in _output_names(processor)
    rows, grids, seconds = [], [], []
    for place in places:
        if place is None:
            rows.append(next(made_split))
            grids.append(next(made))
            if seconds_here:
                seconds.append(next(seconds_made).reshape(1))
            continue
        frames, metadata, layout = place
        tensor, grid = video_rows(ctx, layout, frames)
        rows.append(tensor)
        grids.append(grid)
        if seconds_here:
            seconds.append(_second_per_grid(ctx, layout, metadata))
    out["pixel_values_videos"] = rows[0] if len(rows) == 1 else torch.cat(rows)
    out["video_grid_thw"] = grids[0] if len(grids) == 1 else torch.cat(grids)
    if seconds_here:
        out["second_per_grid_ts"] = torch.cat(seconds)


def _output_names(processor: Any) -> list[str]:
    """The HF processor's model input names (Qwen2.5-VL's add ``second_per_grid_ts``)."""
    return list(getattr(processor.info.get_hf_processor(), "model_input_names", []))


def _second_per_grid(ctx: Any, layout: VideoPatchLayout, metadata: Mapping[str, Any] | None) -> Any:
    """Qwen2.5-VL's ``second_per_grid_ts`` of one video: the temporal patch
    over transformers' ``VideoMetadata.sampled_fps`` of vLLM's loader's
    metadata (as vLLM hands it over: without ``do_sample_frames``), as the
    processor's list becomes a tensor and vLLM casts it."""
    import torch
    from transformers.video_utils import VideoMetadata

    if metadata is None:
        raise ValueError("a processed video reached Qwen2.5-VL's processor without its metadata")
    fps = VideoMetadata(**{k: v for k, v in metadata.items() if k != "do_sample_frames"}).sampled_fps
    value = torch.tensor([layout.temporal_patch_size / fps])
    return value.to(dtype=ctx.model_config.dtype) if value.is_floating_point() else value


def tagged_media(media: Any, path: str) -> Any:
    """A video as vLLM's loader returns it (``MediaWithBytes`` of
    ``(frames, metadata)``), its frames tagged as a processed video where
    the served model's processor takes them (:func:`tagged`)."""
    from vllm.multimodal.media import MediaWithBytes

    layout = worker_video_layout()
    if layout is None or not isinstance(media, MediaWithBytes) or not isinstance(media.media, tuple):
        return media
    frames, metadata = media.media
    carrier = tagged(frames, layout, path)
    return media if carrier is frames else MediaWithBytes((carrier, metadata), media.original_bytes)
