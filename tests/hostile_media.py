"""Media made to get past a loader: descriptions that make FFmpeg open
other resources (a concat script, an SDP session, an HLS playlist, a DASH
manifest), JPEGs whose headers claim huge sizes, frame lists, and the
``data:`` spellings that only look like vLLM's JPEG-frame form. Shared by
the unit, frontend and vLLM tests of ``pixelwire.loader_input``."""

from __future__ import annotations

import base64
import io
import math
import struct
import wave


def ffconcat(path: str) -> bytes:
    """A concat script naming ``path`` (relative to the opener's directory)."""
    return f"ffconcat version 1.0\nfile {path}\n".encode()


def sdp(port: int, address: str = "127.0.0.1") -> bytes:
    """An SDP session: an RTP video stream on ``address``:``port``."""
    return (
        f"v=0\no=- 0 0 IN IP4 {address}\ns=x\nc=IN IP4 {address}\nt=0 0\n"
        f"m=video {port} RTP/AVP 96\na=rtpmap:96 H264/90000\n"
    ).encode()


def hls(segment: str) -> bytes:
    return f"#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\n{segment}\n#EXT-X-ENDLIST\n".encode()


def dash(segment: str) -> bytes:
    return (
        '<?xml version="1.0"?><MPD xmlns="urn:mpeg:dash:schema:mpd:2011" '
        'profiles="urn:mpeg:dash:profile:isoff-on-demand:2011"><BaseURL>' + segment + "</BaseURL></MPD>"
    ).encode()


def descriptions(path: str = "marker.mp4", port: int = 5004) -> dict[str, bytes]:
    """Every description above, by name."""
    return {"ffconcat": ffconcat(path), "sdp": sdp(port), "hls": hls(path), "dash": dash(path)}


def jpeg(width: int = 128, height: int = 128) -> bytes:
    """A small real JPEG of a gradient."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.linear_gradient("L").resize((width, height)).convert("RGB").save(buffer, "JPEG", quality=80)
    return buffer.getvalue()


def jpeg_claiming(width: int, height: int) -> bytes:
    """The small JPEG with its frame header (SOF) claiming ``width`` x
    ``height``: a decoder that trusts it takes width * height * 3 bytes."""
    data = bytearray(jpeg())
    at = 2
    while at < len(data):
        marker, length = data[at + 1], struct.unpack(">H", data[at + 2 : at + 4])[0]
        if marker in (0xC0, 0xC1, 0xC2):
            data[at + 5 : at + 9] = struct.pack(">HH", height, width)
            return bytes(data)
        at += 2 + length
    raise AssertionError("no SOF marker")


def frame_list(frames: list[bytes], media_type: str = "video/jpeg") -> str:
    """Frames as vLLM's JPEG-frame form, with ``media_type`` in its header."""
    return f"data:{media_type};base64," + ",".join(base64.b64encode(f).decode() for f in frames)


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


def wav(seconds: float = 0.25, rate: int = 16000) -> bytes:
    """A real mono 16-bit WAV of a 440 Hz tone."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        samples = (int(8000 * math.sin(2 * math.pi * 440 * i / rate)) for i in range(int(seconds * rate)))
        out.writeframes(b"".join(struct.pack("<h", s) for s in samples))
    return buffer.getvalue()


# Spellings of a data: URL's header around vLLM's JPEG-frame type: whether
# vLLM reads each as a frame list is what vLLM's own parser says (the vLLM
# group checks pixelwire agrees on every one).
FRAME_LIST_SPELLINGS = [
    "video/jpeg;base64",
    "VIDEO/JPEG;base64",
    "Video/Jpeg;base64",
    "video/jpeg;charset=x;base64",
    "video/jpeg;;base64",
    "video/jpegx;base64",
    "video/jpeg2000;base64",
    "video/jpeg ;base64",
    " video/jpeg;base64",
    "video/jpeg\t;base64",
    "video/jpeg;BASE64",
    "video/jpeg;base64 ",
    "video/jpeg; base64",
    "video/jpeg,base64",
    "video/jpeg",
    "video/mp4;base64",
    "video/x-jpeg;base64",
    "image/jpeg;base64",
    ";base64",
    "video/jpeg;x=video/jpeg;base64",
    "video/mp4;x=video/jpeg;base64",
    "video/jpeg%3Bbase64",
]
