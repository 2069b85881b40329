"""pixelwire: decode images natively at the frontend, hand workers raw pixels."""

from pixelwire._native import (
    BlockedURL,
    DecodeError,
    DescriptorError,
    FetchError,
    ImageTooLarge,
    Limits,
    PixelwireError,
    PoolExhausted,
    TransferError,
    UnsupportedFormat,
    __version__,
    content_hash,
    decode_data_url,
    decode_image,
    probe_image,
)
from pixelwire.transfer import (
    Decoded,
    Publisher,
    Reader,
    decode_and_publish,
    read_decoded,
)

# FetchError carries the HTTP status (None when not HTTP) and whether a retry
# may succeed; instances set their own values.
FetchError.status = None
FetchError.retryable = False

__all__ = [
    "BlockedURL",
    "DecodeError",
    "Decoded",
    "DescriptorError",
    "FetchError",
    "ImageTooLarge",
    "Limits",
    "PixelwireError",
    "PoolExhausted",
    "Publisher",
    "Reader",
    "TransferError",
    "UnsupportedFormat",
    "__version__",
    "content_hash",
    "decode_and_publish",
    "decode_data_url",
    "decode_image",
    "probe_image",
    "read_decoded",
]
