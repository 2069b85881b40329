"""pixelwire.descriptor: the one schema; what parse_descriptor accepts, refuses
and reports."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

import pixelwire
from pixelwire.descriptor import (
    Decoded,
    DecodedVideo,
    ResizeRecord,
    decoded_as,
    is_video_descriptor,
    parse_descriptor,
)


def _decoded() -> Decoded:
    return Decoded(
        nixl_metadata="b64:AAAA",
        addr=1 << 20,
        size=4 * 6 * 4,
        shape=(4, 6, 3),
        format="PNG",
        color_type="RGB",
        content_hash="xxh3-256k:0123456789abcdef",
        agent="pixelwire-frontend-1",
        slot=3,
        generation=7,
        expires_at=1_900_000_000.5,
        notification="pw1:3:7",
        background=(0, 0, 0),
        published_at=1_899_999_990.0,
        source_sha256="ab" * 32,
        metadata_version=2,
        resize={"policy": "qwen2_vl:factor=28", "source": [8, 12]},
        layout="RGBX",
    )


def test_what_decoded_writes_parse_descriptor_reads_back() -> None:
    decoded = _decoded()
    for desc in (decoded, decoded.to_dict()):
        image = parse_descriptor(desc)
        assert (image.addr, image.size, image.shape, image.layout) == (1 << 20, 96, (4, 6, 3), "RGBX")
        assert (image.slot, image.generation, image.metadata_version) == (3, 7, 2)
        assert image.notification == "pw1:3:7" and image.content_hash == "xxh3-256k:0123456789abcdef"
        assert image.color_type == "RGB" and image.background == (0, 0, 0)
        assert image.published_at == 1_899_999_990.0 and image.source_sha256 == "ab" * 32
        assert image.resize == ResizeRecord("qwen2_vl:factor=28", (8, 12))
        assert image.source_size == (8, 12) and image.pixel_bytes == 4
        image.check(max_pixels=24, now=0.0)


def test_the_notification_must_be_the_one_that_frees_this_slot() -> None:
    """A notification for another slot (or generation) would free an image
    some other request still needs; only the native rule's form is taken."""
    for notification in (
        "pw1:4:7",
        "pw1:3:8",
        "pw1:3:7\n",
        "pw1:03:7",
        "pw1:3:7:0",
        "pw1:3:7:01",
        "pw1:\u0663:7",
        37,
    ):
        desc = _decoded().to_dict()
        desc["pixelwire"]["notification"] = notification
        with pytest.raises(pixelwire.DescriptorError, match="notification"):
            parse_descriptor(desc)
    # A later hand-out of the same slot (a cache hit) has a notification of its own.
    desc = _decoded().to_dict()
    desc["pixelwire"]["notification"] = "pw1:3:7:2"
    assert parse_descriptor(desc).notification == "pw1:3:7:2"


def test_a_content_hash_has_the_native_form() -> None:
    for content_hash in (
        "0123456789abcdef",  # the whole-image form before pieces
        "xxh3-256k:0123456789ABCDEF",
        "xxh3-256k:0123456789abcde",
        "xxh3-256k:0123456789abcdef\n",
        "",
        None,
    ):
        desc = _decoded().to_dict()
        desc["content_hash"] = content_hash
        with pytest.raises(pixelwire.DescriptorError, match="content_hash"):
            parse_descriptor(desc)


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        ("background", [0, 0, 256], "background"),
        ("background", [0, 0], "background"),
        ("resize", {"policy": "p", "source": [0, 12]}, "resize.source"),
        ("resize", {"policy": 1, "source": [8, 12]}, "resize"),
    ],
)
def test_pixelwire_fields_are_checked(where: str, value: Any, message: str) -> None:
    desc = _decoded().to_dict()
    desc["pixelwire"][where] = value
    with pytest.raises(pixelwire.DescriptorError, match=message):
        parse_descriptor(desc)


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("background", "abc"),
        ("resize", {"policy": "p", "source": [2**64, 1]}),
        ("resize", {"policy": "p", "source": [True, True]}),
    ],
)
def test_decoded_as_checks_the_frontends_settings_before_the_nixl_fields(where: str, value: Any) -> None:
    """A frontend set up unlike its worker is reported as such, even on a
    descriptor whose NIXL fields are missing too."""
    desc: dict[str, Any] = {
        "metadata": {"color_type": "RGB"},
        "pixelwire": {"background": [255, 255, 255], where: value},
    }
    with pytest.raises(pixelwire.DescriptorError, match=f"pixelwire.{where}|{where}"):
        decoded_as(desc)
    with pytest.raises(pixelwire.DescriptorError, match=where):
        parse_descriptor(desc)


@pytest.mark.parametrize("device_id", [2**64, -1, 1, True, "0", None])
def test_a_device_id_other_than_host_memory_is_refused(device_id: Any) -> None:
    """Host (Dram) memory is NIXL's device 0: any other device_id, or one
    out of range, is a DescriptorError like every other bad number (2^64
    used to be accepted and read as device 0)."""
    desc = _decoded().to_dict()
    desc["nixl_descriptor"]["device_id"] = device_id
    with pytest.raises(pixelwire.DescriptorError, match="device_id"):
        parse_descriptor(desc)
    desc["nixl_descriptor"]["device_id"] = 0
    assert parse_descriptor(desc).size == _decoded().size


def test_optional_fields_that_are_malformed_are_left_out_not_trusted() -> None:
    desc = _decoded().to_dict()
    desc["pixelwire"].update(source_sha256="AB" * 32, published_at=float("nan"))
    del desc["pixelwire"]["resize"]
    image = parse_descriptor(desc)
    assert image.source_sha256 is None and image.published_at is None and image.resize is None
    assert image.source_size == (4, 6)


def test_check_refuses_what_no_read_should_try() -> None:
    image = parse_descriptor(_decoded())
    with pytest.raises(pixelwire.DescriptorError, match="max_pixels=23"):
        image.check(max_pixels=23, now=0.0)
    with pytest.raises(pixelwire.DescriptorError, match="expired"):
        image.check(max_pixels=24, now=1_900_000_001.0)
    desc = copy.deepcopy(_decoded().to_dict())
    desc["nixl_descriptor"]["size"] = 4 * 6 * 3  # RGBX is four bytes a pixel
    with pytest.raises(pixelwire.DescriptorError, match="does not match size"):
        parse_descriptor(desc).check(max_pixels=24, now=0.0)


def _decoded_video() -> DecodedVideo:
    return DecodedVideo(
        nixl_metadata="b64:AAAA",
        addr=1 << 20,
        size=3 * 4 * 6 * 3,
        shape=(3, 4, 6, 3),
        content_hash="xxh3-256k:0123456789abcdef",
        agent="pixelwire-frontend-1",
        slot=3,
        generation=7,
        expires_at=1_900_000_000.5,
        notification="pw1:3:7",
        loader_metadata={
            "total_num_frames": 50,
            "fps": 25.0,
            "duration": 2.0,
            "video_backend": "opencv",
            "frames_indices": [0, 24, 49],
            "do_sample_frames": False,
        },
        sampling={"loader": "opencv", "num_frames": 3, "fps": -1.0},
        codec="h264",
        source_sha256="ab" * 32,
    )


def test_a_video_descriptor_carries_dynamos_video_metadata_and_reads_back() -> None:
    """A video's descriptor has dynamo's [T, H, W, 3] shape and ``Video``
    metadata (source fps, duration, each sampled frame's time); parsed, it
    names T frames of (H, W, 3) and vLLM's metadata dict unchanged."""
    video = _decoded_video()
    desc = video.to_dict()
    assert desc["shape"] == [3, 4, 6, 3] and desc["dtype"] == "UINT8"
    assert desc["metadata"] == {
        "Video": {"source_fps": 25.0, "source_duration": 2.0, "sampled_timestamps": [0.0, 0.96, 1.96]}
    }
    remote = parse_descriptor(desc)
    assert (remote.frames, remote.shape, remote.color_type) == (3, (4, 6, 3), "RGB")
    assert remote.video is not None and remote.video.loader_metadata == video.loader_metadata
    assert remote.video.sampling == video.sampling
    remote.check(max_pixels=24, now=0.0)
    assert is_video_descriptor(desc) and not is_video_descriptor(_decoded().to_dict())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(shape=[3, 4, 6]), r"\[T, H, W, 3\]"),
        (lambda d: d.update(shape=[0, 4, 6, 3]), "not video frames"),
        (lambda d: d.update(shape=[3, 4, 6, 4]), "not video frames"),
        (lambda d: d.update(shape=[2, 4, 6, 3]), "frames_indices must name each frame"),
        (lambda d: d["pixelwire"].pop("video"), "pixelwire.video record"),
        (lambda d: d["pixelwire"]["video"]["sampling"].pop("loader"), "sampling"),
        (lambda d: d["pixelwire"]["video"]["loader_metadata"].update(fps=float("inf")), "fps"),
        (
            lambda d: d["pixelwire"]["video"]["loader_metadata"].update(frames_indices=[0, -1, 2]),
            "frames_indices",
        ),
        (lambda d: d["pixelwire"]["video"]["loader_metadata"].pop("do_sample_frames"), "do_sample_frames"),
    ],
)
def test_a_video_descriptor_is_checked(change: Any, message: str) -> None:
    desc = _decoded_video().to_dict()
    change(desc)
    with pytest.raises(pixelwire.DescriptorError, match=message):
        parse_descriptor(desc)


def test_a_video_whose_frames_do_not_fill_its_buffer_is_not_read() -> None:
    desc = _decoded_video().to_dict()
    desc["nixl_descriptor"]["size"] -= 1
    with pytest.raises(pixelwire.DescriptorError, match=r"shape \[3, 4, 6, 3\] does not match size"):
        parse_descriptor(desc).check(max_pixels=24, now=0.0)


def _processed() -> dict[str, Any]:
    """A processed image's descriptor: 4 patch rows of a 28x28 image (grid
    1x2x2, patch 14, each patch once: the 2 temporal copies are the worker's)."""
    decoded = dataclasses.replace(
        _decoded(),
        shape=(4, 588, 1),
        size=4 * 588,
        layout="PATCHES",
        processed={"processor": "qwen2_vl_patches:uint8", "grid_thw": [1, 2, 2], "patch": [14, 2, 2]},
    )
    return decoded.to_dict()


def test_a_processed_descriptor_reads_back_its_rows_grid_and_processor() -> None:
    image = parse_descriptor(_processed())
    assert image.layout == "PATCHES" and image.shape == (4, 588, 1)
    assert image.processed is not None and image.processed.grid_thw == (1, 2, 2)
    assert image.processed.processor == "qwen2_vl_patches:uint8" and image.processed.pixels == 28 * 28
    image.check(max_pixels=28 * 28, now=0.0)
    with pytest.raises(pixelwire.DescriptorError, match="over max_pixels"):
        image.check(max_pixels=28 * 28 - 1, now=0.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["pixelwire"].pop("processed"), "needs its pixelwire.processed"),
        (lambda d: d["pixelwire"]["processed"].update(grid_thw=[1, 2, 4]), "not the patch rows of grid"),
        (lambda d: d["pixelwire"]["processed"].update(patch=[16, 2, 2]), "not the patch rows of grid"),
        (lambda d: d["pixelwire"]["processed"].update(grid_thw=[1, 1, 4]), "not the patch rows of grid"),
        (lambda d: d["pixelwire"]["processed"].update(grid_thw=[1, 2]), "three positive integers"),
        (lambda d: d["pixelwire"]["processed"].update(processor=None), "needs its pixelwire.processed"),
        (lambda d: d["metadata"].update(layout="HWC"), "belongs to the PATCHES layout"),
    ],
    ids=["no-record", "grid", "patch", "odd-merge", "grid-form", "processor", "not-patches"],
)
def test_a_processed_descriptor_is_checked(change: Any, message: str) -> None:
    """The rows must be exactly the grid's patches, each of the patch grid's
    length, and only a PATCHES descriptor carries a processed record."""
    desc = _processed()
    change(desc)
    with pytest.raises(pixelwire.DescriptorError, match=message):
        parse_descriptor(desc)
