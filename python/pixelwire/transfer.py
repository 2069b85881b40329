"""Frontend-to-worker pixels over NIXL: `Publisher` and `Reader`.

The frontend decodes an image straight into NIXL-registered memory and emits a
small JSON-able descriptor; a worker in another process (or host) pulls the
pixels with a NIXL READ whose notification tells the frontend to free the slot.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import importlib.util
import math
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from pixelwire import _native
from pixelwire._native import DescriptorError, Limits, PixelwireError, TransferError

if TYPE_CHECKING:
    from pixelwire.fetch import Fetcher
    from pixelwire.resize import ResizePolicy

MiB = 1024 * 1024
# Whole-string matches over ASCII digits: "$" would also match before a
# trailing newline, and "\d" any Unicode digit.
_NOTIFICATION = re.compile(r"pw1:[0-9]+:[0-9]+")
_HASH = re.compile(r"[0-9a-f]{16}")
_CHANNEL_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
# The modes pixelwire decodes into; other modes are left to vLLM's loader.
DECODED_MODES = ("RGB", "RGBA", "L")
_loaded = False
_load_lock = threading.Lock()

Output = Literal["pil", "numpy", "torch"]
DecodeAt = Literal["frontend", "worker"]


def _decode_at(value: str | None) -> DecodeAt:
    chosen = value or os.environ.get("PIXELWIRE_DECODE_AT") or "frontend"
    if chosen not in ("frontend", "worker"):
        raise ValueError(f"decode_at must be 'frontend' or 'worker', not {chosen!r}")
    return "frontend" if chosen == "frontend" else "worker"


def _default_fetcher() -> Fetcher:
    """A Fetcher with the default SSRF guard; PIXELWIRE_ALLOW_PRIVATE=1 is the
    explicit opt-out for deployments that fetch from their own network."""
    from pixelwire.fetch import Fetcher

    return Fetcher(allow_private=allow_private_from_env())


def allow_private_from_env() -> bool:
    """PIXELWIRE_ALLOW_PRIVATE, the explicit opt-out of the address guard."""
    return _env_flag("PIXELWIRE_ALLOW_PRIVATE", False)


def nixl_library_path() -> str:
    """Where `libnixl_capi.so` is: `PIXELWIRE_NIXL_LIB`, else the installed
    `nixl-cu13` or `nixl-cu12` wheel (installed with `--no-deps`: torch is not
    needed)."""
    explicit = os.environ.get("PIXELWIRE_NIXL_LIB")
    if explicit:
        return explicit
    for dist in ("nixl_cu13", "nixl_cu12"):
        spec = importlib.util.find_spec(dist)
        if spec is None or not spec.submodule_search_locations:
            continue
        site = Path(next(iter(spec.submodule_search_locations))).parent
        for candidate in sorted(site.glob(f".{dist}.mesonpy.libs/libnixl_capi.so")):
            return str(candidate)
    raise TransferError(
        "NIXL runtime not found: install it with `pip install --no-deps nixl-cu12==1.5.1 numpy` "
        "(or nixl-cu13), or point PIXELWIRE_NIXL_LIB at libnixl_capi.so"
    )


def ensure_nixl() -> None:
    """Loads NIXL's C API once per process."""
    global _loaded
    with _load_lock:
        if not _loaded:
            _native.load_nixl(nixl_library_path())
            _loaded = True


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def _env_flag(name: str, default: bool) -> bool:
    """1/true/yes or 0/false/no; anything else (or unset) is the default, so a
    typo never turns a guard off."""
    value = os.environ.get(name, "")
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    return default


@dataclass(frozen=True)
class Decoded:
    """One published image; `to_dict()` is the JSON-able descriptor."""

    nixl_metadata: str
    addr: int
    size: int
    shape: tuple[int, int, int]
    format: str
    color_type: str
    content_hash: str
    agent: str
    slot: int
    generation: int
    expires_at: float
    notification: str
    mem_type: str = "Dram"
    device_id: int = 0
    background: tuple[int, int, int] = (255, 255, 255)
    published_at: float = 0.0
    # SHA-256 of the encoded bytes: a collision-resistant identity the
    # worker can key caches on without hashing the pixels again.
    source_sha256: str = ""
    # Version of `nixl_metadata`: it only grows, and a reader keeps the
    # newest it has seen for this agent.
    metadata_version: int = 0
    # The model-aware resize applied: {"policy": identity, "source": [H, W]}.
    resize: dict[str, Any] | None = None
    layout: Literal["HWC", "RGBX"] = "HWC"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Dynamo's decoded-media field names, plus pixelwire's own keys."""
        return {
            "nixl_metadata": self.nixl_metadata,
            "nixl_descriptor": {
                "addr": self.addr,
                "size": self.size,
                "mem_type": self.mem_type,
                "device_id": self.device_id,
            },
            "shape": list(self.shape),
            "dtype": "UINT8",
            "metadata": {"format": self.format, "color_type": self.color_type, "layout": self.layout},
            "content_hash": self.content_hash,
            "pixelwire": {
                "agent": self.agent,
                "slot": self.slot,
                "generation": self.generation,
                "expires_at": self.expires_at,
                "notification": self.notification,
                "background": list(self.background),
                "published_at": self.published_at,
                "source_sha256": self.source_sha256,
                "metadata_version": self.metadata_version,
                **({"resize": self.resize} if self.resize is not None else {}),
            },
        }


def _publish(
    native: _native.NativePublisher,
    data: bytes | bytearray,
    mode: str,
    background: tuple[int, int, int],
    layout: str,
    resize: ResizePolicy | None,
) -> tuple[dict[str, Any], str]:
    """Decode-and-publish (resized as `resize` says) plus the source digest,
    in one trip off the event loop (hashlib releases the GIL on large inputs)."""
    size = None
    options: dict[str, Any] = {}
    if resize is not None:
        height, width = _native.probe_image(data)["oriented_size"]
        size = resize.target(height, width)
        options = {"resize_kernel": resize.kernel, "resize_filter": resize.filter}
    fields = native.publish(
        data, mode=mode, background=background, rgbx=layout == "RGBX", resize=size, **options
    )
    return fields, hashlib.sha256(data).hexdigest()


def _release_when_published(
    native: _native.NativePublisher,
) -> Any:
    """A done-callback that frees what an abandoned publish published."""

    def release(work: asyncio.Future[tuple[dict[str, Any], str]]) -> None:
        if work.cancelled() or work.exception() is not None:
            return
        fields, _ = work.result()
        native.release(fields["slot"], fields["generation"])

    return release


@dataclass(frozen=True)
class PassThrough:
    """An image left for the worker to fetch and decode (``decode_at="worker"``)."""

    url: str

    def to_dict(self) -> dict[str, Any]:
        return {"url": self.url}


class Publisher:
    """Frontend side: owns one NIXL agent and a registered pool.

    ``decode_at="worker"`` (or PIXELWIRE_DECODE_AT=worker) turns it into a
    pass-through: no fetching, no decoding, the worker gets the URL.
    """

    def __init__(
        self,
        *,
        pool_bytes: int = 256 * MiB,
        lease_seconds: float = 60.0,
        limits: Limits | None = None,
        acquire_timeout: float = 10.0,
        region_bytes: int = 64 * MiB,
        decode_at: DecodeAt | None = None,
        fetcher: Fetcher | None = None,
    ) -> None:
        self.decode_at = _decode_at(decode_at)
        if not lease_seconds >= _native.MIN_LEASE_SECONDS:
            raise ValueError(
                f"lease_seconds must be at least {_native.MIN_LEASE_SECONDS} (got {lease_seconds}): "
                "a shorter lease frees slots before a worker can read them"
            )
        self._fetcher = fetcher
        self._own_fetcher = fetcher is None
        self.pool_bytes = pool_bytes
        self.lease_seconds = lease_seconds
        self.limits = limits
        self.acquire_timeout = acquire_timeout
        self.region_bytes = min(region_bytes, pool_bytes)
        self._native: _native.NativePublisher | None = None

    def _open(self) -> _native.NativePublisher:
        if self._native is None:
            ensure_nixl()
            self._native = _native.NativePublisher(
                pool_bytes=self.pool_bytes,
                region_bytes=self.region_bytes,
                lease_seconds=self.lease_seconds,
                acquire_timeout=self.acquire_timeout,
                limits=self.limits,
            )
        return self._native

    async def __aenter__(self) -> Publisher:
        if self.decode_at == "frontend":
            await asyncio.to_thread(self._open)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        native, self._native = self._native, None
        if native is not None:
            await asyncio.to_thread(native.close)
        if self._own_fetcher and self._fetcher is not None:
            await self._fetcher.close()
            self._fetcher = None

    @property
    def fetcher(self) -> Fetcher:
        if self._fetcher is None:
            self._fetcher = _default_fetcher()
        return self._fetcher

    @property
    def agent_name(self) -> str:
        return self._open().agent_name

    async def decode_and_publish(
        self,
        source: bytes | bytearray | memoryview | str,
        *,
        mode: Literal["RGB", "RGBA", "L"] = "RGB",
        background: tuple[int, int, int] = (255, 255, 255),
        layout: Literal["HWC", "RGBX"] = "HWC",
        resize: ResizePolicy | None = None,
    ) -> Decoded | PassThrough:
        """Fetches `source` (encoded bytes, or a `data:`/`http(s)` URL through
        the publisher's Fetcher), decodes it into a pool slot off the event
        loop and returns its descriptor. `background` is what RGBA is
        composited onto for ``mode="RGB"`` (vLLM's ``rgba_background_color``).
        ``layout="RGBX"`` (RGB only) stores four bytes a pixel, Pillow's
        in-memory layout: 33% more to move, but a reader asking for a PIL
        image maps it without a copy. `resize` (a :class:`ResizePolicy`, RGB
        only) resizes to the size the model's processor would, with its
        arithmetic, right after decoding; the descriptor records it.
        With ``decode_at="worker"`` it does neither and returns a
        :class:`PassThrough`."""
        if self.decode_at == "worker":
            if isinstance(source, str):
                return PassThrough(source)
            encoded = base64.b64encode(bytes(source)).decode()
            return PassThrough(f"data:application/octet-stream;base64,{encoded}")
        native = self._open()
        if isinstance(source, str):
            data: bytes | bytearray = await self.fetcher.fetch(source)
        else:
            data = bytes(source) if isinstance(source, memoryview) else source
        if layout == "RGBX" and mode != "RGB":
            raise ValueError("layout='RGBX' needs mode='RGB'")
        if resize is not None and mode != "RGB":
            raise ValueError("a model-aware resize needs mode='RGB' (what the processors see)")
        work = asyncio.ensure_future(
            asyncio.to_thread(_publish, native, data, mode, background, layout, resize)
        )
        try:
            fields, source_sha256 = await asyncio.shield(work)
        except asyncio.CancelledError:
            # The caller went away mid-decode; the decode thread goes on, so
            # the slot it fills is freed as soon as it is published.
            work.add_done_callback(_release_when_published(native))
            raise
        return Decoded(
            nixl_metadata=fields["metadata"],
            metadata_version=fields["metadata_version"],
            addr=fields["addr"],
            size=fields["size"],
            shape=tuple(fields["shape"]),
            format=fields["format"],
            color_type=mode,
            content_hash=fields["content_hash"],
            agent=native.agent_name,
            slot=fields["slot"],
            generation=fields["generation"],
            expires_at=fields["expires_at"],
            notification=fields["notification"],
            background=background,
            published_at=time.time(),
            source_sha256=source_sha256,
            layout=layout,
            extra={"source_mode": fields["color_type"]},
            resize=None
            if resize is None
            else {"policy": resize.identity, "source": list(fields["source_shape"])},
        )

    def release(self, decoded: Decoded) -> bool:
        """Frees a published image before its reader's notification or its
        lease (its request is over). False when it was already freed, by a
        notification, an expired lease or an earlier release."""
        native = self._native
        return native is not None and native.release(decoded.slot, decoded.generation)

    def stats(self) -> dict[str, int]:
        return dict(self._open().stats())


@dataclass(frozen=True)
class _Source:
    agent: str
    metadata: str
    addr: int
    size: int
    shape: tuple[int, int, int]
    content_hash: str | None
    notification: str
    expires_at: float | None
    # "RGBX": RGB stored four bytes a pixel (Pillow's own layout).
    layout: str = "HWC"
    # pixelwire descriptors: the metadata's version and the slot header
    # (slot, generation) the reader checks after the READ.
    metadata_version: int | None = None
    slot: int | None = None
    generation: int | None = None

    def native_fields(self) -> dict[str, Any]:
        """The keyword arguments the native reader takes for this source."""
        return {
            "agent": self.agent,
            "metadata": self.metadata,
            "addr": self.addr,
            "size": self.size,
            "notification": self.notification,
            "metadata_version": self.metadata_version,
            "slot": self.slot,
            "generation": self.generation,
        }

    @property
    def pixel_bytes(self) -> int:
        return 4 if self.layout == "RGBX" else self.shape[2]


# What the native reader takes: u64 addresses, slots, generations and
# metadata versions. Sizes and image sides are far below that: no image
# reaches 1 TiB, or 2^31 pixels a side.
_U64 = 1 << 64
MAX_DESCRIPTOR_SIZE = 1 << 40
_MAX_SIDE = 1 << 31


def _int(value: Any, what: str, below: int = _U64) -> int:
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
    h, w, c = (_int(v, "shape", _MAX_SIDE) for v in value)
    if h == 0 or w == 0 or c not in _CHANNEL_MODES:
        raise DescriptorError(f"shape {list(value)} is not an image (H, W > 0; C in 1, 3, 4)")
    return h, w, c


def _extent(addr: Any, size: Any, addr_name: str, size_name: str) -> tuple[int, int]:
    """A remote address and size: a u64 address, a size under
    MAX_DESCRIPTOR_SIZE, and the range inside the 64-bit address space."""
    start = _int(addr, addr_name)
    length = _int(size, size_name, MAX_DESCRIPTOR_SIZE)
    if start + length > _U64:
        raise DescriptorError(f"{addr_name} + {size_name} runs past the 64-bit address space")
    return start, length


def _parse(desc: Decoded | dict[str, Any], shape: Any | None) -> _Source:
    if isinstance(desc, Decoded):
        desc = desc.to_dict()
    if not isinstance(desc, dict):
        raise DescriptorError(f"descriptor must be a dict or Decoded, not {type(desc).__name__}")
    metadata = desc.get("nixl_metadata")
    if not isinstance(metadata, str) or not metadata.startswith("b64:"):
        raise DescriptorError("nixl_metadata must be a 'b64:' string")
    if "descriptors" in desc:
        # dynamo nixl_connect RdmaMetadata: one descriptor, shape given by the caller.
        if shape is None:
            raise DescriptorError("an RdmaMetadata descriptor needs shape=")
        parts = desc["descriptors"]
        if not isinstance(parts, list) or len(parts) != 1 or not isinstance(parts[0], dict):
            raise DescriptorError("RdmaMetadata must hold exactly one descriptor")
        part = parts[0]
        device = str(part.get("device", "cpu")).lower()
        if device not in ("cpu", "dram"):
            raise DescriptorError(f"unsupported remote device {device!r}")
        notification = desc.get("notification_key")
        if not isinstance(notification, str) or not notification:
            raise DescriptorError("RdmaMetadata needs a notification_key")
        addr, size = _extent(part.get("ptr"), part.get("size"), "ptr", "size")
        return _Source(
            agent="",
            metadata=metadata,
            addr=addr,
            size=size,
            shape=_shape(shape),
            content_hash=None,
            notification=notification,
            expires_at=None,
        )
    if desc.get("dtype") != "UINT8":
        raise DescriptorError(f"dtype must be 'UINT8', not {desc.get('dtype')!r}")
    nixl = desc.get("nixl_descriptor")
    own = desc.get("pixelwire")
    if not isinstance(nixl, dict) or not isinstance(own, dict):
        raise DescriptorError("descriptor lacks nixl_descriptor or pixelwire keys")
    if nixl.get("mem_type") != "Dram":
        raise DescriptorError(f"unsupported mem_type {nixl.get('mem_type')!r}")
    content_hash = desc.get("content_hash")
    if not isinstance(content_hash, str) or not _HASH.fullmatch(content_hash):
        raise DescriptorError("content_hash must be 16 hex digits")
    notification = own.get("notification")
    if not isinstance(notification, str) or not _NOTIFICATION.fullmatch(notification):
        raise DescriptorError("pixelwire.notification is malformed")
    agent = own.get("agent")
    if not isinstance(agent, str) or not agent:
        raise DescriptorError("pixelwire.agent must name the frontend agent")
    expires_at = own.get("expires_at")
    if not isinstance(expires_at, (int, float)) or not math.isfinite(expires_at):
        raise DescriptorError("pixelwire.expires_at must be a Unix time")
    slot, generation = (_int(own.get(key), f"pixelwire.{key}") for key in ("slot", "generation"))
    addr, size = _extent(nixl.get("addr"), nixl.get("size"), "addr", "size")
    return _Source(
        metadata_version=_int(own.get("metadata_version"), "pixelwire.metadata_version"),
        slot=slot,
        generation=generation,
        agent=agent,
        metadata=metadata,
        addr=addr,
        size=size,
        shape=_shape(desc.get("shape") if shape is None else shape),
        content_hash=content_hash,
        notification=notification,
        expires_at=float(expires_at),
        layout=_layout(desc),
    )


def _layout(desc: dict[str, Any]) -> str:
    info = desc.get("metadata")
    layout = info.get("layout", "HWC") if isinstance(info, dict) else "HWC"
    if layout not in ("HWC", "RGBX"):
        raise DescriptorError(f"unsupported layout {layout!r}")
    return str(layout)


class Reader:
    """Worker side: owns one NIXL agent and a registered receive pool."""

    def __init__(
        self,
        *,
        timeout: float = 30.0,
        verify: bool = True,
        max_pixels: int = 50_000_000,
        pool_bytes: int = 256 * MiB,
        region_bytes: int = 64 * MiB,
        fetcher: Fetcher | None = None,
    ) -> None:
        self._fetcher = fetcher
        self._own_fetcher = fetcher is None
        self.timeout = timeout
        self.verify = verify
        self.max_pixels = max_pixels
        self.pool_bytes = pool_bytes
        self.region_bytes = min(region_bytes, pool_bytes)
        self._native: _native.NativeReader | None = None
        self._cuda_lock = threading.Lock()
        # device index -> (registered staging tensor, registration id)
        self._cuda_staging: dict[int, tuple[Any, int]] = {}
        # Staging a failed READ may still write: (until, tensor, registration id).
        self._cuda_quarantine: list[tuple[float, Any, int]] = []

    def _open(self) -> _native.NativeReader:
        if self._native is None:
            ensure_nixl()
            self._native = _native.NativeReader(
                pool_bytes=self.pool_bytes,
                region_bytes=self.region_bytes,
                timeout=self.timeout,
                verify=self.verify,
            )
        return self._native

    async def __aenter__(self) -> Reader:
        await asyncio.to_thread(self._open)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._own_fetcher and self._fetcher is not None:
            await self._fetcher.close()
            self._fetcher = None
        self.close()

    @property
    def fetcher(self) -> Fetcher:
        if self._fetcher is None:
            self._fetcher = _default_fetcher()
        return self._fetcher

    async def load(
        self,
        item: Decoded | PassThrough | dict[str, Any],
        *,
        output: Output = "pil",
        device: str = "cpu",
        mode: Literal["RGB", "RGBA", "L"] = "RGB",
    ) -> Any:
        """One call for both switch settings: a decoded descriptor is read
        over NIXL; a URL item is fetched with this reader's Fetcher (same
        guard) and decoded here with the same decoder, in `mode`."""
        if isinstance(item, PassThrough):
            url: Any = item.url
        else:
            url = item.get("url") if isinstance(item, dict) else None
        if url is None:
            assert not isinstance(item, PassThrough)
            return await self.read_decoded(item, output=output, device=device)
        if not isinstance(url, str):
            raise DescriptorError("a pass-through item's url must be a string")
        data = await self.fetcher.fetch(url)
        pixels = await asyncio.to_thread(_native.decode_image, data, mode=mode)
        return _as_output(pixels, output, device)

    def stats(self) -> dict[str, int]:
        """Receive-pool usage: bytes_in_use, registered_bytes, remotes."""
        return dict(self._open().stats())

    def close(self) -> None:
        native, self._native = self._native, None
        with self._cuda_lock:
            if native is not None:
                # Deregister before the tensors go back to torch's allocator.
                for _, registration in self._cuda_staging.values():
                    native.deregister(registration)
                for _, _, registration in self._cuda_quarantine:
                    native.deregister(registration)
            self._cuda_staging.clear()
            self._cuda_quarantine.clear()

    def _validate(self, source: _Source) -> None:
        h, w, c = source.shape
        if source.layout == "RGBX" and c != 3:
            raise DescriptorError("the RGBX layout holds 3-channel images only")
        if h * w * source.pixel_bytes != source.size:
            raise DescriptorError(f"shape {list(source.shape)} does not match size {source.size}")
        if h * w > self.max_pixels:
            raise DescriptorError(f"image of {h * w} pixels is over max_pixels={self.max_pixels}")
        if source.expires_at is not None and time.time() > source.expires_at:
            raise DescriptorError("the descriptor's lease has expired; the frontend has reclaimed the slot")

    async def read_decoded(
        self,
        desc: Decoded | dict[str, Any],
        *,
        output: Output = "pil",
        device: str = "cpu",
        shape: Any | None = None,
    ) -> Any:
        """Reads the pixels a descriptor names; returns a PIL image, a numpy
        array (H, W, C) or a torch tensor (H, W, C), all owning their pixels."""
        if output not in ("pil", "numpy", "torch"):
            raise ValueError(f"output must be 'pil', 'numpy' or 'torch', not {output!r}")
        source = _parse(desc, shape)
        self._validate(source)
        native = self._open()
        if device != "cpu":
            if output != "torch":
                raise ValueError("a CUDA destination needs output='torch'")
            return await asyncio.to_thread(self._read_cuda, native, source, device)
        flat = await asyncio.to_thread(
            functools.partial(native.read, content_hash=source.content_hash, **source.native_fields())
        )
        if not isinstance(flat, np.ndarray):
            # A receive slot lent zero-copy: the array keeps it until freed.
            flat = np.frombuffer(memoryview(flat), dtype=np.uint8)
        if source.layout == "RGBX":
            h, w, _ = source.shape
            if output == "pil":
                return _rgb_image_over(flat, w, h)
            return _as_output(np.ascontiguousarray(flat.reshape(h, w, 4)[:, :, :3]), output, "cpu")
        return _as_output(flat.reshape(source.shape), output, "cpu")

    def _read_cuda(self, native: _native.NativeReader, source: _Source, device: str) -> Any:
        """READ into a registered CUDA staging buffer (one per device, grown
        by replacing it), check the slot header, then copy out on the GPU.
        A staging buffer a failed READ may still write is retired until the
        transfer has surely ended."""
        import torch

        dev = torch.device(device)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        with self._cuda_lock:
            now = time.monotonic()
            for entry in [q for q in self._cuda_quarantine if q[0] <= now]:
                native.deregister(entry[2])
                self._cuda_quarantine.remove(entry)
            staging = self._cuda_staging.get(index)
            if staging is None or staging[0].numel() < source.size:
                if staging is not None:
                    native.deregister(staging[1])
                size = max(source.size, self.region_bytes)
                tensor = torch.empty(size, dtype=torch.uint8, device=torch.device("cuda", index))
                registration = native.register(
                    addr=tensor.data_ptr(), size=size, mem_type="Vram", device=index
                )
                staging = self._cuda_staging[index] = (tensor, registration)
            tensor, registration = staging
            try:
                native.read_into(
                    local_addr=tensor.data_ptr(), mem_type="Vram", device=index, **source.native_fields()
                )
            except PixelwireError as error:
                if getattr(error, "may_land", True):
                    del self._cuda_staging[index]
                    self._cuda_quarantine.append((time.monotonic() + 2 * self.timeout, tensor, registration))
                raise
            h, w, c = source.shape
            pixels = tensor[: source.size].view(h, w, source.pixel_bytes)
            return pixels[:, :, :c].clone(memory_format=torch.contiguous_format)


def _rgb_image_over(flat: npt.NDArray[np.uint8], width: int, height: int) -> Any:
    """An RGB PIL image over RGBX bytes, without a copy: Pillow keeps RGB at
    four bytes a pixel, so its map_buffer (what ``Image.frombuffer`` calls for
    the layouts it maps) can point the image at the received pixels; the image
    holds the buffer, hence the receive slot, until it is dropped.
    ``frombuffer`` itself maps only as mode RGBX, so it is the copying fallback
    should Pillow's internals change (the tests check mode, pixels, no copy)."""
    from PIL import Image

    try:
        core = Image.core  # type: ignore[attr-defined]
        mapped = core.map_buffer(flat, (width, height), "raw", 0, ("RGB", 0, 1))
        image = Image.new("RGB", (0, 0))._new(mapped)
        if image.mode == "RGB" and image.size == (width, height):
            image.readonly = 1  # writes copy first, as for frombuffer
            return image
    except (AttributeError, TypeError, ValueError):
        pass
    return Image.frombuffer("RGBX", (width, height), flat, "raw", "RGBX", 0, 1).convert("RGB")


def _as_output(pixels: npt.NDArray[np.uint8], output: Output, device: str) -> Any:
    """The (H, W, C) pixels as the caller asked: numpy, PIL or torch."""
    if output == "numpy":
        return pixels
    if output == "torch":
        import torch

        tensor = torch.from_numpy(pixels)
        return tensor if device == "cpu" else tensor.to(device)
    from PIL import Image

    c = pixels.shape[2]
    return Image.fromarray(pixels[:, :, 0] if c == 1 else pixels, _CHANNEL_MODES[c])


_default_publisher: Publisher | None = None
_default_reader: Reader | None = None


def default_publisher() -> Publisher:
    """The process-wide Publisher, configured from PIXELWIRE_* variables."""
    global _default_publisher
    if _default_publisher is None:
        _default_publisher = Publisher(
            pool_bytes=_env_int("PIXELWIRE_POOL_BYTES", 256 * MiB),
            lease_seconds=_env_float("PIXELWIRE_LEASE_SECONDS", 60.0),
            acquire_timeout=_env_float("PIXELWIRE_ACQUIRE_TIMEOUT", 10.0),
        )
    return _default_publisher


def default_reader() -> Reader:
    """The process-wide Reader, configured from PIXELWIRE_* variables."""
    global _default_reader
    if _default_reader is None:
        _default_reader = Reader(
            timeout=_env_float("PIXELWIRE_READ_TIMEOUT", 30.0),
            verify=_env_flag("PIXELWIRE_VERIFY", True),
            pool_bytes=_env_int("PIXELWIRE_READER_POOL_BYTES", 256 * MiB),
        )
    return _default_reader


async def decode_and_publish(
    source: bytes | bytearray | memoryview | str, *, mode: Literal["RGB", "RGBA", "L"] = "RGB"
) -> Decoded | PassThrough:
    """`Publisher.decode_and_publish` on the default publisher."""
    return await default_publisher().decode_and_publish(source, mode=mode)


async def read_decoded(
    desc: Decoded | dict[str, Any], *, output: Output = "pil", device: str = "cpu", shape: Any | None = None
) -> Any:
    """`Reader.read_decoded` on the default reader."""
    return await default_reader().read_decoded(desc, output=output, device=device, shape=shape)
