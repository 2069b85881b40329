"""pixelwire: decode images natively at the frontend, hand workers raw pixels."""

from pixelwire._native import (
    DecodeError,
    ImageTooLarge,
    Limits,
    PixelwireError,
    UnsupportedFormat,
    __version__,
    decode_image,
    probe_image,
)

__all__ = [
    "DecodeError",
    "ImageTooLarge",
    "Limits",
    "PixelwireError",
    "UnsupportedFormat",
    "__version__",
    "decode_image",
    "probe_image",
]
