"""Sizes in bytes as people write them: :func:`parse_bytes`, the one parser
of every ``*_bytes`` option and variable."""

from __future__ import annotations

import re

# Size units: binary (KiB, MiB, GiB, TiB: powers of 1024) and decimal (kB,
# MB, GB, TB: powers of 1000), as Kubernetes spells quantities; the B is
# optional and the case ignored, so 1GiB, 1gi and 1 GiB are one size and 2G
# is 2,000,000,000 bytes.
_SIZE_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]{0,2}?)b?\s*", re.IGNORECASE)


def parse_bytes(text: str | int) -> int:
    """A size in bytes: a whole number of bytes, or a number with a unit
    (``512MiB``, ``1GiB``, ``2G``, ``1.5 GB``: see ``_SIZE_UNITS``); the one
    parser of every ``*_bytes`` option and variable. ``ValueError`` for
    anything else, negative sizes included."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"a size cannot be negative: {text}")
        return text
    match = _SIZE.fullmatch(str(text))
    unit = _SIZE_UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise ValueError(
            f"{text!r} is not a size: give bytes (268435456) or a number with a unit "
            "(KiB, MiB, GiB, TiB: powers of 1024; kB, MB, GB, TB: powers of 1000; e.g. 256MiB, 1GiB)"
        )
    number = match.group(1)
    if "." not in number:
        return int(number) * unit
    return round(float(number) * unit)
