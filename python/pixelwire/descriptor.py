"""The pixel descriptor: the one schema a frontend emits and a worker reads.

A descriptor is a JSON-able dict with dynamo's decoded-media field names
(``nixl_metadata``, ``nixl_descriptor``, ``shape``, ``dtype``, ``metadata``,
``content_hash``) plus pixelwire's own ``pixelwire`` object. :class:`Decoded`
builds it (``to_dict``), :func:`parse_descriptor` is the only reader of it
(also of dynamo's ``RdmaMetadata``), and :class:`RemoteImage` is what a
parsed descriptor names. Rules the native side owns are asked of it, not
repeated: the notification a hand-out of a slot ends by (``parse_notification``), the
content hash's form (``is_content_hash``), the metadata's packing (checked
when the reader unpacks it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from pixelwire._native import DescriptorError, is_content_hash, parse_notification
from pixelwire.config import BACKGROUND, Layout

# What the native reader takes: u64 addresses, slots, generations and
# metadata versions. Sizes and image sides are far below that: no image
# reaches 1 TiB, or 2^31 pixels a side.
U64 = 1 << 64
MAX_DESCRIPTOR_SIZE = 1 << 40
MAX_SIDE = 1 << 31
# Channels per pixel -> the mode of an image of them.
CHANNEL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
# The SHA-256 of the encoded bytes, as hashlib's hexdigest gives it (a whole
# match over ASCII: "$" would also match before a newline, "\d" any digit).
SOURCE_SHA256 = re.compile(r"[0-9a-f]{64}")


def source_digest_ok(value: Any) -> bool:
    """Whether ``value`` is a source SHA-256 as a descriptor carries it."""
    return isinstance(value, str) and SOURCE_SHA256.fullmatch(value) is not None


@dataclass(frozen=True, kw_only=True)
class PublishedSlot:
    """What every published medium's descriptor says of its slot: where its
    bytes are, their content hash, the hand-out it is, and the source
    behind it. Each medium adds its own shape and record
    (:class:`Decoded`, :class:`DecodedVideo`, or a registered medium's own)
    and says what goes in dynamo's ``metadata`` and its own ``pixelwire``
    keys; `to_dict()` is the JSON-able descriptor."""

    nixl_metadata: str
    addr: int
    size: int
    content_hash: str
    agent: str
    slot: int
    generation: int
    expires_at: float
    notification: str
    # Its shape as the descriptor says it (each medium narrows it).
    shape: tuple[int, ...]
    mem_type: str = "Dram"
    device_id: int = 0
    published_at: float = 0.0
    # SHA-256 of the encoded bytes: a collision-resistant identity the
    # worker can key caches on without hashing the pixels again.
    source_sha256: str = ""
    # Version of `nixl_metadata`: it only grows, and a reader keeps the
    # newest it has seen for this agent.
    metadata_version: int = 0
    # The last metadata version that dropped a region: a reader that has
    # loaded that version or a later one adds the new regions without
    # reconnecting (a frontend's pool growth costs its workers nothing).
    metadata_pruned: int = 0
    # The model-aware resize applied: {"policy": identity, "source": [H, W]}.
    resize: dict[str, Any] | None = None

    def medium_metadata(self) -> dict[str, Any]:
        """Dynamo's ``metadata`` for this medium."""
        return {}

    def medium_keys(self) -> dict[str, Any]:
        """The medium's own keys of the ``pixelwire`` object."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """Dynamo's decoded-media field names, plus pixelwire's own keys."""
        desc = _slot_dict(self, self.medium_metadata())
        desc["pixelwire"].update(self.medium_keys())
        if self.resize is not None:
            desc["pixelwire"]["resize"] = self.resize
        return desc


@dataclass(frozen=True)
class Decoded(PublishedSlot):
    """One published image; `to_dict()` is the JSON-able descriptor."""

    shape: tuple[int, int, int]
    format: str
    color_type: str
    background: tuple[int, int, int] = BACKGROUND
    layout: Layout = "HWC"
    # A "PATCHES" image's processed form (pixelwire.processed.PatchLayout.record):
    # the processor's identity, image_grid_thw and the patch grid.
    processed: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def medium_metadata(self) -> dict[str, Any]:
        return {"format": self.format, "color_type": self.color_type, "layout": self.layout}

    def medium_keys(self) -> dict[str, Any]:
        keys: dict[str, Any] = {"background": list(self.background)}
        if self.processed is not None:
            keys["processed"] = self.processed
        return keys


@dataclass(frozen=True)
class DecodedVideo(PublishedSlot):
    """One published video: the frames a vLLM video loader samples, packed
    (T, H, W, 3) RGB; `to_dict()` is the JSON-able descriptor. Its
    ``resize`` is the per-frame one."""

    shape: tuple[int, int, int, int]
    # vLLM's metadata dict for the frames (total_num_frames, fps, duration,
    # video_backend, frames_indices, do_sample_frames).
    loader_metadata: dict[str, Any]
    # How they were sampled: {"loader": name, "num_frames": n, "fps": f,
    # and the loader's own options}; a worker whose vLLM would sample
    # otherwise refuses the frames.
    sampling: dict[str, Any]
    codec: str = ""

    def medium_metadata(self) -> dict[str, Any]:
        """Dynamo's ``Video`` metadata: source fps and duration, each sampled frame's time."""
        fps = float(self.loader_metadata["fps"])
        timestamps = [index / fps if fps > 0 else 0.0 for index in self.loader_metadata["frames_indices"]]
        return {
            "Video": {
                "source_fps": fps,
                "source_duration": float(self.loader_metadata["duration"]),
                "sampled_timestamps": timestamps,
            }
        }

    def medium_keys(self) -> dict[str, Any]:
        return {
            "video": {"loader_metadata": self.loader_metadata, "sampling": self.sampling, "codec": self.codec}
        }


def _slot_dict(published: PublishedSlot, metadata: dict[str, Any]) -> dict[str, Any]:
    """The fields every descriptor has: where the pixels are, their shape,
    ``metadata`` (dynamo's), and the slot they live in."""
    return {
        "nixl_metadata": published.nixl_metadata,
        "nixl_descriptor": {
            "addr": published.addr,
            "size": published.size,
            "mem_type": published.mem_type,
            "device_id": published.device_id,
        },
        "shape": list(published.shape),
        "dtype": "UINT8",
        "metadata": metadata,
        "content_hash": published.content_hash,
        "pixelwire": {
            "agent": published.agent,
            "slot": published.slot,
            "generation": published.generation,
            "expires_at": published.expires_at,
            "notification": published.notification,
            "published_at": published.published_at,
            "source_sha256": published.source_sha256,
            "metadata_version": published.metadata_version,
            "metadata_pruned": published.metadata_pruned,
        },
    }


@dataclass(frozen=True)
class PassThrough:
    """An image left for the worker to fetch and decode (``decode_at="worker"``)."""

    url: str

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url}


@dataclass(frozen=True)
class ResizeRecord:
    """The model-aware resize a frontend applied: the policy's identity and
    the decoded image's (height, width) before it."""

    policy: str
    source: tuple[int, int]


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


@dataclass(frozen=True)
class VideoRecord:
    """What a video descriptor says of its frames: vLLM's metadata dict for
    them and how they were sampled (see :class:`DecodedVideo`)."""

    loader_metadata: dict[str, Any]
    sampling: dict[str, Any]


@dataclass(frozen=True)
class RemoteImage:
    """What a parsed descriptor names: remote pixels and how to free them."""

    agent: str
    metadata: str
    addr: int
    size: int
    shape: tuple[int, int, int]
    content_hash: str | None
    notification: str
    expires_at: float | None
    # "RGBX": RGB stored four bytes a pixel (Pillow's own layout).
    layout: Layout = "HWC"
    # pixelwire descriptors: the metadata's version and the slot header
    # (slot, generation) the reader checks after the READ.
    metadata_version: int | None = None
    # The last metadata version that dropped a region (None: unknown).
    metadata_pruned: int | None = None
    slot: int | None = None
    generation: int | None = None
    published_at: float | None = None
    source_sha256: str | None = None
    resize: ResizeRecord | None = None
    # The mode the frontend decoded into, and what it composited RGBA onto
    # (RdmaMetadata carries neither).
    color_type: str | None = None
    background: tuple[int, int, int] = BACKGROUND
    # A video's frame count (the pixels are `frames` images of `shape`,
    # packed), and how its frames were sampled; None for an image.
    frames: int | None = None
    video: VideoRecord | None = None
    # A processed image's patch rows ("PATCHES": shape is rows x row length x
    # bytes a value, 1 for uint8 and 4 for float32).
    processed: ProcessedRecord | None = None

    @property
    def pixel_bytes(self) -> int:
        """Bytes a pixel takes in the remote buffer."""
        return 4 if self.layout == "RGBX" else self.shape[2]

    @property
    def source_size(self) -> tuple[int, int]:
        """The decoded image's (height, width) before any resize."""
        return self.resize.source if self.resize is not None else (self.shape[0], self.shape[1])

    def check(self, max_pixels: int, now: float) -> None:
        """Refuses what no read should be attempted for: a shape that does not
        fill the buffer, too many pixels, or an expired lease."""
        h, w, c = self.shape
        if self.layout == "RGBX" and c != 3:
            raise DescriptorError("the RGBX layout holds 3-channel images only")
        count = 1 if self.frames is None else self.frames
        if count * h * w * self.pixel_bytes != self.size:
            shape = list(self.shape) if self.frames is None else [self.frames, *self.shape]
            raise DescriptorError(f"shape {shape} does not match size {self.size}")
        pixels = self.processed.pixels if self.processed is not None else h * w
        if pixels > max_pixels:
            raise DescriptorError(f"image of {pixels} pixels is over max_pixels={max_pixels}")
        if self.expires_at is not None and now > self.expires_at:
            raise DescriptorError("the descriptor's lease has expired; the frontend has reclaimed the slot")


def _int(value: Any, what: str, below: int = U64) -> int:
    """A non-negative integer under ``below`` (the native u64 by default)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DescriptorError(f"{what} must be a non-negative integer, not {_short(value)}")
    if value >= below:
        raise DescriptorError(f"{what} must be below 2^{below.bit_length() - 1}, not {_short(value)}")
    return value


def _short(value: Any) -> str:
    """A value for a message: a huge integer's repr would be thousands of digits."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() <= 128 else "a larger integer"
    return text if len(text) <= 80 else text[:77] + "..."


def _shape(value: Any) -> tuple[int, int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise DescriptorError(f"shape must be [H, W, C], not {_short(value)}")
    h, w, c = (_int(v, "shape", MAX_SIDE) for v in value)
    if h == 0 or w == 0 or c not in CHANNEL_MODES:
        raise DescriptorError(f"shape {list(value)} is not an image (H, W > 0; C in 1, 3, 4)")
    return h, w, c


def _extent(addr: Any, size: Any, addr_name: str, size_name: str) -> tuple[int, int]:
    """A remote address and size: a u64 address, a size under
    MAX_DESCRIPTOR_SIZE, and the range inside the 64-bit address space."""
    start = _int(addr, addr_name)
    length = _int(size, size_name, MAX_DESCRIPTOR_SIZE)
    if start + length > U64:
        raise DescriptorError(f"{addr_name} + {size_name} runs past the 64-bit address space")
    return start, length


def _layout(desc: dict[str, Any]) -> Layout:
    info = desc.get("metadata")
    layout = info.get("layout", "HWC") if isinstance(info, dict) else "HWC"
    if layout == "HWC":
        return "HWC"
    if layout == "RGBX":
        return "RGBX"
    if layout == "PATCHES":
        return "PATCHES"
    raise DescriptorError(f"unsupported layout {_short(layout)}")


def _background(value: Any) -> tuple[int, int, int]:
    if value is None:
        return BACKGROUND
    if not (
        isinstance(value, list) and len(value) == 3 and all(type(v) is int and 0 <= v <= 255 for v in value)
    ):
        raise DescriptorError("pixelwire.background must be [R, G, B], each 0 to 255")
    return value[0], value[1], value[2]


def decoded_as(desc: dict[str, Any]) -> tuple[str, tuple[int, int, int]]:
    """The mode a descriptor's image was decoded into and the background its
    transparency was composited onto, checked (with the resize record)
    before anything else: a frontend set up unlike its worker is the
    likeliest mistake to report."""
    info, own = desc.get("metadata"), desc.get("pixelwire")
    if not isinstance(info, dict) or not isinstance(own, dict) or not isinstance(info.get("color_type"), str):
        raise DescriptorError("descriptor lacks its metadata.color_type or pixelwire keys")
    background = _background(own.get("background"))
    _resize(own.get("resize"))
    return info["color_type"], background


def _resize(value: Any) -> ResizeRecord | None:
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


def _positive_triple(value: Any, what: str) -> tuple[int, int, int]:
    if not (
        isinstance(value, list)
        and len(value) == 3
        and all(type(v) is int and 0 < v < MAX_SIDE for v in value)
    ):
        raise DescriptorError(f"{what} must be three positive integers, not {_short(value)}")
    return value[0], value[1], value[2]


# Bytes a value of processed rows takes (the descriptor's shape[2]).
_PROCESSED_VALUE_BYTES = {"uint8": 1, "float32": 4}


def _processed(value: Any, layout: Layout, shape: tuple[int, int, int]) -> ProcessedRecord | None:
    """A "PATCHES" descriptor's processed record, checked against its shape:
    one row a patch of the grid, each ``3 * patch * patch`` values of its
    dtype's bytes (the temporal copies are made by the worker)."""
    if layout != "PATCHES":
        if value is not None:
            raise DescriptorError("pixelwire.processed belongs to the PATCHES layout")
        return None
    if not isinstance(value, dict) or not isinstance(value.get("processor"), str):
        raise DescriptorError("a PATCHES descriptor needs its pixelwire.processed record")
    dtype = value.get("dtype", "uint8")
    if dtype not in _PROCESSED_VALUE_BYTES:
        raise DescriptorError(f"pixelwire.processed.dtype must be uint8 or float32, not {_short(dtype)}")
    record = ProcessedRecord(
        value["processor"],
        _positive_triple(value.get("grid_thw"), "pixelwire.processed.grid_thw"),
        _positive_triple(value.get("patch"), "pixelwire.processed.patch"),
        dtype,
    )
    (t, h, w), (patch, _, merge) = record.grid_thw, record.patch
    if h % merge or w % merge or shape != (t * h * w, 3 * patch * patch, _PROCESSED_VALUE_BYTES[dtype]):
        raise DescriptorError(f"shape {list(shape)} is not the patch rows of grid {list(record.grid_thw)}")
    return record


def is_video_descriptor(desc: dict[str, Any]) -> bool:
    """Whether ``desc`` describes video frames (dynamo's ``Video`` metadata)."""
    info = desc.get("metadata")
    return isinstance(info, dict) and "Video" in info


def _video_shape(value: Any) -> tuple[int, int, int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise DescriptorError(f"a video's shape must be [T, H, W, 3], not {_short(value)}")
    frames = _int(value[0], "shape", MAX_SIDE)
    h, w, c = _shape(value[1:])
    if frames == 0 or c != 3:
        raise DescriptorError(f"shape {list(value)} is not video frames (T > 0, RGB)")
    return frames, h, w, c


def _number(value: Any, what: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise DescriptorError(f"{what} must be a finite non-negative number, not {_short(value)}")
    return float(value)


def _video(desc: dict[str, Any]) -> VideoRecord | None:
    """The video record of a descriptor with dynamo's ``Video`` metadata,
    checked: vLLM's metadata dict as the loader gives it, and the sampling."""
    if not is_video_descriptor(desc):
        return None
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
        "total_num_frames": _int(meta.get("total_num_frames"), "total_num_frames", MAX_SIDE),
        "fps": _number(meta.get("fps"), "fps"),
        "duration": _number(meta.get("duration"), "duration"),
        "video_backend": meta.get("video_backend"),
        "frames_indices": [_int(index, "frames_indices", MAX_SIDE) for index in indices],
        "do_sample_frames": meta.get("do_sample_frames"),
    }
    if not isinstance(checked["video_backend"], str) or not isinstance(checked["do_sample_frames"], bool):
        raise DescriptorError("pixelwire.video's video_backend and do_sample_frames are missing")
    return VideoRecord(checked, dict(sampling))


def _rdma_metadata(desc: dict[str, Any], metadata: str, shape: Any | None) -> RemoteImage:
    """dynamo nixl_connect's RdmaMetadata: one descriptor, shape given by the caller."""
    if shape is None:
        raise DescriptorError("an RdmaMetadata descriptor needs shape=")
    parts = desc["descriptors"]
    if not isinstance(parts, list) or len(parts) != 1 or not isinstance(parts[0], dict):
        raise DescriptorError("RdmaMetadata must hold exactly one descriptor")
    part = parts[0]
    device = str(part.get("device", "cpu")).lower()
    if device not in ("cpu", "dram"):
        raise DescriptorError(f"unsupported remote device {_short(device)}")
    notification = desc.get("notification_key")
    if not isinstance(notification, str) or not notification:
        raise DescriptorError("RdmaMetadata needs a notification_key")
    addr, size = _extent(part.get("ptr"), part.get("size"), "ptr", "size")
    return RemoteImage(
        agent="",
        metadata=metadata,
        addr=addr,
        size=size,
        shape=_shape(shape),
        content_hash=None,
        notification=notification,
        expires_at=None,
    )


def parse_descriptor(desc: Decoded | dict[str, Any], shape: Any | None = None) -> RemoteImage:
    """The image a descriptor names, every field checked (``DescriptorError``
    otherwise). ``shape`` overrides the descriptor's (and is required for
    dynamo's ``RdmaMetadata``, which carries none)."""
    if isinstance(desc, Decoded):
        desc = desc.to_dict()
    if not isinstance(desc, dict):
        raise DescriptorError(f"descriptor must be a dict or Decoded, not {type(desc).__name__}")
    is_rdma_metadata = "descriptors" in desc
    video = _video(desc)
    frames: int | None = None
    if video is not None:
        # A video's frames are RGB, decoded without compositing.
        color_type, background = "RGB", BACKGROUND
        frames, *frame_shape = _video_shape(desc.get("shape") if shape is None else shape)
        shape = frame_shape
        if len(video.loader_metadata["frames_indices"]) != frames:
            raise DescriptorError("pixelwire.video's frames_indices must name each frame of the shape")
    elif not is_rdma_metadata:
        color_type, background = decoded_as(desc)
    metadata = desc.get("nixl_metadata")
    if not isinstance(metadata, str):
        raise DescriptorError("nixl_metadata must be a 'b64:' string")
    if is_rdma_metadata:
        return _rdma_metadata(desc, metadata, shape)
    if desc.get("dtype") != "UINT8":
        raise DescriptorError(f"dtype must be 'UINT8', not {_short(desc.get('dtype'))}")
    nixl = desc.get("nixl_descriptor")
    own = desc.get("pixelwire")
    if not isinstance(nixl, dict) or not isinstance(own, dict):
        raise DescriptorError("descriptor lacks nixl_descriptor or pixelwire keys")
    if nixl.get("mem_type") != "Dram":
        raise DescriptorError(f"unsupported mem_type {_short(nixl.get('mem_type'))}")
    # Host memory is NIXL's device 0; the read never looks at another.
    if _int(nixl.get("device_id", 0), "nixl_descriptor.device_id") != 0:
        raise DescriptorError(f"nixl_descriptor.device_id must be 0 for Dram, not {nixl['device_id']}")
    content_hash = desc.get("content_hash")
    if not isinstance(content_hash, str) or not is_content_hash(content_hash):
        raise DescriptorError("content_hash must be 'xxh3-256k:' and 16 lowercase hex digits")
    slot, generation = (_int(own.get(key), f"pixelwire.{key}") for key in ("slot", "generation"))
    notification = own.get("notification")
    named = parse_notification(notification) if isinstance(notification, str) else None
    if not isinstance(notification, str) or named is None or named[:2] != (slot, generation):
        raise DescriptorError("pixelwire.notification is malformed or names another slot")
    agent = own.get("agent")
    if not isinstance(agent, str) or not agent:
        raise DescriptorError("pixelwire.agent must name the frontend agent")
    expires_at = own.get("expires_at")
    if not isinstance(expires_at, (int, float)) or not math.isfinite(expires_at):
        raise DescriptorError("pixelwire.expires_at must be a Unix time")
    published_at = own.get("published_at")
    digest = own.get("source_sha256")
    addr, size = _extent(nixl.get("addr"), nixl.get("size"), "addr", "size")
    layout = _layout(desc)
    checked_shape = _shape(desc.get("shape") if shape is None else shape)
    processed = _processed(own.get("processed"), layout, checked_shape)
    if layout == "PATCHES" and video is not None:
        raise DescriptorError("video frames are not patch rows")
    return RemoteImage(
        metadata_version=_int(own.get("metadata_version"), "pixelwire.metadata_version"),
        metadata_pruned=None
        if own.get("metadata_pruned") is None
        else _int(own.get("metadata_pruned"), "pixelwire.metadata_pruned"),
        slot=slot,
        generation=generation,
        agent=agent,
        metadata=metadata,
        addr=addr,
        size=size,
        shape=checked_shape,
        content_hash=content_hash,
        notification=notification,
        expires_at=float(expires_at),
        layout=layout,
        published_at=float(published_at)
        if isinstance(published_at, (int, float)) and math.isfinite(published_at) and published_at > 0
        else None,
        source_sha256=digest if source_digest_ok(digest) else None,
        resize=_resize(own.get("resize")),
        color_type=color_type,
        background=background,
        frames=frames,
        video=video,
        processed=processed,
    )
