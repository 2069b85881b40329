"""The records a descriptor carries for its medium, each with its check:
the resize a frontend applied, a processed image's patch grid, a video's
sampling (:mod:`pixelwire.descriptor` builds and reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pixelwire._native import DescriptorError
from pixelwire.descriptor_checks import (
    MAX_SIDE,
    checked_int,
    checked_number,
    checked_shape,
    positive_triple,
    short,
)


@dataclass(frozen=True)
class ResizeRecord:
    """The model-aware resize a frontend applied: the policy's identity and
    the decoded image's (height, width) before it."""

    policy: str
    source: tuple[int, int]


def resize_record(value: Any) -> ResizeRecord | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("policy"), str):
        raise DescriptorError("pixelwire.resize must hold the policy and the source size")
    source = value.get("source")
    if not (
        isinstance(source, list)
        and len(source) == 2
        and all(type(v) is int and 0 < v < MAX_SIDE for v in source)
    ):
        raise DescriptorError("pixelwire.resize.source must be [height, width], each 1 to 2^31 - 1")
    return ResizeRecord(value["policy"], (source[0], source[1]))


# Bytes a value of processed rows takes (the descriptor's shape[2]).
PROCESSED_VALUE_BYTES = {"uint8": 1, "float32": 4}


@dataclass(frozen=True)
class ProcessedRecord:
    """What a processed image's descriptor says of its patch rows: the
    processor's identity (:func:`pixelwire.processed.processed_identity`),
    ``image_grid_thw``, the patch grid (patch, temporal, merge) and the
    rows' dtype (uint8, or float32: four bytes a value)."""

    processor: str
    grid_thw: tuple[int, int, int]
    patch: tuple[int, int, int]
    dtype: str = "uint8"

    @property
    def pixels(self) -> int:
        """Pixels of the resized image the rows hold."""
        t, h, w = self.grid_thw
        return t * h * w * self.patch[0] * self.patch[0]


def not_processed(own: dict[str, Any]) -> None:
    """Refuses a processed record in a descriptor of another layout."""
    if own.get("processed") is not None:
        raise DescriptorError("pixelwire.processed belongs to the PATCHES layout")


def processed_record(own: dict[str, Any], shape: tuple[int, int, int]) -> ProcessedRecord:
    """A "PATCHES" descriptor's processed record, checked against its shape:
    one row a patch of the grid, each ``3 * patch * patch`` values of its
    dtype's bytes (the temporal copies are made by the worker)."""
    value = own.get("processed")
    if not isinstance(value, dict) or not isinstance(value.get("processor"), str):
        raise DescriptorError("a PATCHES descriptor needs its pixelwire.processed record")
    dtype = value.get("dtype", "uint8")
    if dtype not in PROCESSED_VALUE_BYTES:
        raise DescriptorError(f"pixelwire.processed.dtype must be uint8 or float32, not {short(dtype)}")
    record = ProcessedRecord(
        value["processor"],
        positive_triple(value.get("grid_thw"), "pixelwire.processed.grid_thw"),
        positive_triple(value.get("patch"), "pixelwire.processed.patch"),
        dtype,
    )
    (t, h, w), (patch, _, merge) = record.grid_thw, record.patch
    if h % merge or w % merge or shape != (t * h * w, 3 * patch * patch, PROCESSED_VALUE_BYTES[dtype]):
        raise DescriptorError(f"shape {list(shape)} is not the patch rows of grid {list(record.grid_thw)}")
    return record


@dataclass(frozen=True)
class VideoRecord:
    """What a video descriptor says of its frames: vLLM's metadata dict for
    them and how they were sampled (see :class:`DecodedVideo`)."""

    loader_metadata: dict[str, Any]
    sampling: dict[str, Any]


def video_shape(value: Any) -> tuple[int, int, int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise DescriptorError(f"a video's shape must be [T, H, W, 3], not {short(value)}")
    frames = checked_int(value[0], "shape", MAX_SIDE)
    h, w, c = checked_shape(value[1:])
    if frames == 0 or c != 3:
        raise DescriptorError(f"shape {list(value)} is not video frames (T > 0, RGB)")
    return frames, h, w, c


def video_record(desc: dict[str, Any]) -> VideoRecord:
    """The video record of a descriptor with dynamo's ``Video`` metadata,
    checked: vLLM's metadata dict as the loader gives it, and the sampling."""
    own = desc.get("pixelwire")
    record = own.get("video") if isinstance(own, dict) else None
    if not isinstance(record, dict):
        raise DescriptorError("a video descriptor needs its pixelwire.video record")
    meta, sampling = record.get("loader_metadata"), record.get("sampling")
    if (
        not isinstance(meta, dict)
        or not isinstance(sampling, dict)
        or not isinstance(sampling.get("loader"), str)
    ):
        raise DescriptorError("pixelwire.video must hold the loader's metadata and the sampling")
    indices = meta.get("frames_indices")
    if not isinstance(indices, list) or not indices:
        raise DescriptorError("pixelwire.video's frames_indices must be a list of frame indices")
    checked = {
        "total_num_frames": checked_int(meta.get("total_num_frames"), "total_num_frames", MAX_SIDE),
        "fps": checked_number(meta.get("fps"), "fps"),
        "duration": checked_number(meta.get("duration"), "duration"),
        "video_backend": meta.get("video_backend"),
        "frames_indices": [checked_int(index, "frames_indices", MAX_SIDE) for index in indices],
        "do_sample_frames": meta.get("do_sample_frames"),
    }
    if not isinstance(checked["video_backend"], str) or not isinstance(checked["do_sample_frames"], bool):
        raise DescriptorError("pixelwire.video's video_backend and do_sample_frames are missing")
    return VideoRecord(checked, dict(sampling))
