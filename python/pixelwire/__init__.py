"""pixelwire: decode images natively at the frontend, hand workers raw pixels."""

from typing import TYPE_CHECKING, Any

from pixelwire._native import (
    BlockedURL,
    Cancelled,
    DecodeError,
    DescriptorError,
    FetchError,
    ImageTooLarge,
    Limits,
    PixelwireError,
    PoolExhausted,
    TransferError,
    UnidentifiedMedia,
    UnsupportedFormat,
    UnsupportedVideo,
    VideoDecodeError,
    VideoLimits,
    VideoTooLarge,
    __version__,
    content_hash,
    decode_data_url,
    decode_image,
    decode_many,
    probe_image,
)
from pixelwire.descriptor import Decoded, DecodedVideo, PassThrough
from pixelwire.publisher import Publisher
from pixelwire.reader import Reader
from pixelwire.transfer import decode_and_publish, read_decoded
from pixelwire.video import decode_video

if TYPE_CHECKING:
    from pixelwire.fetch import Fetcher, load_image


def __getattr__(name: str) -> Any:
    # The fetcher pulls in aiohttp (~0.3 s); import it only when asked for.
    if name in ("Fetcher", "load_image"):
        from pixelwire import fetch

        return getattr(fetch, name)
    raise AttributeError(f"module 'pixelwire' has no attribute {name!r}")


__all__ = [
    "BlockedURL",
    "Cancelled",
    "DecodeError",
    "Decoded",
    "DecodedVideo",
    "DescriptorError",
    "FetchError",
    "Fetcher",
    "ImageTooLarge",
    "Limits",
    "PassThrough",
    "PixelwireError",
    "PoolExhausted",
    "Publisher",
    "Reader",
    "TransferError",
    "UnidentifiedMedia",
    "UnsupportedFormat",
    "UnsupportedVideo",
    "VideoDecodeError",
    "VideoLimits",
    "VideoTooLarge",
    "__version__",
    "content_hash",
    "decode_and_publish",
    "decode_data_url",
    "decode_image",
    "decode_many",
    "decode_video",
    "load_image",
    "probe_image",
    "read_decoded",
]
