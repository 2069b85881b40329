"""Test videos, made at test time with Debian's ``ffmpeg`` CLI (the Makefile
installs it; pixelwire's own FFmpeg decodes only). Every clip is tiny (a
few frames, a few tens of KB) and made once per session."""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
from pathlib import Path

# A moving test pattern: colour bars, a gradient, a counter, a sweep.
PATTERN = ["-f", "lavfi", "-i", "testsrc2=size=320x240:rate=25"]
# Something closer to camera content: a zooming fractal.
SCENE = ["-f", "lavfi", "-i", "mandelbrot=size=320x240:rate=25"]
X264 = ["-c:v", "libx264", "-pix_fmt", "yuv420p"]
X265 = ["-c:v", "libx265", "-x265-params", "log-level=none:bframes=3"]
X265_LAYERS = ["-c:v", "libx265", "-x265-params", "log-level=none:bframes=3:temporal-layers=1"]
VP9 = ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8"]
SVTAV1 = ["-c:v", "libsvtav1", "-preset", "12"]
ODD_SIZE = ["-vf", "scale=853:480", "-frames:v", "6"]

# Frames from one IDR picture to the next in the short-GOP clips.
SHORT_GOP = 10
FIXED_GOPS = f"keyint={SHORT_GOP}:min-keyint={SHORT_GOP}:scenecut=0"

# name -> ffmpeg arguments between the input and the output file. The
# codec x container grid, B-frames and open GOP, an odd size, 10-bit, full
# range and BT.709, variable frame rate and rotation.
CLIPS: dict[str, list[str]] = {
    "h264_high_bframes.mp4": [*PATTERN, "-frames:v", "24", *X264, "-profile:v", "high", "-bf", "3"],
    "h264_baseline.mkv": [*PATTERN, "-frames:v", "12", *X264, "-profile:v", "baseline"],
    "h264.avi": [*PATTERN, "-frames:v", "12", *X264],
    "h264_open_gop.mkv": [
        *PATTERN,
        "-frames:v",
        "24",
        *X264,
        "-bf",
        "2",
        "-x264-params",
        "keyint=8:open-gop=1",
    ],
    "h264_bt709_full_range.mp4": [
        *PATTERN,
        "-frames:v",
        "8",
        *X264[:2],
        "-pix_fmt",
        "yuvj420p",
        "-colorspace",
        "bt709",
        "-color_primaries",
        "bt709",
        "-color_trc",
        "bt709",
    ],
    "h264_odd_853x480_444.mp4": [*PATTERN, *ODD_SIZE, *X264[:2], "-pix_fmt", "yuv444p"],
    "h264_scene.mp4": [*SCENE, "-frames:v", "12", *X264, "-bf", "3"],
    # Two IDR pictures, the frames behind the second ending in two that do
    # not decode (UNREADABLE_TAILS).
    "h264_unreadable_tail.mp4": [*PATTERN, "-frames:v", "40", *X264, "-bf", "3", "-g", "20"],
    # An IDR picture every 10 frames and B-frames: a read of a few frames
    # leaves whole GOPs, and the ends of others, undecoded (SHORT_GOP).
    "h264_short_gops.mp4": [*PATTERN, "-frames:v", "60", *X264, "-bf", "3", "-x264-params", FIXED_GOPS],
    "hevc_short_gops.mp4": [
        *[*PATTERN, "-frames:v", "60", "-c:v", "libx265"],
        *["-x265-params", f"log-level=none:bframes=3:{FIXED_GOPS}:open-gop=0"],
    ],
    "h264_vfr.mkv": [*PATTERN, "-frames:v", "12", "-vf", "setpts=N*N/100/TB", "-fps_mode", "vfr", *X264],
    "h264_rotated_90.mp4": [*PATTERN, "-frames:v", "8", *X264],
    "h264_rotated_270.mp4": [*PATTERN, "-frames:v", "8", *X264, "-bf", "2"],
    "hevc.mp4": [*PATTERN, "-frames:v", "12", *X265],
    "hevc_10bit.mkv": [*PATTERN, "-frames:v", "12", *X265, "-pix_fmt", "yuv420p10le"],
    # Two temporal sub-layers (hvcC says 2): the non-reference B-frames are
    # TSA_N pictures of sub-layer 1.
    "hevc_temporal_layers.mp4": [*PATTERN, "-frames:v", "24", *X265_LAYERS],
    # The same stream, its hvcC claiming one sub-layer (LAYER_CLAIMS): the
    # skipper finds sub-layer 1 where none was declared and reads every frame.
    "hevc_claims_one_layer.mp4": [*PATTERN, "-frames:v", "24", *X265_LAYERS],
    "vp8.webm": [*PATTERN, "-frames:v", "12", "-c:v", "libvpx"],
    "vp9.webm": [*PATTERN, "-frames:v", "12", *VP9],
    "vp9_10bit.mkv": [*PATTERN, "-frames:v", "12", *VP9, "-pix_fmt", "yuv420p10le", "-profile:v", "2"],
    "vp9_odd_853x480.webm": [*PATTERN, *ODD_SIZE, *VP9],
    # A key frame every 10 frames and hidden alternate reference frames
    # (superframes): the seek to the end lands on a key frame 10 frames
    # before the end.
    "vp9_short_gops.webm": [
        *[*PATTERN, "-frames:v", "60", "-c:v", "libvpx-vp9", "-deadline", "good", "-cpu-used", "8"],
        *["-g", str(SHORT_GOP), "-auto-alt-ref", "1", "-lag-in-frames", "8"],
    ],
    "av1.mkv": [*PATTERN, "-frames:v", "12", *SVTAV1],
    "av1_10bit.mp4": [*PATTERN, "-frames:v", "12", *SVTAV1, "-pix_fmt", "yuv420p10le"],
    "mpeg4_bframes.avi": [*PATTERN, "-frames:v", "12", "-c:v", "mpeg4", "-bf", "2", "-q:v", "4"],
    "mpeg4.mp4": [*PATTERN, "-frames:v", "12", "-c:v", "mpeg4", "-q:v", "4"],
}

# Display-matrix rotations (clockwise degrees) written into those mp4s'
# track headers afterwards: Debian's ffmpeg 5.1 CLI has no option that
# writes one.
ROTATIONS = {"h264_rotated_90.mp4": 90, "h264_rotated_270.mp4": 270}
# hvcC temporal-layer counts written over the encoder's afterwards.
LAYER_CLAIMS = {"hevc_claims_one_layer.mp4": 1}

# Reference pictures at the end whose NAL units are made unspecified
# (type 0) afterwards, so no frame comes out of them: the end-of-stream
# count finds fewer frames than the packets promise.
UNREADABLE_TAILS = {"h264_unreadable_tail.mp4": 2}
# Clips whose one video stream is copied into this many tracks.
TRACK_COPIES = {"vp9_4k_200_tracks.mkv": 200}

# Files that are not decodable videos, for the error tests.
# A long clip (3000 frames, about 6 MB; seconds to decode on one core):
# long enough that a decode sampled near its end is still running when its
# caller goes away.
LONG: dict[str, list[str]] = {
    "h264_long_3000_frames.mp4": [
        "-f", "lavfi", "-i", "testsrc2=size=640x360:rate=25", "-frames:v", "3000",
        *X264, "-preset", "ultrafast", "-crf", "40",
    ],
}  # fmt: skip

# The video bomb of an attack on decode capacity, and its victim. The bomb:
# 1,500 flat 1080p frames (30 KB) whose container claims a million frames
# a second, so 0.0015 s long by its headers; sampled over its length, every
# frame is decoded, one after another (one keyframe: no piece of it decodes
# beside another), about 1.5 s on one core. The victim: 5 s of 720p.
VIDEO_BOMB: dict[str, list[str]] = {
    "h264_1080p_million_fps_bomb.mp4": [
        *["-f", "lavfi", "-i", "color=c=black:size=1920x1080:rate=1000000"],
        *["-frames:v", "1500", *X264, "-preset", "ultrafast", "-g", "1500"],
    ],
    "h264_720p_5s.mp4": [
        *["-f", "lavfi", "-i", "testsrc2=size=1280x720:rate=30"],
        *["-frames:v", "150", *X264, "-preset", "ultrafast"],
    ],
}

BAD_SOURCES: dict[str, list[str]] = {
    "audio_only.mka": ["-f", "lavfi", "-i", "sine=frequency=440:duration=0.5", "-c:a", "pcm_s16le"],
    "zero_frames.mkv": [*PATTERN, "-frames:v", "0", *X264],
    "ffv1.mkv": [*PATTERN, "-frames:v", "4", "-c:v", "ffv1"],
    "mjpeg.avi": [*PATTERN, "-frames:v", "4", "-c:v", "mjpeg"],
    # One 4K frame, copied into 200 tracks (TRACK_COPIES): probing every
    # track decoded 200 4K frames at once.
    "vp9_4k_200_tracks.mkv": [
        *["-f", "lavfi", "-i", "color=c=black:size=3840x2160:rate=1"],
        "-frames:v",
        "1",
        *VP9,
    ],
    # 400 flat 720p frames whose container claims a million frames a
    # second: 0.4 ms long by its headers, 400 frames to decode all the same.
    "h264_million_fps.mp4": [
        *["-f", "lavfi", "-i", "color=c=black:size=1280x720:rate=1000000"],
        *["-frames:v", "400", *X264, "-preset", "ultrafast"],
    ],
    # One valid frame: Qwen2-VL samples frames in pairs.
    "one_frame.mp4": [*PATTERN, "-frames:v", "1", *X264],
    # moov at the end (no faststart): cut in half, the index is gone.
    "h264_moov_last.mp4": [*PATTERN, "-frames:v", "24", *X264],
    # One flat frame a little over 8K (7680x4320, VideoLimits' default
    # max_pixels): 100 KB that would decode to 50 MB a frame.
    "h264_over_8k.mp4": [
        *["-f", "lavfi", "-i", "color=c=gray:size=7936x4320:rate=25"],
        *["-frames:v", "1", *X264, "-preset", "ultrafast"],
    ],
}


def rotate_mp4(data: bytes, degrees: int) -> bytes:
    """Sets the (only) track header's matrix to a clockwise rotation: the
    matrix of a version-0 ``tkhd`` starts 48 bytes into the box."""
    at = data.find(b"tkhd") - 4
    if at < 0 or data[at + 8] != 0:
        raise ValueError("no version-0 tkhd box")
    sin = {0: 0, 90: 1, 180: 0, 270: -1}[degrees] << 16
    cos = {0: 1, 90: 0, 180: -1, 270: 0}[degrees] << 16
    matrix = struct.pack(">9i", cos, sin, 0, -sin, cos, 0, 0, 0, 1 << 30)
    return data[: at + 48] + matrix + data[at + 84 :]


def unreadable_tail_mp4(path: Path, pictures: int) -> bytes:
    """The mp4 with its last ``pictures`` non-IDR reference pictures (in
    decoding order; one slice each, lengths of 4 bytes) turned into
    unspecified NAL units, which a decoder ignores."""
    ffprobe = shutil.which("ffprobe")
    if ffprobe is None:
        raise RuntimeError("the video tests need the ffprobe CLI (make setup installs it)")
    shown = subprocess.run(
        [
            ffprobe,
            "-v",
            "error",
            "-select_streams",
            "v:0",
            "-show_entries",
            "packet=pos",
            "-of",
            "csv=p=0",
            str(path),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    data = bytearray(path.read_bytes())
    header_at = [int(line.strip().rstrip(",")) + 4 for line in shown.stdout.split()]
    referenced = [at for at in header_at if data[at] & 0x1F == 1 and data[at] >> 5 != 0]
    if len(referenced) < pictures:
        raise ValueError(f"fewer than {pictures} non-IDR reference pictures")
    for at in referenced[-pictures:]:
        data[at] = 0
    return bytes(data)


def claim_temporal_layers_mp4(data: bytes, layers: int) -> bytes:
    """Rewrites hvcC's numTemporalLayers (bits 3-5 of its 22nd byte),
    leaving the stream itself as it is."""
    at = data.find(b"hvcC") + 4
    if at < 4 or data[at] != 1:
        raise ValueError("no version-1 hvcC box")
    byte = (data[at + 21] & ~0b111000) | (layers << 3)
    return data[: at + 21] + bytes([byte]) + data[at + 22 :]


def claim_duration_mkv(data: bytes, milliseconds: float) -> bytes:
    """Rewrites a Matroska file's Duration (an 8-byte float, in the default
    1 ms timecode scale): a tiny file that claims hours of frames."""
    at = data.find(b"\x44\x89\x88")
    if at < 0:
        raise ValueError("no 8-byte Duration element")
    return data[: at + 3] + struct.pack(">d", milliseconds) + data[at + 11 :]


def claim_frame_count_avi(data: bytes, frames: int) -> bytes:
    """Rewrites an AVI's frame counts (the main header's total frames and the
    video stream header's length), leaving the frames themselves as they are."""
    avih, strh = data.find(b"avih"), data.find(b"strh")
    if avih < 0 or strh < 0:
        raise ValueError("no avih or strh chunk")
    patched = bytearray(data)
    struct.pack_into("<I", patched, avih + 8 + 16, frames)  # dwTotalFrames
    struct.pack_into("<I", patched, strh + 8 + 32, frames)  # dwLength
    return bytes(patched)


def scramble(data: bytes, start: int, length: int, seed: int = 1) -> bytes:
    """``length`` random bytes written over ``data`` from ``start``."""
    noise = random.Random(seed).randbytes(length)
    return data[:start] + noise + data[start + length :]


def damage(data: bytes, rng: random.Random) -> bytes:
    """Six bytes of ``data`` replaced, between a tenth and eight tenths of
    the way in (the coded frames of the test clips, not their index)."""
    out = bytearray(data)
    for _ in range(6):
        out[rng.randrange(len(out) // 10, len(out) * 8 // 10)] = rng.randrange(256)
    return bytes(out)


def hostile(clips: dict[str, bytes], bad: dict[str, bytes]) -> dict[str, bytes]:
    """Hostile inputs, each tiny, made from the clips and the bad sources:
    cut short, scrambled mid-stream, empty of frames, without video, claiming
    hours or 10^9 frames, in a codec pixelwire lacks, over 8K, 200 tracks of
    4K frames, sample tables claiming 89 million samples."""
    gop = clips["h264_open_gop.mkv"]
    moov_last = bad["h264_moov_last.mp4"]
    return {
        "truncated_before_index.mp4": moov_last[: len(moov_last) // 2],
        "truncated_mid_stream.mkv": gop[: len(gop) * 6 // 10],
        "corrupt_mid_stream.mkv": scramble(gop, len(gop) // 3, 2000),
        "zero_frames.mkv": bad["zero_frames.mkv"],
        "audio_only.mka": bad["audio_only.mka"],
        "claims_1000_hours.mkv": claim_duration_mkv(gop, 3.6e9),
        "claims_1e9_frames.avi": claim_frame_count_avi(clips["h264.avi"], 10**9),
        "unknown_codec_ffv1.mkv": bad["ffv1.mkv"],
        "h264_over_8k.mp4": bad["h264_over_8k.mp4"],
        "vp9_4k_200_tracks.mkv": bad["vp9_4k_200_tracks.mkv"],
        "stsz_claims_89e6_samples.mp4": claim_sample_count_mp4(clips["h264_high_bframes.mp4"], 89_000_000),
    }


def claim_sample_count_mp4(data: bytes, samples: int) -> bytes:
    """The MP4 with its ``stsz`` box claiming ``samples`` samples of 100
    bytes each (a constant size, so the box needs no table for them)."""
    out = bytearray(data)
    at = out.find(b"stsz") - 4
    struct.pack_into(">II", out, at + 12, 100, samples)
    return bytes(out)


def make(name: str, args: list[str], folder: Path) -> bytes:
    out = folder / name
    if not out.exists():
        ffmpeg = shutil.which("ffmpeg")
        if ffmpeg is None:
            raise RuntimeError("the video tests need the ffmpeg CLI (make setup installs it)")
        # Encoders' own chatter (SVT-AV1 prints its config) goes with the
        # error, not to the test output.
        made = subprocess.run(
            [ffmpeg, "-hide_banner", "-loglevel", "error", "-y", *args, str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if made.returncode != 0:
            raise RuntimeError(f"ffmpeg could not make {name}: {made.stderr[-2000:]}")
        if name in ROTATIONS:
            out.write_bytes(rotate_mp4(out.read_bytes(), ROTATIONS[name]))
        if name in LAYER_CLAIMS:
            out.write_bytes(claim_temporal_layers_mp4(out.read_bytes(), LAYER_CLAIMS[name]))
        if name in UNREADABLE_TAILS:
            out.write_bytes(unreadable_tail_mp4(out, UNREADABLE_TAILS[name]))
        if name in TRACK_COPIES:
            one = out.with_name(f"one-track-{name}")
            out.rename(one)
            quiet = [ffmpeg, "-hide_banner", "-loglevel", "error", "-y"]
            maps = ["-map", "0:v"] * TRACK_COPIES[name]
            copied = subprocess.run(
                [*quiet, "-i", str(one), *maps, "-c", "copy", str(out)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if copied.returncode != 0:
                raise RuntimeError(f"ffmpeg could not copy the tracks of {name}: {copied.stderr[-2000:]}")
    return out.read_bytes()


def make_all(recipes: dict[str, list[str]], folder: Path) -> dict[str, bytes]:
    folder.mkdir(parents=True, exist_ok=True)
    return {name: make(name, args, folder) for name, args in recipes.items()}
