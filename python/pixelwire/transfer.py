"""The process-wide publisher and reader, and the one-call API on them.

:func:`decode_and_publish` and :func:`read_decoded` use a
:class:`~pixelwire.Publisher` and a :class:`~pixelwire.Reader` made once per
process from the ``PIXELWIRE_*`` environment (:mod:`pixelwire.config`). The
classes themselves live in :mod:`pixelwire.publisher`,
:mod:`pixelwire.reader` and :mod:`pixelwire.descriptor`; the names below
stay importable from here for code written against earlier releases.
"""

from __future__ import annotations

import threading
from typing import Any

from pixelwire.config import DECODED_MODES, MiB, Mode, Output, PublisherSettings, ReaderSettings
from pixelwire.descriptor import Decoded, PassThrough
from pixelwire.nixl import ensure_nixl, nixl_library_path
from pixelwire.publisher import Publisher
from pixelwire.reader import Reader

_default_publisher: Publisher | None = None
_default_reader: Reader | None = None
_defaults_lock = threading.Lock()


def default_publisher() -> Publisher:
    """The process-wide Publisher, configured from PIXELWIRE_* variables."""
    global _default_publisher
    with _defaults_lock:
        if _default_publisher is None:
            _default_publisher = Publisher(PublisherSettings.from_env())
        return _default_publisher


def default_reader() -> Reader:
    """The process-wide Reader, configured from PIXELWIRE_* variables."""
    global _default_reader
    with _defaults_lock:
        if _default_reader is None:
            _default_reader = Reader(ReaderSettings.from_env())
        return _default_reader


async def decode_and_publish(
    source: bytes | bytearray | memoryview | str, *, mode: Mode = "RGB"
) -> Decoded | PassThrough:
    """`Publisher.decode_and_publish` on the default publisher."""
    return await default_publisher().decode_and_publish(source, mode=mode)


async def read_decoded(
    desc: Decoded | dict[str, Any], *, output: Output = "pil", device: str = "cpu", shape: Any | None = None
) -> Any:
    """`Reader.read_decoded` on the default reader."""
    return await default_reader().read_decoded(desc, output=output, device=device, shape=shape)


__all__ = [
    "DECODED_MODES",
    "Decoded",
    "MiB",
    "PassThrough",
    "Publisher",
    "Reader",
    "decode_and_publish",
    "default_publisher",
    "default_reader",
    "ensure_nixl",
    "nixl_library_path",
    "read_decoded",
]
