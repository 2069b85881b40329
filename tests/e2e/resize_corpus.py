"""The resize corpus: every corpus image both vLLM's loader and pixelwire
decode (RGB), and real corpus photos upscaled to 1080p and 4K (JPEG q90 and
PNG, plus a JPEG with EXIF orientation 6), each with vLLM's loader's image."""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageOps

import pixelwire

from reference import corpus_files

# Real photos of the corpus, upscaled to 1080p and 4K.
PHOTOS = ("exif_gps_typeerror.jpg", "sugarshack_bad_mpo_header.jpg", "exif-72dpi-int.jpg")
PHOTO_SIZES = ((1920, 1080), (3840, 2160))


@dataclass
class Case:
    name: str
    data: bytes
    image: Image.Image  # vLLM's loader's full image


def _vllm_load(data: bytes) -> Image.Image:
    from vllm.multimodal.media import ImageMediaIO

    with warnings.catch_warnings():
        # Pillow warns on some odd corpus files it still decodes.
        warnings.simplefilter("ignore")
        image = ImageMediaIO(image_mode="RGB").load_bytes(data)
    return getattr(image, "media", image)


def _encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def _photos() -> list[tuple[str, bytes]]:
    """Corpus photos at 1920x1080 and 3840x2160, as JPEG q90 and PNG, plus
    one EXIF-rotated JPEG per size (stored landscape, shown portrait)."""
    from reference import CORPUS

    made = []
    for name in PHOTOS:
        path = CORPUS / name
        if not path.is_file():
            continue
        base = _vllm_load(path.read_bytes())  # oriented RGB, as vLLM shows it
        stem = name.rsplit(".", 1)[0]
        for width, height in PHOTO_SIZES:
            big = ImageOps.fit(base, (width, height), Image.Resampling.LANCZOS)
            made.append((f"{stem}@{width}x{height}.jpg", _encode(big, "JPEG", quality=90)))
            made.append((f"{stem}@{width}x{height}.png", _encode(big, "PNG", compress_level=1)))
            if name == PHOTOS[0]:
                exif = Image.Exif()
                exif[0x0112] = 6  # rotate 90 CW on display
                made.append(
                    (f"{stem}@{width}x{height}-exif6.jpg", _encode(big, "JPEG", quality=90, exif=exif))
                )
    return made


def load_corpus() -> tuple[list[Case], dict[str, int]]:
    """Every image both loaders decode, with vLLM's full image."""
    cases: list[Case] = []
    skipped = {"vllm-cannot-decode": 0, "pixelwire-cannot-decode": 0}
    photos = _photos()
    # every photo made (2 formats x 2 sizes each, plus the EXIF-rotated JPEGs), and none skipped below
    assert len(photos) == (2 * len(PHOTOS) + 1) * len(PHOTO_SIZES), [name for name, _ in photos]
    sources = [(p.name, p.read_bytes()) for p in corpus_files()] + photos
    for name, data in sources:
        try:
            image = _vllm_load(data)
        except Exception:  # noqa: BLE001 - any failure of vLLM's loader: not an image it serves
            skipped["vllm-cannot-decode"] += 1
            continue
        try:
            pixelwire.decode_image(data, mode="RGB")
        except pixelwire.PixelwireError:
            skipped["pixelwire-cannot-decode"] += 1
            continue
        cases.append(Case(name, data, image))
    print(f"\ncorpus: {len(cases)} images ({len(sources)} sources), skipped {skipped}")
    assert {name for name, _ in photos} <= {case.name for case in cases}
    return cases, skipped
