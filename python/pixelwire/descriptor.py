"""The pixel descriptor: the one schema a frontend emits and a worker reads.

A descriptor is a JSON-able dict with dynamo's decoded-media field names
(``nixl_metadata``, ``nixl_descriptor``, ``shape``, ``dtype``, ``metadata``,
``content_hash``) plus pixelwire's own ``pixelwire`` object. :class:`Decoded`
builds it (``to_dict``), :func:`parse_descriptor` is the only reader of it
(also of dynamo's ``RdmaMetadata``), and :class:`RemoteMedia` is what a
parsed descriptor names. Each medium's own fields are checked by its
handler in :data:`DESCRIPTOR_MEDIA` (:mod:`pixelwire.media`). Rules the native side owns are asked of it, not
repeated: the notification a hand-out of a slot ends by (``parse_notification``), the
content hash's form (``is_content_hash``), the metadata's packing (checked
when the reader unpacks it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from pixelwire._native import DescriptorError, is_content_hash, parse_notification
from pixelwire.config import BACKGROUND, Layout
from pixelwire.descriptor_checks import (
    CHANNEL_MODES,
    checked_background,
    checked_int,
    checked_shape,
    extent,
    layout_of,
    short,
    source_digest_ok,
)
from pixelwire.descriptor_records import (
    ProcessedRecord,
    ResizeRecord,
    VideoRecord,
    not_processed,
    processed_record,
    resize_record,
    video_record,
    video_shape,
)
from pixelwire.media import IMAGE, PROCESSED_IMAGE, VIDEO, Registry

__all__ = ["CHANNEL_MODES", "ProcessedRecord", "ResizeRecord", "VideoRecord", "source_digest_ok"]


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
class RemoteMedia:
    """What a parsed descriptor names: a medium's remote bytes (an image, a
    video's frames, a processed image's rows) and how to free them."""

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
    # The registered medium it is (pixelwire.media), and a medium's own
    # record where it is none of the above.
    medium: str = IMAGE.name
    record: Any = None

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


def decoded_as(desc: dict[str, Any]) -> tuple[str, tuple[int, int, int]]:
    """The mode a descriptor's image was decoded into and the background its
    transparency was composited onto, checked (with the resize record)
    before anything else: a frontend set up unlike its worker is the
    likeliest mistake to report."""
    info, own = desc.get("metadata"), desc.get("pixelwire")
    if not isinstance(info, dict) or not isinstance(own, dict) or not isinstance(info.get("color_type"), str):
        raise DescriptorError("descriptor lacks its metadata.color_type or pixelwire keys")
    background = checked_background(own.get("background"))
    resize_record(own.get("resize"))
    return info["color_type"], background


def is_video_descriptor(desc: dict[str, Any]) -> bool:
    """Whether ``desc`` describes video frames (dynamo's ``Video`` metadata)."""
    info = desc.get("metadata")
    return isinstance(info, dict) and "Video" in info


@dataclass(frozen=True)
class MediumFields:
    """What a medium's descriptor handler makes of the fields its medium
    owns: one item's checked [H, W, C] ``shape``, the mode it was decoded
    into and the background composited under it (None, the default: not
    said), and its record."""

    shape: tuple[int, int, int]
    color_type: str | None = None
    background: tuple[int, int, int] = BACKGROUND
    # Items of `shape` packed one after another (a video's frames); None: one.
    frames: int | None = None
    video: VideoRecord | None = None
    processed: ProcessedRecord | None = None
    # A registered medium's own record (RemoteMedia.record).
    record: Any = None


class DescriptorMedium(Protocol):
    """One medium's descriptor handler (registered in :data:`DESCRIPTOR_MEDIA`)."""

    def claims(self, desc: dict[str, Any]) -> bool:
        """Whether ``desc`` is a descriptor of this medium."""
        ...

    def fields(self, desc: dict[str, Any], shape: Any, layout: Layout) -> MediumFields:
        """The medium's own fields of ``desc`` checked, with ``shape`` (the
        descriptor's, or the one a caller gave) and the checked ``layout``;
        checked before the slot's fields, so a frontend set up unlike its
        worker is what is reported."""
        ...


class _ImageDescriptor:
    """An image: anything no later-registered medium claims."""

    def claims(self, desc: dict[str, Any]) -> bool:
        return True

    def fields(self, desc: dict[str, Any], shape: Any, layout: Layout) -> MediumFields:
        color_type, background = decoded_as(desc)
        not_processed(desc["pixelwire"])
        return MediumFields(checked_shape(shape), color_type, background)


class _ProcessedDescriptor:
    """A processed image: the processor's patch rows of an image ("PATCHES")."""

    def claims(self, desc: dict[str, Any]) -> bool:
        info = desc.get("metadata")
        return isinstance(info, dict) and info.get("layout") == "PATCHES" and "Video" not in info

    def fields(self, desc: dict[str, Any], shape: Any, layout: Layout) -> MediumFields:
        color_type, background = decoded_as(desc)
        checked = checked_shape(shape)
        return MediumFields(
            checked, color_type, background, processed=processed_record(desc["pixelwire"], checked)
        )


class _VideoDescriptor:
    """A video: its sampled frames, packed, with dynamo's ``Video`` metadata."""

    def claims(self, desc: dict[str, Any]) -> bool:
        return is_video_descriptor(desc)

    def fields(self, desc: dict[str, Any], shape: Any, layout: Layout) -> MediumFields:
        video = video_record(desc)
        frames, *frame_shape = video_shape(shape)
        if len(video.loader_metadata["frames_indices"]) != frames:
            raise DescriptorError("pixelwire.video's frames_indices must name each frame of the shape")
        if layout == "PATCHES":
            raise DescriptorError("video frames are not patch rows")
        not_processed(desc["pixelwire"])
        # A video's frames are RGB, decoded without compositing.
        return MediumFields(checked_shape(frame_shape), "RGB", BACKGROUND, frames=frames, video=video)


# Each medium's descriptor handler; a descriptor is the newest registered
# medium that claims it (an image when no other does).
DESCRIPTOR_MEDIA: Registry[DescriptorMedium] = Registry("descriptor")
DESCRIPTOR_MEDIA.register(IMAGE.name, _ImageDescriptor())
DESCRIPTOR_MEDIA.register(VIDEO.name, _VideoDescriptor())
DESCRIPTOR_MEDIA.register(PROCESSED_IMAGE.name, _ProcessedDescriptor())


def descriptor_medium(desc: dict[str, Any]) -> str:
    """The name of the registered medium ``desc`` describes."""
    return DESCRIPTOR_MEDIA.find(lambda handler: handler.claims(desc))[0]


def _rdma_metadata(desc: dict[str, Any], metadata: str, shape: Any | None) -> RemoteMedia:
    """dynamo nixl_connect's RdmaMetadata: one descriptor, shape given by the caller."""
    if shape is None:
        raise DescriptorError("an RdmaMetadata descriptor needs shape=")
    parts = desc["descriptors"]
    if not isinstance(parts, list) or len(parts) != 1 or not isinstance(parts[0], dict):
        raise DescriptorError("RdmaMetadata must hold exactly one descriptor")
    part = parts[0]
    device = str(part.get("device", "cpu")).lower()
    if device not in ("cpu", "dram"):
        raise DescriptorError(f"unsupported remote device {short(device)}")
    notification = desc.get("notification_key")
    if not isinstance(notification, str) or not notification:
        raise DescriptorError("RdmaMetadata needs a notification_key")
    addr, size = extent(part.get("ptr"), part.get("size"), "ptr", "size")
    return RemoteMedia(
        agent="",
        metadata=metadata,
        addr=addr,
        size=size,
        shape=checked_shape(shape),
        content_hash=None,
        notification=notification,
        expires_at=None,
    )


def parse_descriptor(desc: PublishedSlot | dict[str, Any], shape: Any | None = None) -> RemoteMedia:
    """The medium a descriptor names, every field checked (``DescriptorError``
    otherwise): its medium's own fields by its handler in
    :data:`DESCRIPTOR_MEDIA`, then the slot's. ``shape`` overrides the
    descriptor's (and is required for dynamo's ``RdmaMetadata``, an image's,
    which carries none)."""
    if isinstance(desc, PublishedSlot):
        desc = desc.to_dict()
    if not isinstance(desc, dict):
        raise DescriptorError(f"descriptor must be a dict or Decoded, not {type(desc).__name__}")
    if "descriptors" in desc:
        if is_video_descriptor(desc):
            raise DescriptorError("an RdmaMetadata descriptor carries an image")
        metadata = desc.get("nixl_metadata")
        if not isinstance(metadata, str):
            raise DescriptorError("nixl_metadata must be a 'b64:' string")
        return _rdma_metadata(desc, metadata, shape)
    medium, handler = DESCRIPTOR_MEDIA.find(lambda handler: handler.claims(desc))
    layout = layout_of(desc)
    own_fields = handler.fields(desc, desc.get("shape") if shape is None else shape, layout)
    metadata = desc.get("nixl_metadata")
    if not isinstance(metadata, str):
        raise DescriptorError("nixl_metadata must be a 'b64:' string")
    if desc.get("dtype") != "UINT8":
        raise DescriptorError(f"dtype must be 'UINT8', not {short(desc.get('dtype'))}")
    nixl = desc.get("nixl_descriptor")
    own = desc.get("pixelwire")
    if not isinstance(nixl, dict) or not isinstance(own, dict):
        raise DescriptorError("descriptor lacks nixl_descriptor or pixelwire keys")
    if nixl.get("mem_type") != "Dram":
        raise DescriptorError(f"unsupported mem_type {short(nixl.get('mem_type'))}")
    # Host memory is NIXL's device 0; the read never looks at another.
    if checked_int(nixl.get("device_id", 0), "nixl_descriptor.device_id") != 0:
        raise DescriptorError(f"nixl_descriptor.device_id must be 0 for Dram, not {nixl['device_id']}")
    content_hash = desc.get("content_hash")
    if not isinstance(content_hash, str) or not is_content_hash(content_hash):
        raise DescriptorError("content_hash must be 'xxh3-256k:' and 16 lowercase hex digits")
    slot, generation = (checked_int(own.get(key), f"pixelwire.{key}") for key in ("slot", "generation"))
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
    addr, size = extent(nixl.get("addr"), nixl.get("size"), "addr", "size")
    return RemoteMedia(
        metadata_version=checked_int(own.get("metadata_version"), "pixelwire.metadata_version"),
        metadata_pruned=None
        if own.get("metadata_pruned") is None
        else checked_int(own.get("metadata_pruned"), "pixelwire.metadata_pruned"),
        slot=slot,
        generation=generation,
        agent=agent,
        metadata=metadata,
        addr=addr,
        size=size,
        shape=own_fields.shape,
        content_hash=content_hash,
        notification=notification,
        expires_at=float(expires_at),
        layout=layout,
        published_at=float(published_at)
        if isinstance(published_at, (int, float)) and math.isfinite(published_at) and published_at > 0
        else None,
        source_sha256=digest if source_digest_ok(digest) else None,
        resize=resize_record(own.get("resize")),
        color_type=own_fields.color_type,
        background=own_fields.background,
        frames=own_fields.frames,
        video=own_fields.video,
        processed=own_fields.processed,
        medium=medium,
        record=own_fields.record,
    )


# The name it had when only images were read: kept for callers.
RemoteImage = RemoteMedia
