"""Acceptance 1: pixelwire gives vLLM's pixels for every corpus file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pixelwire

from reference import LOSSLESS_FORMATS, assert_same_pixels, corpus_files, is_lossy, psnr, vllm_load

# Files Pillow reads that pixelwire refuses, each with the reason. The test
# fails if any other file is refused, or if one of these starts decoding
# (then it must be checked for parity and taken off the list).
REFUSED = {
    "12bit.cropped.tif": "TIFF with 12-bit samples",
    "16_bit_binary_pgm.tiff": "TIFF with signed samples",
    "16bit.s.tif": "TIFF with signed samples",
    "8bit.s.tif": "TIFF with signed samples",
    "child_ifd.tiff": "TIFF with JPEG compression",
    "g4_orientation_3.tif": "TIFF with an Orientation tag",
    "g4_orientation_4.tif": "TIFF with an Orientation tag",
    "g4_orientation_5.tif": "TIFF with an Orientation tag",
    "g4_orientation_6.tif": "TIFF with an Orientation tag",
    "hopper.Lab.tif": "TIFF in CIELab",
    "lab-green.tif": "TIFF in CIELab",
    "lab-red.tif": "TIFF in CIELab",
    "hopper_jpg.tif": "TIFF with JPEG compression",
    "hopper_lzma.tif": "TIFF with LZMA compression",
    "multipage-lastframe.tif": "palette TIFF",
    "multipage.tiff": "palette TIFF",
    "multipage_out_of_order.tiff": "palette TIFF",
    "rdf.tif": "palette TIFF",
    "multipage_single_frame_loop.tiff": "TIFF whose IFD chain loops (the tiff crate refuses it)",
    "old-style-jpeg-compression.tif": "TIFF with old-style JPEG compression",
    "old-style-jpeg-compression-no-samplesperpixel.tif": "TIFF with old-style JPEG compression",
    "pil136.tiff": "TIFF with premultiplied alpha",
    "tiff_16bit_RGBa.tiff": "TIFF with premultiplied alpha",
    "tiff_strip_cmyk_jpeg.tif": "TIFF with JPEG compression",
    "tiff_tiled_cmyk_jpeg.tif": "TIFF with JPEG compression",
    "tiff_strip_ycbcr_jpeg_1x1_sampling.tif": "TIFF with JPEG compression",
    "tiff_strip_planar_raw.tif": "planar TIFF",
    "tiff_tiled_planar_16bit_RGB.tiff": "planar TIFF",
    "tiff_tiled_planar_lzw.tiff": "planar TIFF",
    "tiff_tiled_planar_raw.tif": "planar TIFF",
    "total-pages-zero.tif": "TIFF with CCITT Group 3 compression",
    "hopper_unexpected.ico": "ICO whose directory size disagrees with its bitmap",
    "mmap_error.bmp": "BMP whose pixel offset points into the palette",
    "pal8_offset.bmp": "BMP whose pixel offset points into the palette",
    "op_index.qoi": "QOI without the end padding (the qoi crate needs it)",
    "rgba16.tga": "16-bit TGA",
    "hopper_bigtiff.tif": "BigTIFF (its truncations were not refused reliably)",
}

FILES = corpus_files()


def _ids(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_corpus_file_matches_vllm_loader(path: Path) -> None:
    data = path.read_bytes()
    try:
        fmt, expected = vllm_load(data)
    except Exception as pillow_error:  # noqa: BLE001 - any Pillow failure is a rejection
        with pytest.raises(pixelwire.PixelwireError):
            pixelwire.decode_image(data)
        assert path.name not in REFUSED, f"Pillow refuses it too: {pillow_error!r}"
        return

    if path.name in REFUSED:
        with pytest.raises(pixelwire.PixelwireError):
            pixelwire.decode_image(data)
        return

    got = pixelwire.decode_image(data)
    assert got.dtype == np.uint8 and got.flags.c_contiguous
    assert got.shape == expected.shape
    if is_lossy(fmt, data):
        assert psnr(got, expected) >= 40.0
    else:
        assert fmt in LOSSLESS_FORMATS or fmt == "WEBP"
        np.testing.assert_array_equal(got, expected)


def test_jpeg_psnr_summary() -> None:
    values = []
    for path in FILES:
        data = path.read_bytes()
        try:
            fmt, expected = vllm_load(data)
        except Exception:  # noqa: BLE001
            continue
        if fmt == "JPEG":
            values.append(psnr(pixelwire.decode_image(data), expected))
    assert values
    finite = [v for v in values if np.isfinite(v)]
    identical = len(values) - len(finite)
    mean = float(np.mean(finite)) if finite else float("inf")
    low = min(values)
    print(
        f"\nJPEG parity over {len(values)} files: {identical} pixel-identical, "
        f"mean PSNR of the rest {mean:.2f} dB, minimum {low:.2f} dB"
    )
    assert low >= 40.0


SAMPLES = [
    "hopper.png",
    "transparent.png",
    "pil123p.png",
    "transparent.gif",
    "la.tga",
    "rgb_trns.png",
    "i_trns.png",
    "l_trns.png",
    "hopper.webp",
    "transparent.webp",
    "pil_sample_cmyk.jpg",
    "hopper_gray.jpg",
    "python.ico",
    "tiff_16bit_RGB.tiff",
    "hopper_16bit.pgm",
    "first_frame_transparency.gif",
    "no_palette_with_transparency.gif",
]


@pytest.mark.parametrize("mode", ["RGBA", "L"])
@pytest.mark.parametrize("name", SAMPLES)
def test_other_modes_match_pillow_convert(name: str, mode: str) -> None:
    data = (FILES[0].parent / name).read_bytes()
    fmt, expected = vllm_load(data, mode)
    got = pixelwire.decode_image(data, mode=mode)
    assert_same_pixels(fmt, data, got, expected)


@pytest.mark.parametrize("name", ["transparent.png", "rgba16.tga", "transparent.webp", "pil123rgba.qoi"])
def test_background_colour_for_rgba(name: str) -> None:
    data = (FILES[0].parent / name).read_bytes()
    try:
        fmt, expected = vllm_load(data, "RGB", background=(10, 200, 30))
    except Exception:  # noqa: BLE001
        pytest.skip("Pillow cannot read it")
    if name in REFUSED:
        pytest.skip(REFUSED[name])
    got = pixelwire.decode_image(data, background=(10, 200, 30))
    assert_same_pixels(fmt, data, got, expected)


ORIENTED = sorted(p.name for p in FILES if "orientation" in p.name and p.name not in REFUSED)


@pytest.mark.parametrize("name", ORIENTED)
def test_exif_orientation_matches_exif_transpose(name: str) -> None:
    data = (FILES[0].parent / name).read_bytes()
    fmt, expected = vllm_load(data, exif_transpose=True)
    got = pixelwire.decode_image(data, apply_exif_orientation=True)
    assert_same_pixels(fmt, data, got, expected)
