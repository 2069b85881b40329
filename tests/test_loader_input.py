"""What goes to vLLM's own loaders (``pixelwire.loader_input``): data:
URLs split with vLLM's grammar, the JPEG-frame form recognised only as vLLM
recognises it, frame lists checked from their headers, and video and audio
bytes identified as one real container, and image bytes as one image
format, before any of vLLM's loaders (FFmpeg with every demuxer, Pillow with
every plug-in) may have them."""

from __future__ import annotations

import hostile_media
import pytest
from hostile_media import frame_list, jpeg, jpeg_claiming, wav

import pixelwire
from pixelwire import Limits, VideoLimits
from pixelwire.loader_input import (
    FrameListRefused,
    check_frames,
    checked_container,
    data_url_parts,
    frame_list_frames,
    image_format,
    is_frame_list,
)

from reference import CORPUS


def test_data_urls_split_as_vllm_splits_them() -> None:
    """The header ends at the first comma, its last parameter must be
    exactly ``base64``, and the media type is what precedes the first
    ``;``: vLLM's exceptions for what it refuses."""
    assert data_url_parts("data:video/jpeg;x=1;base64,QQ==,Qg==") == ("video/jpeg", "QQ==,Qg==")
    assert data_url_parts("DATA:;base64,QQ==") == ("", "QQ==")
    with pytest.raises(ValueError, match="missing ','"):
        data_url_parts("data:video/jpeg;base64")
    with pytest.raises(NotImplementedError):
        data_url_parts("data:video/jpeg;BASE64,QQ==")
    with pytest.raises(NotImplementedError):
        data_url_parts("data:video/jpeg,QQ==")


@pytest.mark.parametrize(
    ("header", "frames"),
    [
        ("video/jpeg;base64", True),
        ("VIDEO/JPEG;base64", True),
        ("video/jpeg;charset=x;base64", True),
        ("video/jpegx;base64", False),  # the prefix is not the type
        ("video/jpeg ;base64", False),  # vLLM compares the whole type, spaces included
        ("video/jpeg;BASE64", False),  # vLLM refuses the URL before any loader
        ("video/mp4;x=video/jpeg;base64", False),
    ],
)
def test_the_frame_form_is_the_whole_media_type(header: str, frames: bool) -> None:
    assert is_frame_list(f"data:{header},QQ==") is frames
    assert header in hostile_media.FRAME_LIST_SPELLINGS


def test_frames_are_split_at_every_comma_and_decoded_strictly() -> None:
    url = frame_list([b"one", b"two", b"three"])
    assert frame_list_frames(url) == [b"one", b"two", b"three"]
    with pytest.raises(FrameListRefused, match=r"frame 1 .* not base64"):
        frame_list_frames("data:video/jpeg;base64,b25l,t w8=")


def test_frames_within_the_limits_pass() -> None:
    check_frames([jpeg()] * 4, Limits(), VideoLimits())


@pytest.mark.parametrize(
    ("frames", "words", "setting"),
    [
        ([jpeg_claiming(13000, 13000)] * 8, "frame 0 .*169000000", None),  # the image limits say so
        ([jpeg()] * 9, "9 frames, over the limit of 8", "max_frames"),
        ([jpeg(), jpeg(256, 128)], "frame 1 .* not the 128x128 of frame 0", None),
        ([(CORPUS / "hopper.png").read_bytes()], "PNG image, not a JPEG", None),
        ([hostile_media.ffconcat("x.mp4")], "frame 0 .*unrecognised image format", None),
        ([], "no frame", None),
    ],
)
def test_frame_lists_over_a_limit_or_not_jpegs_are_refused_from_their_headers(
    frames: list[bytes], words: str, setting: str | None
) -> None:
    """Each frame is a JPEG within the image limits (13000x13000 is over
    them), all of one size, and few enough."""
    with pytest.raises(FrameListRefused, match=words) as refused:
        check_frames(frames, Limits(max_pixels=100_000_000), VideoLimits(max_frames=8))
    assert refused.value.setting == setting


def test_frames_together_stay_within_the_video_limits() -> None:
    frame_bytes = 128 * 128 * 3
    with pytest.raises(FrameListRefused, match="decode to over") as refused:
        check_frames([jpeg()] * 4, Limits(), VideoLimits(max_frame_bytes=3 * frame_bytes))
    assert refused.value.setting == "max_frame_bytes"
    with pytest.raises(FrameListRefused, match="over the limit of 1000 pixels") as refused:
        check_frames([jpeg()], Limits(), VideoLimits(max_pixels=1000))
    assert refused.value.setting == "max_pixels"


def test_real_containers_are_identified(video_clips: dict[str, bytes]) -> None:
    """Every test clip (MP4, Matroska, WebM, AVI) is a video container; a
    WAV is audio only."""
    for name, data in video_clips.items():
        assert checked_container(data, "video") is data, name
    assert checked_container(wav(), "audio")
    with pytest.raises(pixelwire.UnidentifiedMedia, match="wav is not a video container"):
        checked_container(wav(), "video")


@pytest.mark.parametrize("medium", ["video", "audio"])
@pytest.mark.parametrize("name", ["ffconcat", "sdp", "hls", "dash"])
def test_descriptions_that_open_other_resources_are_refused(name: str, medium: str) -> None:
    """A concat script, an SDP session, an HLS playlist and a DASH manifest
    are refused as video and as audio, and so is each behind an ID3 tag
    (FFmpeg's probe skips one in front of any format)."""
    description = hostile_media.descriptions()[name]
    with pytest.raises(pixelwire.UnidentifiedMedia):
        checked_container(description, medium)  # type: ignore[arg-type]
    id3_tagged = b"ID3\x03\x00\x00\x00\x00\x00\x00" + description
    with pytest.raises(pixelwire.UnidentifiedMedia):
        checked_container(id3_tagged, medium)  # type: ignore[arg-type]


def test_an_sdp_session_behind_a_matroska_signature_is_refused(video_clips: dict[str, bytes]) -> None:
    """FFmpeg's SDP probe matches a ``c=IN IP`` line anywhere in its probe
    buffer: a real WebM with one spliced in is refused."""
    clip = video_clips["vp9.webm"]
    assert checked_container(clip, "video")
    with pytest.raises(pixelwire.UnidentifiedMedia, match="SDP"):
        checked_container(clip[:200] + b"\n" + hostile_media.sdp(5004) + clip[200:], "video")


def test_a_medium_other_than_video_audio_or_image_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="medium must be"):
        pixelwire._native.identify_container(wav(), "text")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "format"),
    [
        ("hopper.png", "PNG"),
        ("flower2.jpg", "JPEG"),
        ("g4_orientation_6.tif", "TIFF"),
        ("transparent.png", "PNG"),
    ],
)
def test_images_are_identified_by_their_signature_as_pillow_names_them(name: str, format: str) -> None:
    assert image_format((CORPUS / name).read_bytes()) == format


def test_images_of_other_formats_and_other_media_are_refused(video_clips: dict[str, bytes]) -> None:
    """Formats only Pillow reads (EPS, which it hands to Ghostscript, PSD,
    SGI), TGA (no signature: Pillow tries it on anything), a video and a
    description are not images pixelwire vouches for."""
    for data in [
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 1 1\n",
        b"8BPS\x00\x01" + bytes(20),
        b"\x01\xda\x01\x01\x00\x03" + bytes(20),
        b"\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x01\x00\x18\x00\x00\x00\x00",
        video_clips["vp9.webm"],
        hostile_media.ffconcat("a.png"),
        b"",
    ]:
        with pytest.raises(pixelwire.UnidentifiedMedia, match="not one media container"):
            image_format(data)
