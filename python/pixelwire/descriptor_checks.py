"""The checks every descriptor field goes through, whatever its medium: a
value of the JSON a frontend signed is refused (:class:`DescriptorError`)
unless it is what the native reader can take."""

from __future__ import annotations

import math
import re
from typing import Any

from pixelwire._native import DescriptorError
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


def checked_int(value: Any, what: str, below: int = U64) -> int:
    """A non-negative integer under ``below`` (the native u64 by default)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DescriptorError(f"{what} must be a non-negative integer, not {short(value)}")
    if value >= below:
        raise DescriptorError(f"{what} must be below 2^{below.bit_length() - 1}, not {short(value)}")
    return value


def short(value: Any) -> str:
    """A value for a message: a huge integer's repr would be thousands of digits."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() <= 128 else "a larger integer"
    return text if len(text) <= 80 else text[:77] + "..."


def checked_shape(value: Any) -> tuple[int, int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise DescriptorError(f"shape must be [H, W, C], not {short(value)}")
    h, w, c = (checked_int(v, "shape", MAX_SIDE) for v in value)
    if h == 0 or w == 0 or c not in CHANNEL_MODES:
        raise DescriptorError(f"shape {list(value)} is not an image (H, W > 0; C in 1, 3, 4)")
    return h, w, c


def extent(addr: Any, size: Any, addr_name: str, size_name: str) -> tuple[int, int]:
    """A remote address and size: a u64 address, a size under
    MAX_DESCRIPTOR_SIZE, and the range inside the 64-bit address space."""
    start = checked_int(addr, addr_name)
    length = checked_int(size, size_name, MAX_DESCRIPTOR_SIZE)
    if start + length > U64:
        raise DescriptorError(f"{addr_name} + {size_name} runs past the 64-bit address space")
    return start, length


def layout_of(desc: dict[str, Any]) -> Layout:
    info = desc.get("metadata")
    layout = info.get("layout", "HWC") if isinstance(info, dict) else "HWC"
    if layout == "HWC":
        return "HWC"
    if layout == "RGBX":
        return "RGBX"
    if layout == "PATCHES":
        return "PATCHES"
    raise DescriptorError(f"unsupported layout {short(layout)}")


def checked_background(value: Any) -> tuple[int, int, int]:
    if value is None:
        return BACKGROUND
    if not (
        isinstance(value, list) and len(value) == 3 and all(type(v) is int and 0 <= v <= 255 for v in value)
    ):
        raise DescriptorError("pixelwire.background must be [R, G, B], each 0 to 255")
    return value[0], value[1], value[2]


def positive_triple(value: Any, what: str) -> tuple[int, int, int]:
    if not (
        isinstance(value, list)
        and len(value) == 3
        and all(type(v) is int and 0 < v < MAX_SIDE for v in value)
    ):
        raise DescriptorError(f"{what} must be three positive integers, not {short(value)}")
    return value[0], value[1], value[2]


# Bytes a value of processed rows takes (the descriptor's shape[2]).


def checked_number(value: Any, what: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise DescriptorError(f"{what} must be a finite non-negative number, not {short(value)}")
    return float(value)


def source_digest_ok(value: Any) -> bool:
    """Whether ``value`` is a source SHA-256 as a descriptor carries it."""
    return isinstance(value, str) and SOURCE_SHA256.fullmatch(value) is not None
