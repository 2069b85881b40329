from typing import Any, Literal, TypedDict, final

import numpy as np
import numpy.typing as npt

__version__: str

class PixelwireError(Exception): ...
class DecodeError(PixelwireError): ...
class UnsupportedFormat(DecodeError): ...
class ImageTooLarge(DecodeError): ...

class FetchError(PixelwireError):
    status: int | None
    retryable: bool

class BlockedURL(FetchError): ...
class DescriptorError(PixelwireError): ...
class TransferError(PixelwireError): ...
class PoolExhausted(PixelwireError): ...

@final
class Limits:
    def __new__(
        cls,
        *,
        max_bytes: int | None = None,
        max_pixels: int | None = None,
        max_side: int | None = None,
    ) -> Limits: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def max_pixels(self) -> int: ...
    @property
    def max_side(self) -> int: ...

class ProbeResult(TypedDict):
    format: str
    width: int
    height: int
    color_type: str
    orientation: int
    oriented_size: tuple[int, int]

Buffer = bytes | bytearray | memoryview

def decode_image(
    data: Buffer,
    *,
    mode: Literal["RGB", "RGBA", "L"] = "RGB",
    background: tuple[int, int, int] = (255, 255, 255),
    limits: Limits | None = None,
    apply_exif_orientation: bool = True,
    resize: tuple[int, int] | None = None,
    resize_kernel: Literal["torchvision", "pillow"] = "torchvision",
    resize_filter: Literal["bicubic", "bilinear"] = "bicubic",
) -> npt.NDArray[np.uint8]: ...
def probe_image(data: Buffer, *, limits: Limits | None = None) -> ProbeResult: ...
def decode_data_url(url: str) -> tuple[str, bytes]: ...
def content_hash(data: Buffer) -> str: ...
def load_nixl(path: str) -> None: ...

MIN_LEASE_SECONDS: float

@final
class NativePublisher:
    def __new__(
        cls,
        *,
        pool_bytes: int,
        region_bytes: int,
        lease_seconds: float,
        acquire_timeout: float,
        limits: Limits | None = None,
    ) -> NativePublisher: ...
    @property
    def agent_name(self) -> str: ...
    @property
    def metadata(self) -> str: ...
    def publish(
        self,
        data: Buffer,
        *,
        mode: str = "RGB",
        background: tuple[int, int, int] = (255, 255, 255),
        rgbx: bool = False,
        resize: tuple[int, int] | None = None,
        resize_kernel: str = "torchvision",
        resize_filter: str = "bicubic",
    ) -> dict[str, Any]: ...
    def release(self, slot: int, generation: int) -> bool: ...
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...

@final
class NativeReader:
    def __new__(cls, *, pool_bytes: int, region_bytes: int, timeout: float, verify: bool) -> NativeReader: ...
    @property
    def agent_name(self) -> str: ...
    @property
    def remote_count(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def read(
        self,
        *,
        agent: str,
        metadata: str,
        addr: int,
        size: int,
        notification: str,
        content_hash: str | None = None,
        metadata_version: int | None = None,
        slot: int | None = None,
        generation: int | None = None,
    ) -> npt.NDArray[np.uint8] | PixelBuffer: ...
    def register(self, *, addr: int, size: int, mem_type: str, device: int) -> int: ...
    def deregister(self, id: int) -> bool: ...
    def read_into(
        self,
        *,
        agent: str,
        metadata: str,
        addr: int,
        size: int,
        notification: str,
        local_addr: int,
        mem_type: str,
        device: int,
        metadata_version: int | None = None,
        slot: int | None = None,
        generation: int | None = None,
    ) -> None: ...

@final
class PixelBuffer:
    """Pixels in a receive slot; supports the buffer protocol."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
