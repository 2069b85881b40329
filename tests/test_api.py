"""The public decoding API: types, limits, errors, and the GIL."""

from __future__ import annotations

import io
import resource
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import pixelwire

from reference import CORPUS


def test_exception_tree() -> None:
    assert issubclass(pixelwire.DecodeError, pixelwire.PixelwireError)
    assert issubclass(pixelwire.UnsupportedFormat, pixelwire.DecodeError)
    assert issubclass(pixelwire.ImageTooLarge, pixelwire.DecodeError)
    assert pixelwire.PixelwireError.__module__ == "pixelwire"


def test_version_is_cargo_version() -> None:
    cargo = (Path(__file__).parent.parent / "Cargo.toml").read_text()
    assert f'version = "{pixelwire.__version__}"' in cargo


def test_input_types_and_output_layout() -> None:
    data = (CORPUS / "hopper.png").read_bytes()
    arrays = [pixelwire.decode_image(x) for x in (data, bytearray(data), memoryview(data))]
    for a in arrays:
        assert a.dtype == np.uint8 and a.flags.c_contiguous and a.shape == (128, 128, 3)
        np.testing.assert_array_equal(a, arrays[0])
    assert pixelwire.decode_image(data, mode="RGBA").shape == (128, 128, 4)
    assert pixelwire.decode_image(data, mode="L").shape == (128, 128, 1)


def test_bad_arguments() -> None:
    data = (CORPUS / "hopper.png").read_bytes()
    with pytest.raises(ValueError, match="mode"):
        pixelwire.decode_image(data, mode="CMYK")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pixelwire.decode_image("not bytes")  # type: ignore[arg-type]


def test_unsupported_format_names_itself() -> None:
    with pytest.raises(pixelwire.UnsupportedFormat, match="unrecognised image format"):
        pixelwire.decode_image(b"%PDF-1.7 not an image at all")


@pytest.mark.parametrize(
    ("limits", "message", "setting", "limit"),
    [
        (pixelwire.Limits(max_bytes=100), "over the limit of 100 bytes", "max_bytes", 100),
        (pixelwire.Limits(max_side=100), "side 128 px is over the limit of 100 px", "max_side", 100),
        (
            pixelwire.Limits(max_pixels=1000),
            "16384 pixels, over the limit of 1000 pixels",
            "max_pixels",
            1000,
        ),
    ],
)
def test_limits_name_the_limit_and_the_value(
    limits: pixelwire.Limits, message: str, setting: str, limit: int
) -> None:
    """The message says it, and the error carries it: which setting, its
    value and the image's."""
    data = (CORPUS / "hopper.png").read_bytes()
    with pytest.raises(pixelwire.ImageTooLarge, match=message) as caught:
        pixelwire.decode_image(data, limits=limits)
    actual = {"max_bytes": len(data), "max_side": 128, "max_pixels": 128 * 128}[setting]
    assert (caught.value.setting, caught.value.limit, caught.value.actual) == (setting, limit, actual)


def test_data_carrying_errors_are_built_by_their_constructors() -> None:
    error = pixelwire.ImageTooLarge("too big", setting="max_pixels", limit=10, actual=11)
    assert (str(error), error.setting, error.limit, error.actual) == ("too big", "max_pixels", 10, 11)
    plain = pixelwire.ImageTooLarge("a decoder's own memory bound")
    assert (plain.setting, plain.limit, plain.actual) == (None, None, None)
    fetch = pixelwire.BlockedURL("no", status=403, retryable=True)
    assert (fetch.status, fetch.retryable) == (403, True)
    landing = pixelwire.TransferError("READ timed out", may_land=True)
    assert (str(landing), landing.may_land) == ("READ timed out", True)
    assert pixelwire.TransferError("refused").may_land is False


def test_limits_defaults() -> None:
    limits = pixelwire.Limits()
    assert (limits.max_bytes, limits.max_pixels, limits.max_side) == (50 * 1024 * 1024, 50_000_000, 20_000)
    assert pixelwire.Limits(max_side=5) == pixelwire.Limits(max_side=5)


def test_probe_reads_the_header() -> None:
    info = pixelwire.probe_image((CORPUS / "hopper_orientation_3.jpg").read_bytes())
    assert info["format"] == "JPEG" and info["width"] == 128 and info["color_type"] == "RGB"
    assert info["orientation"] == 3


def test_gil_is_released_while_decoding(random_png: Callable[..., bytes]) -> None:
    """Another Python thread runs while a large image decodes.

    The other thread is woken just before the decode starts; it needs the
    GIL to record that it ran. Held for the whole decode, the GIL would only
    come back after the decode returned (a waiting thread asks for it after
    the 5 ms switch interval, and a native call does not give it up); released,
    the thread runs during the decode. Held, it would run only once the decode
    returned, so it must have run in the decode's first half. Three tries, so
    that a thread the OS happens not to schedule for half a decode on a
    loaded machine does not fail the test."""
    data = random_png(3000, 2000, seed=7)
    orders = []
    for _ in range(3):
        go = threading.Event()
        ran_at: list[float] = []

        def other(go: threading.Event = go, ran_at: list[float] = ran_at) -> None:
            go.wait()
            ran_at.append(time.perf_counter())

        thread = threading.Thread(target=other)
        thread.start()
        time.sleep(0.05)  # parked in go.wait()
        go.set()
        started_at = time.perf_counter()
        pixelwire.decode_image(data)
        finished_at = time.perf_counter()
        thread.join()
        orders.append(ran_at[0] - started_at < (finished_at - started_at) / 2)
        if orders[-1]:
            break
    print(f"\nthe other thread ran in the decode's first half: {orders}")
    assert any(orders), "the other Python thread only ran after the decode: the GIL was held"


def _batch() -> list[bytes]:
    """Inputs of every main format, sizes and layouts, some EXIF-rotated."""
    names = [
        "hopper.png",
        "flower2.jpg",
        "flower.webp",
        "transparent.gif",
        "pil_sample_cmyk.jpg",
        "hopper_orientation_8.jpg",
        "hopper_orientation_6.webp",
        "transparent.webp",
        "anim_frame1.webp",
        "hopper.webp",
        "rgb32rle.tga",
    ]
    return [(CORPUS / n).read_bytes() for n in names if (CORPUS / n).exists()]


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_decode_many_equals_decode_image_in_order(mode: str) -> None:
    inputs = _batch() * 3
    arrays = pixelwire.decode_many(inputs, mode=mode, threads=4)  # type: ignore[arg-type]
    assert len(arrays) == len(inputs)
    for data, got in zip(inputs, arrays, strict=True):
        want = pixelwire.decode_image(data, mode=mode)  # type: ignore[arg-type]
        assert got.dtype == np.uint8 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)


def test_decode_many_takes_decode_image_options() -> None:
    inputs = _batch()
    options = {"background": (1, 2, 3), "apply_exif_orientation": False, "resize": (40, 30)}
    arrays = pixelwire.decode_many([bytearray(d) for d in inputs], **options)  # type: ignore[arg-type]
    for data, got in zip(inputs, arrays, strict=True):
        np.testing.assert_array_equal(got, pixelwire.decode_image(data, **options))  # type: ignore[arg-type]
    assert pixelwire.decode_many([]) == []


def test_decode_many_names_the_first_input_that_fails() -> None:
    good = (CORPUS / "hopper.png").read_bytes()
    truncated = (CORPUS / "flower2.jpg").read_bytes()[:2000]
    inputs = [good] * 5 + [b"not an image"] + [good] * 3 + [truncated] + [good] * 20
    with pytest.raises(pixelwire.UnsupportedFormat, match=r"^image 5: ") as caught:
        pixelwire.decode_many(inputs, threads=3)
    assert caught.value.index == 5
    with pytest.raises(pixelwire.DecodeError, match=r"^image 9: JPEG") as caught:
        pixelwire.decode_many([good] * 9 + [truncated] + [good] * 5)
    assert caught.value.index == 9
    # Outside a batch there is no index.
    with pytest.raises(pixelwire.DecodeError) as single:
        pixelwire.decode_image(truncated)
    assert single.value.index is None


def test_decode_many_applies_limits_to_each_image(random_png: Callable[..., bytes]) -> None:
    small = random_png(10, 10, seed=7)
    big = (CORPUS / "hopper.png").read_bytes()
    limits = pixelwire.Limits(max_pixels=1000)
    assert len(pixelwire.decode_many([small, small], limits=limits)) == 2
    with pytest.raises(pixelwire.ImageTooLarge, match=r"^image 2: .*over the limit of 1000 pixels") as caught:
        pixelwire.decode_many([small, small, big, small], limits=limits)
    assert caught.value.index == 2
    # The limit it is over comes with it, as from decode_image.
    assert (caught.value.setting, caught.value.limit, caught.value.actual) == ("max_pixels", 1000, 128 * 128)


def test_decode_many_bad_arguments() -> None:
    data = (CORPUS / "hopper.png").read_bytes()
    with pytest.raises(ValueError, match="threads"):
        pixelwire.decode_many([data], threads=0)
    with pytest.raises(ValueError, match="mode"):
        pixelwire.decode_many([data], mode="CMYK")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pixelwire.decode_many(["not bytes"])  # type: ignore[list-item]


def _jpeg(seed: int, size: tuple[int, int] = (1024, 768)) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).resize(size, Image.Resampling.BILINEAR).save(out, "JPEG", quality=90)
    return out.getvalue()


def test_large_outputs_reuse_memory_only_once_released() -> None:
    """A large output's buffer goes to the next output of that size only once
    every array over it is gone, and a reused buffer never shows the image
    that held it before (JPEG writes every byte; PNG is zero-filled first)."""
    first, second = _jpeg(1), _jpeg(2)
    expected_first = pixelwire.decode_image(first).copy()
    expected_second = pixelwire.decode_image(second).copy()

    kept = pixelwire.decode_image(first)
    view = kept[::2]
    address = kept.ctypes.data
    del kept
    other = pixelwire.decode_image(second)
    assert other.ctypes.data != address, "a buffer still under a view was reused"
    np.testing.assert_array_equal(view, expected_first[::2])
    np.testing.assert_array_equal(other, expected_second)

    del view, other
    again = pixelwire.decode_image(second)
    np.testing.assert_array_equal(again, expected_second)
    assert again.flags.writeable and again.flags.c_contiguous

    # A PNG decoded into the JPEG's old buffer is Pillow's image.
    png = io.BytesIO()
    Image.fromarray(expected_first[:, :, ::-1].copy()).save(png, "PNG", compress_level=1)
    del again
    decoded = pixelwire.decode_image(png.getvalue())
    np.testing.assert_array_equal(decoded, expected_first[:, :, ::-1])


def test_a_repeated_large_decode_does_not_fault_its_output_in_again() -> None:
    """The second decode of a 4K image reuses the first one's memory, already
    in place, instead of faulting 25 MB in page by page (the cost that made a
    returned batch slower than threads that drop each image)."""
    data = _jpeg(3, (3840, 2160))
    held = [pixelwire.decode_image(data)]
    pages = 3840 * 2160 * 3 // 4096
    counts = []
    # Three tries: a buffer parked for over 2 s is freed (a stalled machine
    # could let that happen between two decodes once, not three times).
    for _ in range(3):
        held.clear()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        held.append(pixelwire.decode_image(data))
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert min(counts) < pages // 20, f"minor faults per decode: {counts}, against {pages} pages of output"
