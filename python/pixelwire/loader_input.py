"""What goes to vLLM's own loaders, read as vLLM 0.32 reads it and checked
first: the one owner of that rule for the frontend and the plug-in alike.

vLLM decodes some media itself: a video in a codec or container pixelwire
does not decode, a video sampled in a way pixelwire does not reproduce,
every audio part, and a video sent as a list of JPEG frames. Its video and
audio loaders are FFmpeg with every demuxer (OpenCV's, PyAV's), which opens
other resources named in a file's bytes (concat scripts, playlists, SDP),
and its JPEG-frame loader is Pillow, which decodes any image at any size.
So:

- a ``data:`` URL is split with vLLM's own grammar (:func:`data_url_parts`),
  and the JPEG-frame form is recognised exactly as vLLM recognises it (the
  media type compared whole, case folded, parameters dropped), never by a
  prefix (:func:`is_frame_list`);
- video and audio bytes are identified natively as one real container,
  and image bytes as one image format, from their signature
  (:func:`pixelwire._native.identify_container`) before any loader of
  vLLM's gets them (:func:`checked_container`);
- a frame list's frames are decoded from base64 as vLLM decodes them and
  each is checked from its header against the image limits, and all of
  them together against the video limits, before Pillow sees any
  (:func:`check_frames`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from typing import Literal

from pixelwire._native import (
    DecodeError,
    Limits,
    UnidentifiedMedia,
    VideoLimits,
    identify_container,
    probe_image,
)

# vLLM's JPEG-frame form: VideoMediaIO.load_base64 compares the media type,
# lower-cased, with this.
FRAME_LIST_TYPE = "video/jpeg"


class FrameListRefused(ValueError):
    """A JPEG-frame list that pixelwire will not hand to vLLM's loader;
    ``setting`` names the :class:`VideoLimits` field it went over, when it
    did (a frame over the image limits says so in the message)."""

    def __init__(self, message: str, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


def data_url_parts(url: str) -> tuple[str, str]:
    """(media type, base64 payload) of a ``data:`` URL as vLLM 0.32 reads it
    (``MediaConnector._load_data_url``): the header up to the first ``,``,
    its last ``;`` parameter exactly ``base64``, the media type the header's
    text before its first ``;``. Raises vLLM's exceptions for a URL it
    refuses (``ValueError``, ``NotImplementedError``)."""
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise ValueError(f"Invalid data URL {url[:32]!r}: missing ',' separator.")
    media_type, semicolon, encoding = header.rpartition(";")
    if not semicolon or encoding != "base64":
        raise NotImplementedError("Only base64 data URLs are supported for now.")
    return media_type.partition(";")[0], payload


def is_frame_list(url: str) -> bool:
    """Whether vLLM's video loader reads ``url`` as a list of base64 frames
    (``data:video/jpeg;base64,<frame>,<frame>,...``). A ``data:`` URL vLLM
    refuses before any loader is not one."""
    if url[:5].lower() != "data:":
        return False
    try:
        media_type, _ = data_url_parts(url)
    except (ValueError, NotImplementedError):
        return False
    return media_type.lower() == FRAME_LIST_TYPE


def frame_list_frames(url: str, b64decode: Callable[[str], bytes] | None = None) -> list[bytes]:
    """The encoded frames of a frame list, split as vLLM splits them (at
    every ``,``: vLLM decodes at most ``num_frames`` of them, and every one
    is returned here) and decoded strictly (``b64decode``: the decoder the
    caller's vLLM uses; Python's strict one by default). Raises
    :class:`FrameListRefused` for a frame that is not strict base64."""
    _, payload = data_url_parts(url)
    decode = b64decode or _strict_b64decode
    frames = []
    for index, text in enumerate(payload.split(",")):
        try:
            frames.append(decode(text))
        except ValueError as error:
            raise FrameListRefused(f"frame {index} of the JPEG frame list is not base64: {error}") from error
    return frames


def _strict_b64decode(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


def check_frames(frames: Sequence[bytes], limits: Limits, video: VideoLimits) -> None:
    """Checks a frame list from its frames' headers, before any is decoded:
    each a JPEG within the image ``limits``, all of one size (vLLM stacks
    them), their count and their decoded bytes (RGB, as vLLM's loader makes
    them) within the ``video`` limits."""
    if not frames:
        raise FrameListRefused("the JPEG frame list holds no frame")
    if len(frames) > video.max_frames:
        raise FrameListRefused(
            f"the JPEG frame list holds {len(frames)} frames, over the limit of {video.max_frames}",
            "max_frames",
        )
    if sum(len(frame) for frame in frames) > video.max_bytes:
        raise FrameListRefused(
            f"the JPEG frame list's frames are over the limit of {video.max_bytes} encoded bytes", "max_bytes"
        )
    size = None
    decoded = 0
    for index, frame in enumerate(frames):
        try:
            info = probe_image(frame, limits=limits)
        except DecodeError as error:
            raise FrameListRefused(f"frame {index} of the JPEG frame list: {error}") from error
        if info["format"] != "JPEG":
            raise FrameListRefused(
                f"frame {index} of the JPEG frame list is a {info['format']} image, not a JPEG"
            )
        shape = info["oriented_size"]
        if shape[0] * shape[1] > video.max_pixels:
            raise FrameListRefused(
                f"frame {index} of the JPEG frame list is {shape[1]}x{shape[0]}, over the limit of "
                f"{video.max_pixels} pixels a video frame",
                "max_pixels",
            )
        if size is not None and shape != size:
            raise FrameListRefused(
                f"frame {index} of the JPEG frame list is {shape[1]}x{shape[0]}, not the "
                f"{size[1]}x{size[0]} of frame 0 (vLLM stacks the frames)"
            )
        size = shape
        decoded += shape[0] * shape[1] * 3
        if decoded > video.max_frame_bytes:
            raise FrameListRefused(
                f"the JPEG frame list's frames decode to over {video.max_frame_bytes} bytes",
                "max_frame_bytes",
            )


def checked_container(data: bytes, medium: Literal["video", "audio"]) -> bytes:
    """``data``, once identified as one real container of ``medium``
    (raises :class:`pixelwire.UnidentifiedMedia` otherwise): what may be
    handed to vLLM's own loader."""
    identify_container(data, medium)
    return data


def image_format(data: bytes) -> str:
    """The one image format ``data`` is, as Pillow names it (``JPEG``,
    ``PNG``, ``GIF``, ``WEBP``, ``BMP``, ``TIFF``, ``ICO``, ``PPM``,
    ``QOI``), from the signature it starts with; raises
    :class:`pixelwire.UnidentifiedMedia` for anything else (TGA, which has
    no signature, among them). Image bytes pixelwire does not decode go to vLLM's loader only
    once they are identified so."""
    return identify_container(data, "image")


__all__ = [
    "FRAME_LIST_TYPE",
    "FrameListRefused",
    "UnidentifiedMedia",
    "check_frames",
    "checked_container",
    "data_url_parts",
    "frame_list_frames",
    "image_format",
    "is_frame_list",
]
