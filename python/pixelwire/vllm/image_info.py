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
"""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

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
