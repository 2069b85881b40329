from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, TypedDict, final

import numpy as np
import numpy.typing as npt

__version__: str

class RemoteSource(Protocol):
    """What the native reader reads of a parsed descriptor
    (``pixelwire.descriptor.RemoteImage``), by attribute."""

    @property
    def agent(self) -> str: ...
    @property
    def metadata(self) -> str: ...
    @property
    def addr(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def notification(self) -> str: ...
    @property
    def content_hash(self) -> str | None: ...
    @property
    def metadata_version(self) -> int | None: ...
    @property
    def metadata_pruned(self) -> int | None: ...
    @property
    def slot(self) -> int | None: ...
    @property
    def generation(self) -> int | None: ...

class NativeReaderSettings(Protocol):
    """What the native reader reads of ``pixelwire.config.ReaderSettings``,
    by attribute (Python owns the defaults and the checks)."""

    @property
    def pool_bytes(self) -> int: ...
    @property
    def region_bytes(self) -> int: ...
    @property
    def timeout(self) -> float: ...
    @property
    def verify(self) -> bool: ...
    @property
    def progress_thread(self) -> bool: ...
    @property
    def read_threads(self) -> int: ...
    @property
    def split_min_bytes(self) -> int: ...
    @property
    def chunk_bytes(self) -> int: ...
    @property
    def hash_threads(self) -> int: ...

class PixelwireError(Exception):
    """Base class of every pixelwire error."""

class DecodeError(PixelwireError):
    """The image data is corrupt, truncated or cannot be decoded: ``index``
    is the position of the failed input in a :func:`decode_many` batch (None
    outside one)."""

    index: int | None
    def __init__(self, message: str = "", *args: object, index: int | None = None) -> None: ...

class UnsupportedFormat(DecodeError):
    """The data is not in an image format pixelwire decodes."""

class ImageTooLarge(DecodeError):
    """The image is over a configured limit: ``setting`` names the field of
    ``Limits`` (``max_bytes``, ``max_pixels``, ``max_side``), ``limit`` is
    its value and ``actual`` the image's; all three are None when a
    decoder's own memory bound refused it."""

    setting: str | None
    limit: int | None
    actual: int | None
    def __init__(
        self,
        message: str = "",
        *args: object,
        index: int | None = None,
        setting: str | None = None,
        limit: int | None = None,
        actual: int | None = None,
    ) -> None: ...

class VideoDecodeError(DecodeError):
    """The video cannot be read: not a supported container, corrupt or
    truncated, no video stream or no decodable frame."""

class UnsupportedVideo(VideoDecodeError):
    """The video stream is in a codec pixelwire does not decode."""

class UnidentifiedMedia(DecodeError):
    """Bytes for vLLM's own video or audio loader are not one media container pixelwire identifies."""

class VideoFrameCountChanged(VideoDecodeError):
    """A read found the frame count the capture gave before it wrong (the
    end-of-stream check was shared with the read): open the video again with
    ``settle_count=True`` and sample again."""

class VideoTooLarge(ImageTooLarge):
    """The video is over a ``VideoLimits`` setting (``max_bytes``,
    ``max_frames``, ``max_pixels``, ``max_frame_bytes``, ``max_seconds``)."""

class FetchError(PixelwireError):
    """An image URL could not be fetched: ``status`` is the HTTP status (None
    when not HTTP), ``retryable`` whether a retry may succeed."""

    status: int | None
    retryable: bool
    def __init__(
        self, message: str = "", *args: object, status: int | None = None, retryable: bool = False
    ) -> None: ...

class BlockedURL(FetchError):
    """An image URL was refused by the SSRF guard or the domain allow-list."""

class DescriptorError(PixelwireError):
    """A pixel descriptor is malformed, out of bounds or inconsistent."""

class TransferError(PixelwireError):
    """A NIXL transfer failed, timed out or failed verification: ``may_land``
    says whether a failed READ may still write the caller's memory it was
    reading into (:meth:`NativeReader.read_into`, CUDA reads; False
    otherwise). Registered memory it may write is quarantined by the
    reader."""

    may_land: bool
    def __init__(self, message: str = "", *args: object, may_land: bool = False) -> None: ...

class PoolExhausted(PixelwireError):
    """No registered pool slot became free within the acquire timeout."""

class Cancelled(PixelwireError):
    """The caller gave the work up (its request went away) before it was done."""

@final
class BatchControl:
    """A handle on a running :meth:`NativePublisher.publish_many` batch, for
    :meth:`NativePublisher.cancel`, or on a :class:`VideoCapture`."""
    def __new__(cls) -> BatchControl: ...
    @property
    def cancelled(self) -> bool: ...
    def cancel(self) -> None:
        """Cancels work that publishes nothing (a :class:`VideoCapture`
        opened or read with this control stops within a frame); a
        publisher's batch is cancelled with :meth:`NativePublisher.cancel`,
        which also frees what it published."""

@final
class Limits:
    """Decoding limits, checked from the header before pixel memory is taken."""

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

@final
class VideoLimits:
    """Bounds on one video, checked before the memory they guard is taken."""

    def __new__(
        cls,
        *,
        max_bytes: int | None = None,
        max_frames: int | None = None,
        max_pixels: int | None = None,
        max_frame_bytes: int | None = None,
        max_seconds: int | None = None,
        max_decode_pixels: int | None = None,
    ) -> VideoLimits: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def max_frames(self) -> int: ...
    @property
    def max_pixels(self) -> int: ...
    @property
    def max_frame_bytes(self) -> int: ...
    @property
    def max_seconds(self) -> int: ...
    @property
    def max_decode_pixels(self) -> int: ...

class VideoInfo(TypedDict):
    width: int
    height: int
    frame_count: int
    header_frame_count: int
    frame_count_settled: bool
    fps: float
    duration: float
    rotation: int
    threads: int
    codec: str
    pix_fmt: str

@final
class VideoCapture:
    """An opened in-memory video, read as ``cv2.VideoCapture`` reads it."""

    def __new__(
        cls,
        data: Buffer,
        *,
        threads: int = 0,
        limits: VideoLimits | None = None,
        settle_count: bool = False,
        control: BatchControl | None = None,
        client: str | None = None,
    ) -> VideoCapture:
        """Opens ``data`` and reads its headers. With ``settle_count`` the
        frame count is settled here, decoding the end of the stream as
        OpenCV's seek to the end does; without it that decoding is shared
        with ``read`` where it can be (an H.264 or HEVC stream whose end is
        behind an IDR picture, a VP9 stream whose end is behind a shown key
        frame), ``frame_count`` is then the header's,
        provisionally, and ``read`` raises ``VideoFrameCountChanged`` if
        OpenCV would have counted otherwise. Once ``control`` is cancelled,
        the open and the read stop within a frame and raise
        :class:`Cancelled`. With ``client`` (whose decoding this is), the
        open and the read take turns with the process's other decodes that
        name a client (:func:`configure_video_turns`)."""
    def info(self) -> VideoInfo: ...
    def read_plan(self, indices: list[int]) -> list[list[int]]:
        """The pieces a :meth:`read` of ``indices`` decodes at once, each a
        sorted list of indices (one piece: the read is not split). Only
        H.264 and HEVC streams are split, at IDR pictures, and only with
        more than one decoder thread."""
    def read(
        self,
        indices: Sequence[int],
        *,
        rgb_direct: bool = False,
        resize: tuple[int, int] | None = None,
        resize_kernel: Literal["torchvision", "pillow"] = "torchvision",
        resize_filter: Literal["bicubic", "bilinear"] = "bicubic",
    ) -> tuple[npt.NDArray[np.uint8], list[int]]:
        """Decodes the decodable frames of ``indices`` (sorted, each once)
        as a (T, H, W, 3) uint8 RGB array and their indices; with
        ``resize=(height, width)``, each frame resized to that size with the
        named processor arithmetic, as ``NativePublisher.publish_video``
        resizes. Reads once."""
    def packets_decoded(self) -> int:
        """Packets the decoder has been given since open: by the
        end-of-stream check and, once read, by the read."""
    def read_times(self) -> list[PieceTimes]:
        """Where the :meth:`read`'s time went, one dict a piece in frame
        order (one: the read was not split); empty before a read."""
    def close(self) -> None: ...

class PieceTimes(TypedDict):
    frames: int
    threads: int
    packets: int
    open_ms: float
    first_frame_ms: float
    decode_ms: float
    convert_ms: float

class ProbeResult(TypedDict):
    format: str
    width: int
    height: int
    color_type: str
    orientation: int
    oriented_size: tuple[int, int]

Buffer = bytes | bytearray | memoryview

Normalize = tuple[str, tuple[float, float, float], tuple[float, float, float], float]

def decode_image(
    data: Buffer,
    *,
    mode: Literal["RGB", "RGBA", "L"] = "RGB",
    background: tuple[int, int, int] = (255, 255, 255),
    limits: Limits | None = None,
    apply_exif_orientation: bool = True,
    resize: tuple[int, int] | Sequence[tuple[int, int]] | None = None,
    resize_kernel: Literal["torchvision", "pillow"] = "torchvision",
    resize_filter: Literal["bicubic", "bilinear", "lanczos"] = "bicubic",
    patches: tuple[int, int, int] | None = None,
    normalize: Normalize | None = None,
) -> npt.NDArray[Any]:
    """Decodes an image to a C-contiguous ``uint8`` array of shape (H, W, C),
    as vLLM's loader would (EXIF orientation, Pillow's mode conversion,
    RGBA composited onto ``background`` for RGB); with ``resize=(height,
    width)``, resized right after decoding with the named processor
    arithmetic (``resize=[(h1, w1), (height, width)]``: through the first
    size, for a processor that resizes twice in a row). With
    ``patches=(patch_size, temporal_patch_size, merge_size)`` (RGB only), the
    (resized) image laid out as a Qwen2-VL processor's uint8 patch rows,
    shape (rows, row length, 1); with ``normalize=(backend, image_mean,
    image_std, rescale_factor)`` too, the processor's float32 normalised
    rows instead, as its ``backend`` ("torchvision") computes them, bit for
    bit (the array is then float32). The GIL is released while it decodes."""

def join_patch_rows(
    parts: Sequence[npt.NDArray[np.uint8]],
    copies: Sequence[int],
    normalize: tuple[str, tuple[float, float, float], tuple[float, float, float], float] | None = None,
) -> npt.NDArray[np.uint8]:
    """``parts`` (2-D uint8 arrays of a processor's patch rows, C-contiguous)
    joined in order into one new array (rows, row length, 1), part ``i``'s
    every block (a row is three channel blocks) repeated ``copies[i]``
    times; every part must land at one row length. With ``normalize`` (as
    for :func:`decode_image`), each byte lands as the processor's float32
    normalised value: the array is then (rows, row length, 4), each value's
    four native-endian bytes. The GIL is released while it copies."""

def video_patch_rows(
    frames: npt.NDArray[np.uint8],
    patches: tuple[int, int, int],
    normalize: tuple[str, tuple[float, float, float], tuple[float, float, float], float] | None = None,
) -> npt.NDArray[np.uint8]:
    """The rows a video processor (transformers' ``Qwen2VLVideoProcessor``,
    ``Qwen3VLVideoProcessor``) makes of ``frames`` (T, H, W, 3 uint8,
    C-contiguous, at its size) with ``patches=(patch_size,
    temporal_patch_size, merge_size)``: each group of temporal-patch
    consecutive frames laid out as an image's rows with frame ``t`` in
    temporal slot ``t``, the last group filled with the last frame. (rows,
    row length, 1) uint8, or with ``normalize`` (as for
    :func:`decode_image`) (rows, row length, 4), each value's four
    native-endian float32 bytes. The GIL is released while it lays them out."""

def decode_many(
    inputs: Sequence[Buffer],
    *,
    mode: Literal["RGB", "RGBA", "L"] = "RGB",
    background: tuple[int, int, int] = (255, 255, 255),
    limits: Limits | None = None,
    apply_exif_orientation: bool = True,
    resize: tuple[int, int] | Sequence[tuple[int, int]] | None = None,
    resize_kernel: Literal["torchvision", "pillow"] = "torchvision",
    resize_filter: Literal["bicubic", "bilinear", "lanczos"] = "bicubic",
    threads: int | None = None,
) -> list[npt.NDArray[np.uint8]]:
    """Decodes every image of ``inputs`` as :func:`decode_image` would with
    the same options, on a pool of ``threads`` native threads (every core
    when None; pools are kept for the next call), each taking the next
    image as it finishes one, the largest encoded inputs first (a batch of
    one image is decoded on the calling thread), with the GIL released
    throughout. Returns the arrays in input order. The first input (lowest
    index) that fails raises its error (:class:`DecodeError` or a subclass)
    with ``index`` set to its position and the message prefixed with
    ``image <index>:``; inputs after it may be left undecoded. ``limits``
    apply to each image. ``bytes`` inputs are read in place, other buffers
    copied first."""

def probe_image(data: Buffer, *, limits: Limits | None = None) -> ProbeResult:
    """Reads the header only: format, stored size, source mode, EXIF
    orientation, and the (height, width) once oriented."""

def scan_json_body(raw: bytes, min_len: int, prefix: str) -> tuple[bytes | None, int, list[tuple[int, int]]]:
    """A request body's large ``data:`` URL string values cut out: (the
    skeleton with ``"<prefix><n>"`` in their place, or None when none was
    cut; an upper bound on its JSON values; each cut string's contents as a
    byte range of ``raw``)."""

def configure_video_turns(calls: int) -> int:
    """Sets how many of the decodes that name a client run at once (at
    least one); the others wait for a turn, handed on between packets to
    the client that has had least decoding time. Returns the number set."""

def ffmpeg_components() -> dict[str, list[str]]:
    """The bundled FFmpeg's ``demuxers``, input ``protocols`` and ``decoders``."""

def identify_container(data: Buffer, medium: Literal["video", "audio", "image"]) -> str:
    """The container ``data`` is (``mp4``, ``matroska``, ``avi``, ``wav``,
    ``flac``, ``ogg``, ``mpeg-audio``, ``aiff``; for an image, the format
    as Pillow names it: ``JPEG``, ``PNG``, ``GIF``, ``WEBP``, ``BMP``,
    ``TIFF``, ``ICO``, ``PPM``, ``QOI``), identified from the signature its
    own bytes start with before another party's loader of ``medium`` is
    handed them; raises
    :class:`UnidentifiedMedia` for anything else, and for bytes that a
    demuxer opening other resources (SDP, DASH) would match."""

def decode_data_url(url: str) -> tuple[str, bytes]:
    """Decodes an RFC 2397 base64 ``data:`` URL: returns (media type, bytes)."""

def content_hash(data: Buffer) -> str:
    """The descriptors' ``content_hash`` of a buffer: ``xxh3-256k:`` and 16 hex
    digits, the xxh3-64 of the xxh3-64 digests of its 256 KiB pieces."""

def is_content_hash(text: str) -> bool:
    """Whether ``text`` has the form of a ``content_hash`` (``xxh3-256k:`` and 16 lowercase hex digits)."""

def notification_for(slot: int, generation: int, handout: int = 0) -> str:
    """The notification that ends hand-out ``handout`` of a published slot
    (``pw1:<slot>:<generation>``, and ``:<handout>`` for any but the first):
    the frontend mints it, a reader sends it back after its READ."""

def parse_notification(text: str) -> tuple[int, int, int] | None:
    """(slot, generation, hand-out) of a notification in its one written form, else None."""

def load_nixl(path: str) -> None:
    """Loads NIXL's C API from ``path`` (once per process)."""

MIN_LEASE_SECONDS: float
# Bytes of the header before each slot's pixels: a slot takes this much more pool.
SLOT_HEADER_BYTES: int

class PublishedSlot(TypedDict):
    """The fields of a published slot, as every publish returns them."""

    metadata: str
    metadata_version: int
    metadata_pruned: int
    addr: int
    size: int
    content_hash: str
    slot: int
    generation: int
    expires_at: float
    handout: int
    notification: str

class HandOut(TypedDict):
    """What ``NativePublisher.hand_out`` returns: a new hand-out's fields."""

    handout: int
    notification: str
    expires_at: float
    metadata: str
    metadata_version: int
    metadata_pruned: int

class Published(PublishedSlot):
    """What ``NativePublisher.publish`` returns; the descriptor is built from it."""

    shape: tuple[int, int, int]
    source_shape: tuple[int, int]
    format: str
    color_type: str

class PublishedVideo(PublishedSlot):
    """What ``NativePublisher.publish_video`` returns."""

    shape: tuple[int, int, int, int]
    indices: list[int]

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
        mode: Literal["RGB", "RGBA", "L"] = "RGB",
        background: tuple[int, int, int] = (255, 255, 255),
        rgbx: bool = False,
        patches: tuple[int, int, int] | None = None,
        normalize: Normalize | None = None,
        resize: tuple[int, int] | Sequence[tuple[int, int]] | None = None,
        resize_kernel: Literal["torchvision", "pillow"] = "torchvision",
        resize_filter: Literal["bicubic", "bilinear", "lanczos"] = "bicubic",
    ) -> Published:
        """Decodes ``data`` into a pool slot and starts its lease (GIL released).
        ``patches=(patch_size, temporal_patch_size, merge_size)`` (RGB only,
        not with ``rgbx``) lays the resized image out as a Qwen2-VL
        processor's uint8 patch rows: ``shape`` is then (rows, row length, 1);
        with ``normalize=`` (as :func:`decode_image`'s), its float32 rows,
        four bytes a value: (rows, row length, 4)."""
    def publish_many(
        self,
        inputs: Sequence[Buffer],
        *,
        mode: Literal["RGB", "RGBA", "L"] = "RGB",
        background: tuple[int, int, int] = (255, 255, 255),
        rgbx: bool = False,
        patches: tuple[int, int, int] | None = None,
        normalize: Normalize | None = None,
        resizes: Sequence[tuple[int, int] | Sequence[tuple[int, int]] | None] | None = None,
        resize_kernel: Literal["torchvision", "pillow"] = "torchvision",
        resize_filter: Literal["bicubic", "bilinear", "lanczos"] = "bicubic",
        threads: int | None = None,
        control: BatchControl | None = None,
    ) -> list[Published | PixelwireError | ValueError]:
        """:meth:`publish` for every input, input ``i`` resized to
        ``resizes[i]`` when that is not None, decoded side by side on a pool
        of ``threads`` native threads (every core when None), shared out
        image by image, round-robin, with the other batches running, with
        the GIL released. One item per input, in
        order: its fields, or the exception it failed with (returned, not
        raised, ``index`` unset: its position says which input; the others
        are published all the same and their slots are the caller's). A
        batch of one is decoded on the calling thread. Raises only for
        options no input could be published with. After :meth:`cancel` of
        ``control``, inputs not yet published come back as
        :class:`Cancelled`."""
    def publish_video(
        self,
        capture: VideoCapture,
        indices: Sequence[int],
        *,
        control: BatchControl | None = None,
        resize: tuple[int, int] | Sequence[tuple[int, int]] | None = None,
        resize_kernel: Literal["torchvision", "pillow"] = "torchvision",
        resize_filter: Literal["bicubic", "bilinear", "lanczos"] = "bicubic",
    ) -> PublishedVideo:
        """Decodes the frames ``indices`` of ``capture`` (each once, in
        order; frames that do not decode are left out), each resized to
        ``resize`` when given, straight into one slot and starts its lease
        (GIL released). ``shape`` is (T, H, W, 3), ``indices`` the frames
        decoded. Reads (and closes) the capture. After :meth:`cancel` of
        ``control`` the wait for a slot and the decoding stop, and what was
        published is freed: raises :class:`Cancelled`."""
    def release(self, slot: int, generation: int, handout: int = 0) -> bool:
        """Ends hand-out ``handout`` of a slot, which is freed when nothing
        else holds it (no other hand-out, no cache pin); False when that
        hand-out had ended already."""
    def pin(self, slot: int, generation: int, budget: int) -> bool:
        """Pins a published slot for a cache: it stays, with no hand-out
        outstanding, until evicted; the least recently used pins are taken
        off to keep the pinned bytes within ``budget``, and by a publish that
        finds the pool full. False when it cannot be pinned (gone, pinned
        already, or larger than ``budget``)."""
    def unpin(self, slot: int, generation: int) -> bool:
        """Takes the pin off; the slot is freed once its hand-outs end."""
    def hand_out(self, slot: int, generation: int) -> HandOut | None:
        """A new hand-out of a pinned slot, with its own lease and
        notification (a use, for the eviction order); None when the slot is
        no longer pinned at ``generation``."""
    def take_evicted(self) -> list[tuple[int, int]]:
        """(slot, generation) of every pin taken off since the last call."""
    def cancel(self, control: BatchControl) -> int:
        """Gives up the batch ``control`` was passed to: frees every slot it
        published, stops its waits for a slot and skips what it has not
        started; each image still decoding is freed once published. The
        number of slots this call freed."""
    def stats(self) -> dict[str, int]: ...
    def close(self) -> None: ...

@final
class NativeReader:
    def __new__(cls, settings: NativeReaderSettings) -> NativeReader:
        """A NIXL agent and its receive pool, as ``settings`` say."""
    @property
    def agent_name(self) -> str: ...
    @property
    def remote_count(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def read(self, image: RemoteSource) -> npt.NDArray[np.uint8] | PixelBuffer:
        """READs the image into host memory: an array owning the pixels, or a
        receive slot lent zero-copy. The content hash is checked when the
        reader verifies and the descriptor has one; the slot header always."""
    def start_read(self, image: RemoteSource, signal: ReadSignal | None = None) -> ReadTicket:
        """Starts :meth:`read` on a native background thread; returns at once.
        With ``signal``, the signal is raised once the read has finished."""
    def register(
        self,
        *,
        addr: int,
        size: int,
        mem_type: Literal["Dram", "Vram"],
        device: int,
        owner: object | None = None,
    ) -> int:
        """Registers caller memory for :meth:`read_into` and CUDA reads;
        returns its id. ``owner`` (the tensor the memory belongs to) is kept
        as long as the registration; without one the caller keeps the
        memory allocated for the reader's life."""
    def deregister(self, id: int) -> bool:
        """Gives registered memory up: deregistered now, or, while a failed
        READ may still write it, once its quarantine (twice the read
        timeout) ends, its owner kept until then. False for an unknown id."""
    def quarantined(self, id: int) -> bool:
        """Whether a failed READ may still write registered memory ``id``:
        reads into it are refused until then (give it up, use other memory)."""
    def read_into(
        self,
        image: RemoteSource,
        *,
        local_addr: int,
        mem_type: Literal["Dram", "Vram"],
        device: int,
        chunk_bytes: int | None = None,
        on_chunk: Callable[[int, int], object] | None = None,
    ) -> None:
        """READs the image into registered caller memory, then checks the
        slot header. With ``chunk_bytes`` the READ goes in chunks and
        ``on_chunk(offset, length)`` is called as each lands (before the
        check: only a normal return says the bytes are the published ones). A
        failure's ``may_land`` says whether the READ may still write the
        destination; registered memory it may write is quarantined
        (:meth:`quarantined`). Into host memory the content hash is checked
        too when the reader verifies (chunks are then whole 256 KiB hash
        pieces)."""
    def start_read_to_cuda(
        self,
        image: RemoteSource,
        *,
        staging_addr: int,
        device: int,
        stream: int,
        chunk_bytes: int,
        signal: ReadSignal | None = None,
    ) -> DeviceReadTicket:
        """Starts, on a native background thread, a READ into registered
        pinned host memory at ``staging_addr`` in chunks, each chunk copied
        on to CUDA device ``device`` on ``stream`` (a ``cudaStream_t``
        handle of that device) as it lands, into the device memory the
        ticket is given meanwhile (:meth:`DeviceReadTicket.copy_into`); the
        slot header and, when the reader verifies, the content hash are
        checked; the ticket is done once the READ is checked and every copy
        queued (``signal`` raised then): the device bytes are the image in
        ``stream``'s order (and the ``ready_on`` stream's); after an error
        the copies have ended. An earlier read's copies queued on
        ``stream`` are waited for before the READ writes the staging
        memory. The caller keeps both buffers until ``stream`` has run the
        copies; staging memory a failed READ may still write is quarantined
        (:meth:`quarantined`)."""

@final
class DeviceReadTicket:
    """A read started by :meth:`NativeReader.start_read_to_cuda`: given its
    device memory with :meth:`copy_into` while the READ runs; taken once."""

    def copy_into(self, device_addr: int, *, ready_on: int | None = None) -> None:
        """The device memory (room for the image, on the read's device) the
        landed chunks are copied into; ``ready_on``: a stream handle of that
        device made to wait for the copies once all are queued. Given once
        (a second call is a ``ValueError``); the first chunk to land
        waits for it, up to the reader's timeout."""
    def withhold(self) -> None:
        """No device memory for this read: the READ still ends, nothing is
        copied, and the read fails with a ``TransferError``. Dropping the ticket without
        :meth:`copy_into` does the same."""
    def wait(self, timeout: float | None = None) -> bool | None:
        """True once the read has ended well and its copies are queued (the
        device bytes are the published ones in the stream's order, and the
        ``ready_on`` stream waits for them); raises the read's error
        otherwise (every copy has ended then); None if not finished within
        ``timeout`` (as :meth:`ReadTicket.wait`)."""
    @property
    def done(self) -> bool:
        """Whether the read has finished."""

@final
class ReadSignal:
    """An eventfd that reads started with it make readable when they finish,
    for an event loop to watch."""

    def __init__(self) -> None: ...
    def fileno(self) -> int: ...
    def clear(self) -> None:
        """Makes it unreadable until the next read finishes."""

@final
class ReadTicket:
    """A read started by :meth:`NativeReader.start_read`; its result is taken once."""

    def wait(self, timeout: float | None = None) -> npt.NDArray[np.uint8] | PixelBuffer | None:
        """What :meth:`NativeReader.read` returns (or raises), once the read
        has finished: waited for up to ``timeout`` seconds without sleeping,
        or as long as it takes when ``timeout`` is None; None if it has not
        finished within ``timeout``. The GIL is released while waiting."""
    @property
    def done(self) -> bool:
        """Whether the read has finished."""

@final
class PixelBuffer:
    """Pixels in a receive slot; supports the buffer protocol."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
