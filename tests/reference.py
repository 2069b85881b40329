"""vLLM's image loader (0.32's ``ImageMediaIO.load_bytes``), reproduced with
Pillow: the yardstick for pixels.

vLLM opens the bytes with Pillow, applies the EXIF orientation
(``ImageOps.exif_transpose``), keeps the mode if it matches, and for RGB
composites anything with transparency (RGBA, LA, PA, or a ``transparency``
entry: palette or tRNS) onto a background colour through RGBA; every other
change is ``convert``.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpus" / "pillow"

# Formats whose decoders are exact (no DCT): their pixels must match exactly.
LOSSLESS_FORMATS = {"PNG", "GIF", "BMP", "TIFF", "ICO", "TGA", "PPM", "QOI"}


def corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.iterdir() if p.is_file() and p.name != "LICENSE")


def vllm_load(
    data: bytes,
    mode: str = "RGB",
    background: tuple[int, int, int] = (255, 255, 255),
    exif_transpose: bool = True,
) -> tuple[str, np.ndarray]:
    """Returns (Pillow format, pixels) the way vLLM's loader produces them."""
    with warnings.catch_warnings():
        # Pillow warns on some odd files it still decodes; the reference
        # records the pixels, not the warnings.
        warnings.simplefilter("ignore")
        image = Image.open(io.BytesIO(data))
        fmt = image.format or "?"
        image.load()
        if exif_transpose:
            image = ImageOps.exif_transpose(image)
        if image.mode != mode:
            transparent = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
            if mode == "RGB" and transparent:
                if image.mode != "RGBA":
                    image = image.convert("RGBA")
                converted = Image.new("RGB", image.size, background)
                converted.paste(image, mask=image.split()[3])
                image = converted
            else:
                image = image.convert(mode)
        array = np.asarray(image)
    if array.ndim == 2:
        array = array[:, :, None]
    return fmt, array


def is_lossy(fmt: str, data: bytes) -> bool:
    """JPEG always; WebP when it holds a VP8 (lossy) bitstream."""
    if fmt == "JPEG":
        return True
    return fmt == "WEBP" and b"VP8 " in data[:4096]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def assert_same_pixels(fmt: str, data: bytes, got: np.ndarray, expected: np.ndarray, what: str = "") -> None:
    """Same shape; identical pixels, or PSNR >= 40 dB for lossy formats."""
    assert got.shape == expected.shape, what
    if is_lossy(fmt, data):
        assert psnr(got, expected) >= 40.0, what
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)
