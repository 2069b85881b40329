"""pixelwire reads a ``data:`` URL's header exactly as vLLM 0.32 does
(``pixelwire.loader_input``), checked against vLLM's own code: its
``MediaConnector._load_data_url`` and ``VideoMediaIO.load_base64`` walked
over a grammar of spellings (case, spaces, parameters, prefixes of the
JPEG-frame type, the ``base64`` marker), and both sides must agree on
every one: which URLs vLLM refuses (and with which exception), which media
type and payload it hands its loader, and which it reads as a JPEG-frame
list. A disagreement is how a client's bytes could reach a loader pixelwire
thought it had kept them from."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import pytest
from hostile_media import FRAME_LIST_SPELLINGS

from pixelwire.loader_input import data_url_parts, is_frame_list

pytestmark = pytest.mark.vllm

PAYLOAD = base64.b64encode(b"first").decode() + "," + base64.b64encode(b"second").decode()


class _Stop(Exception):
    """Ends vLLM's load once the recorder has seen where the bytes went."""


def _vllm_reads(url: str) -> tuple[str, Any]:
    """What vLLM does with ``url`` as a video: ("refused", exception type),
    ("frame", first frame's text) or ("bytes", the bytes). vLLM's video
    MediaIO, its two ends recorded instead of decoding: a frame handed to
    the image loader (the JPEG-frame form), or bytes to the video loader."""
    from vllm.multimodal.media import MediaConnector
    from vllm.multimodal.media.image import ImageMediaIO
    from vllm.multimodal.media.video import VideoMediaIO

    seen: list[tuple[str, Any]] = []

    class Frames(ImageMediaIO):
        def load_base64(self, media_type: str, data: str) -> Any:
            seen.append(("frame", data))
            raise _Stop

    class Recorder(VideoMediaIO):
        def load_bytes(self, data: bytes) -> Any:
            seen.append(("bytes", data))
            raise _Stop

    try:
        MediaConnector()._load_data_url(url, Recorder(Frames(), num_frames=-1))
    except _Stop:
        return seen[0]
    except Exception as error:  # noqa: BLE001 - the exception's type is the answer
        return "refused", type(error)
    raise AssertionError("vLLM's loader returned without loading")


def _pixelwire_reads(url: str) -> tuple[str, Any]:
    try:
        _, payload = data_url_parts(url)
    except (ValueError, NotImplementedError) as error:
        return "refused", type(error)
    if is_frame_list(url):
        return "frame", payload.split(",")[0]
    try:
        return "bytes", base64.b64decode(payload, validate=True)
    except binascii.Error as error:
        return "refused", type(error)


@pytest.mark.parametrize("header", FRAME_LIST_SPELLINGS)
@pytest.mark.parametrize("scheme", ["data:", "DATA:", "Data:"])
def test_pixelwire_reads_every_spelling_as_vllm_does(scheme: str, header: str) -> None:
    for payload in (PAYLOAD, PAYLOAD.split(",")[0]):
        url = f"{scheme}{header},{payload}"
        assert _pixelwire_reads(url) == _vllm_reads(url), url


def test_the_walk_can_tell_the_two_forms_apart() -> None:
    """The comparison above would catch a prefix test: vLLM reads a type
    that only starts like its frame form as a container's bytes."""
    url = f"data:video/jpegx;base64,{PAYLOAD.split(',')[0]}"
    assert _vllm_reads(url) == ("bytes", b"first")
    assert url[:15].lower() == "data:video/jpeg"  # what a prefix test would have taken for frames
    assert _pixelwire_reads(url)[0] == "bytes"
