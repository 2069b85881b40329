"""What vLLM's image loader leaves on an image besides its pixels, for one
pixelwire decoded: ``image.info`` (the ICC profile among it) and the
``io_config`` of its ``MediaWithBytes``.

vLLM's ``ImageMediaIO.load_bytes`` opens the image with Pillow, turns it
upright and converts it to the mode asked for: an image already in that mode
is returned as Pillow opened it (its ``info`` whole, ``io_config`` None); one
composited onto the background (RGB from anything with transparency) is a
new image with an empty ``info``; any other conversion keeps ``info``. Both
are read here from the image's header alone (Pillow's ``open`` decodes no
pixels).

Bytes pixelwire does not decode go to that loader only once they are one
image format (:func:`checked_for_vllm_loader`).
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from pixelwire._native import UnidentifiedMedia
from pixelwire.loader_input import image_format

_WITH_ALPHA = frozenset({"RGBA", "LA", "PA"})


def vllm_image_metadata(
    data: bytes, mode: str, background: tuple[int, int, int]
) -> tuple[dict[Any, Any], dict[str, Any] | None]:
    """(``info``, ``io_config``) as vLLM's loader leaves them on ``data``
    loaded as ``mode`` on ``background``; when Pillow cannot read the header,
    no ``info`` and the ``io_config`` of a converted image."""
    io_config: dict[str, Any] = {"image_mode": mode, "rgba_background_color": background}
    try:
        with Image.open(io.BytesIO(data)) as header:
            source_mode = header.mode
            info: dict[Any, Any] = dict(header.info)
    except Exception:  # noqa: BLE001 - any file Pillow cannot open: pixelwire decoded it all the same
        return {}, io_config
    if source_mode == mode:
        return info, None
    if mode == "RGB" and (source_mode in _WITH_ALPHA or "transparency" in info):
        return {}, io_config
    return info, io_config


def checked_for_vllm_loader(data: bytes) -> bytes:
    """``data``, once identified natively as one image format (its
    signature: :func:`pixelwire.loader_input.image_format`) and opened
    by Pillow, as vLLM's loader opens it (every plug-in, header only), as
    that same format (or not at all: then vLLM's loader fails as that open
    did); raises :class:`pixelwire.UnidentifiedMedia` otherwise. What may
    be handed to vLLM's image loader."""
    identified = image_format(data)
    try:
        with Image.open(io.BytesIO(data)) as image:
            opened = image.format
    except Exception:  # noqa: BLE001 (whatever Pillow's open raises, vLLM's raises too)
        # vLLM's loader opens the bytes just so and fails the same way,
        # before any plug-in decodes them: its answer, whichever it is.
        return data
    if opened != identified and (identified, opened) != ("JPEG", "MPO"):
        # (Pillow names a JPEG with more pictures in it, from a camera, MPO.)
        raise UnidentifiedMedia(f"the image starts as {identified} but Pillow opens it as {opened}")
    return data
