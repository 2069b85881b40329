"""Acceptance 2 and 3: bombs, random bytes, truncations and empty input."""

from __future__ import annotations

import random
import resource
import warnings
from pathlib import Path

import numpy as np
import pytest

import pixelwire

from reference import assert_same_pixels, corpus_files, vllm_load

FILES = corpus_files()
# Files Pillow refuses as decompression bombs (the "extents" GIF is only a
# bomb past its first frame, which is all vLLM reads).
BOMBS = [
    p
    for p in FILES
    if p.name in {"decompression_bomb.gif", "decompression_bomb.ico", "png_decompression_dos.png"}
]


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("path", BOMBS, ids=[p.name for p in BOMBS])
def test_decompression_bomb_is_refused_cheaply(path: Path) -> None:
    data = path.read_bytes()
    before = _peak_rss_mib()
    with pytest.raises(pixelwire.PixelwireError) as caught:
        for _ in range(3):
            pixelwire.decode_image(data)
    grown = _peak_rss_mib() - before
    print(f"\n{path.name}: {type(caught.value).__name__}: {caught.value}; peak RSS grew {grown:.1f} MiB")
    assert grown < 64


def test_bombs_with_small_frames_raise_image_too_large() -> None:
    # The corpus bombs whose headers declare huge canvases must be stopped by
    # the header check, before any pixel buffer exists.
    for name in ("decompression_bomb.gif", "decompression_bomb.ico"):
        data = (FILES[0].parent / name).read_bytes()
        with pytest.raises(pixelwire.ImageTooLarge):
            pixelwire.decode_image(data)


def test_empty_input() -> None:
    for empty in (b"", bytearray(), memoryview(b"")):
        with pytest.raises(pixelwire.UnsupportedFormat, match="0 bytes"):
            pixelwire.decode_image(empty)


def test_random_bytes() -> None:
    rng = random.Random(1234)
    prefixes = [
        b"",
        b"\xff\xd8\xff",
        b"\x89PNG\r\n\x1a\n",
        b"GIF89a",
        b"RIFF\0\0\0\0WEBP",
        b"BM",
        b"II*\0",
        b"qoif",
        b"P6\n",
    ]
    for i in range(600):
        body = rng.randbytes(rng.randrange(0, 4096))
        data = prefixes[i % len(prefixes)] + body
        try:
            pixelwire.decode_image(data)
        except pixelwire.PixelwireError:
            continue
        # Random bytes that still form a valid image are fine only if Pillow
        # agrees on the pixels.
        _, expected = vllm_load(data)
        np.testing.assert_array_equal(pixelwire.decode_image(data), expected)


def _truncations(size: int) -> list[int]:
    return sorted({max(0, size * k // 10 - 1) for k in range(10)} | {size - 1})


def test_every_truncation_is_an_error_or_pillow_agrees() -> None:
    """Cut every corpus file at ten points. pixelwire must raise a
    PixelwireError; if it returns pixels, Pillow must decode the same cut
    bytes to the same pixels (data after the first frame or after EOI)."""
    decoded_cuts = 0
    total = 0
    for path in FILES:
        data = path.read_bytes()
        for cut in _truncations(len(data)):
            total += 1
            piece = data[:cut]
            try:
                got = pixelwire.decode_image(piece)
            except pixelwire.PixelwireError:
                continue
            decoded_cuts += 1
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fmt, expected = vllm_load(piece)
            assert_same_pixels(fmt, piece, got, expected, f"{path.name} cut at {cut}")
    print(
        f"\n{total} truncations: {total - decoded_cuts} raised PixelwireError, "
        f"{decoded_cuts} decoded exactly as Pillow decodes them"
    )
