"""The media a serving benchmark sends: one photo scaled (Lanczos, cropped
to fill) to 1080p and 4K, encoded as JPEG (quality 90) and PNG (level 6),
each as a ``data:`` URL and as an http URL of a local image server; and one
video (``--video``, or a 10 s 1080p H.264 with B-frames and a 250-frame GOP
made with the ``ffmpeg`` tool when it is installed), both ways too; and
the screenshots of the multi-turn workload (1080p PNGs, one per seed).

Without a photo, a generated stand-in is used (smooth colour fields with
fine noise, so that JPEG and PNG sizes stay in a photo's range); the report
says which.
"""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SIZES = {"1080p": (1920, 1080), "4K": (3840, 2160)}
FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    "JPEG": ("jpg", {"quality": 90}),
    "PNG": ("png", {"compress_level": 6}),
}
SOURCES = ("data:", "http")
MIXED = "mixed"
# Agent conversations that resend their screenshots (pixelwire.bench.multiturn).
MULTI_TURN = "multi-turn"
# Conversations about one video, resent with every turn (the same module).
MULTI_TURN_VIDEO = "multi-turn-video"
MULTI_TURN_KEYS = [MULTI_TURN, MULTI_TURN_VIDEO]
# The video workloads: the same video sent both ways.
VIDEO_KEYS = ["video-data", "video-http"]
VIDEO_FILE = "video.mp4"


@dataclass(frozen=True)
class Input:
    """One encoded image as the client sends it."""

    name: str  # e.g. "JPEG 4K data:"
    key: str  # the same for the command line: "jpeg-4k-data"
    file_name: str
    encoded_bytes: int
    width: int
    height: int
    data_url: str | None  # for source "data:"
    source: str
    kind: str = "image"  # or "video": the content part it travels in

    def url(self, image_base: str) -> str:
        return self.data_url if self.data_url is not None else f"{image_base}/{self.file_name}"


def _stand_in_photo() -> Any:
    """A 1200x800 RGB image with a photo's mix of smooth areas and texture."""
    from PIL import Image, ImageFilter

    size = (1200, 800)
    red = Image.linear_gradient("L").resize(size)
    green = Image.radial_gradient("L").resize(size)
    blue = Image.effect_mandelbrot(size, (-2.0, -1.2, 1.0, 1.2), 64)
    base = Image.merge("RGB", (red, green, blue)).filter(ImageFilter.GaussianBlur(6))
    grain = Image.effect_noise(size, 24).convert("RGB")
    return Image.blend(base, grain, 0.12)


def screenshot(seed: int) -> bytes:
    """A 1920x1080 PNG (level 6) that compresses like a screenshot: flat
    windows, some texture; each seed its own pixels."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    pixels = np.full((1080, 1920, 3), 235, np.uint8)
    for _ in range(60):
        y, x = rng.integers(0, 1000), rng.integers(0, 1800)
        height, width = rng.integers(10, 300), rng.integers(20, 600)
        pixels[y : y + height, x : x + width] = rng.integers(0, 255, 3)
    texture = pixels[::7, ::3]
    texture ^= rng.integers(0, 40, texture.shape, dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG", compress_level=6)
    return out.getvalue()


def data_url(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def distinct_video(data: bytes, seed: int) -> bytes:
    """An MP4 or MOV (ISO BMFF) ``data`` with a ``free`` box of ``seed``
    appended: the same frames to every demuxer (a ``free`` box holds
    nothing), bytes of their own (a cache key of their own). Other
    containers: ValueError."""
    if data[4:8] != b"ftyp":
        raise ValueError("a distinct copy of a video needs an MP4 or MOV (its first box ftyp)")
    payload = b"pixelwire bench " + str(seed).encode()
    return data + (8 + len(payload)).to_bytes(4, "big") + b"free" + payload


def make_inputs(photo: Path | None, folder: Path) -> tuple[list[Input], str]:
    """Writes the encoded images to ``folder`` (served over http) and
    returns the inputs (1080p before 4K, JPEG before PNG, data: before
    http) and a line that says what they were made from."""
    from PIL import Image, ImageOps

    if photo is not None:
        with Image.open(photo) as opened:
            opened.load()
            rgb = ImageOps.exif_transpose(opened).convert("RGB")
        origin = f"photo {photo.name} ({rgb.width}x{rgb.height}), scaled and cropped to fill"
    else:
        rgb = _stand_in_photo()
        origin = "a generated stand-in photo (no --photo given), scaled to fill"
    folder.mkdir(parents=True, exist_ok=True)
    inputs: list[Input] = []
    for size_name, (width, height) in SIZES.items():
        scaled = ImageOps.fit(rgb, (width, height), method=Image.Resampling.LANCZOS)
        for format_name, (extension, options) in FORMATS.items():
            buffer = io.BytesIO()
            scaled.save(buffer, format=format_name, **options)
            data = buffer.getvalue()
            file_name = f"photo-{size_name}.{extension}"
            (folder / file_name).write_bytes(data)
            mime = "image/jpeg" if format_name == "JPEG" else "image/png"
            for source in SOURCES:
                url = data_url(data, mime) if source == "data:" else None
                inputs.append(
                    Input(
                        name=f"{format_name} {size_name} {source}",
                        key=f"{format_name}-{size_name}-{source.rstrip(':')}".lower(),
                        file_name=file_name,
                        encoded_bytes=len(data),
                        width=width,
                        height=height,
                        data_url=url,
                        source=source,
                    )
                )
    return inputs, origin


def make_video_inputs(video: Path | None, folder: Path) -> list[Input]:
    """The video inputs: ``video`` as given, else a 10 s 1080p30 H.264 (GOP
    250, B-frames) of a moving test pattern made with the ``ffmpeg`` tool;
    none when there is neither."""
    target = folder / VIDEO_FILE
    folder.mkdir(parents=True, exist_ok=True)
    if video is not None:
        shutil.copyfile(video, target)
    elif shutil.which("ffmpeg"):
        pattern = "testsrc2=size=1920x1080:rate=30,noise=alls=6:allf=t"
        encode = ["-c:v", "libx264", "-preset", "veryfast", "-g", "250", "-bf", "3", "-pix_fmt", "yuv420p"]
        subprocess.run(
            ["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i", pattern, "-t", "10", *encode, str(target)],
            check=True,
        )
    else:
        return []
    data = target.read_bytes()
    from pixelwire.video import decode_video

    frame = decode_video(data, num_frames=1)[0]
    video_url = data_url(data, "video/mp4")
    return [
        Input(
            name=f"video {frame.shape[2]}x{frame.shape[1]} {source}",
            key=key,
            file_name=VIDEO_FILE,
            encoded_bytes=len(data),
            width=int(frame.shape[2]),
            height=int(frame.shape[1]),
            data_url=video_url if source == "data:" else None,
            source=source,
            kind="video",
        )
        for source, key in zip(SOURCES, VIDEO_KEYS, strict=True)
    ]


IMAGE_KEYS = [
    f"{format_name}-{size_name}-{source.rstrip(':')}".lower()
    for size_name in SIZES
    for format_name in FORMATS
    for source in SOURCES
]
WORKLOAD_KEYS = [*IMAGE_KEYS, MIXED, *VIDEO_KEYS, *MULTI_TURN_KEYS]


def workload_inputs(inputs: list[Input], workload: str) -> list[Input]:
    """The inputs a workload sends in turn: one, or all the images ("mixed")."""
    if workload == MIXED:
        return [i for i in inputs if i.kind == "image"]
    return [i for i in inputs if i.key == workload]


def workload_title(inputs: list[Input], workload: str) -> str:
    return "mixed (all 8 images in turn)" if workload == MIXED else workload_inputs(inputs, workload)[0].name
