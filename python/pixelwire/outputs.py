"""Pixels as the caller asked for them: a numpy array, a PIL image or a
torch tensor, each (H, W, C) and owning (or holding) its pixels."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pixelwire.config import Output
from pixelwire.descriptor import CHANNEL_MODES

OUTPUTS: tuple[Output, ...] = ("pil", "numpy", "torch")


def pillow() -> Any:
    """Pillow's ``PIL.Image``, which ``output="pil"`` needs; the package
    does not (only its ``[pil]`` extra), so without it this says which
    extra to install, or to ask for numpy."""
    try:
        from PIL import Image
    except ImportError:
        raise ModuleNotFoundError(
            "output='pil' needs Pillow, which pixelwire installs only with its pil extra: "
            "pip install 'pixelwire[pil]' (or ask for output='numpy')",
            name="PIL",
        ) from None
    return Image


def torch_module() -> Any:
    """PyTorch, which ``output="torch"`` needs; pixelwire does not install
    it (the build depends on the host's CUDA), so without it this says so,
    or to ask for numpy."""
    try:
        import torch
    except ImportError:
        raise ModuleNotFoundError(
            "output='torch' needs PyTorch, which pixelwire does not install: pip install torch (the "
            "build for your CUDA: https://pytorch.org), or ask for output='numpy'",
            name="torch",
        ) from None
    return torch


def as_output(pixels: npt.NDArray[np.uint8], output: Output, device: str = "cpu") -> Any:
    """The (H, W, C) pixels as the caller asked: numpy, PIL or torch (on
    ``device``)."""
    if output == "numpy":
        return pixels
    if output == "torch":
        tensor = torch_module().from_numpy(pixels)
        return tensor if device == "cpu" else tensor.to(device)
    Image = pillow()
    c = pixels.shape[2]
    return Image.fromarray(pixels[:, :, 0] if c == 1 else pixels, CHANNEL_MODES[c])


def rgb_image_over(flat: npt.NDArray[np.uint8], width: int, height: int) -> Any:
    """An RGB PIL image over RGBX bytes, without a copy: Pillow keeps RGB at
    four bytes a pixel, so its map_buffer (what ``Image.frombuffer`` calls for
    the layouts it maps) can point the image at the received pixels; the image
    holds the buffer, hence the receive slot, until it is dropped.
    ``frombuffer`` itself maps only as mode RGBX, so it is the copying fallback
    should Pillow's internals change (the tests check mode, pixels, no copy)."""
    Image = pillow()
    try:
        core = Image.core
        mapped = core.map_buffer(flat, (width, height), "raw", 0, ("RGB", 0, 1))
        image = Image.new("RGB", (0, 0))._new(mapped)
        if image.mode == "RGB" and image.size == (width, height):
            image.readonly = 1  # writes copy first, as for frombuffer
            return image
    except (AttributeError, TypeError, ValueError):
        pass
    return Image.frombuffer("RGBX", (width, height), flat, "raw", "RGBX", 0, 1).convert("RGB")
