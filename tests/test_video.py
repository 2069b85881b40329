"""pixelwire.video: decode_video's frames and metadata, the stream info of
every codec and container, bad input and limits. Parity with vLLM's own
loader is the vLLM group's (tests/e2e/test_video_parity.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

import pixelwire
from pixelwire import (
    ImageTooLarge,
    UnsupportedVideo,
    VideoDecodeError,
    VideoLimits,
    VideoTooLarge,
    decode_video,
)
from pixelwire._native import VideoCapture, VideoFrameCountChanged
from pixelwire.resize.families.smart import SmartPolicy
from pixelwire.resize.families.smart_video import read_qwen3_vl_video
from pixelwire.video.decode import sample_video

import video_clips as video_clips_module

CODECS = {
    "h264": "h264",
    "hevc": "hevc",
    "vp8": "vp8",
    "vp9": "vp9",
    "av1": "libdav1d",
    "mpeg4": "mpeg4",
}


def test_every_clip_decodes_to_c_contiguous_rgb_frames_of_the_stream_size(video_clips):
    for name, data in video_clips.items():
        info = VideoCapture(data).info()
        frames, metadata = decode_video(data)
        assert frames.dtype == np.uint8 and frames.flags.c_contiguous, name
        assert frames.shape == (len(metadata["frames_indices"]), info["height"], info["width"], 3), name
        assert frames.shape[0] > 0, name
        assert info["codec"] == CODECS[name.split("_")[0].split(".")[0]], name


def test_metadata_has_vllms_keys_and_values_for_a_known_clip(video_clips):
    data = video_clips["h264_high_bframes.mp4"]  # 24 frames at 25 fps
    frames, metadata = decode_video(data, num_frames=8)
    assert metadata == {
        "total_num_frames": 24,
        "fps": 25.0,
        "duration": 0.96,
        "video_backend": "opencv",
        "frames_indices": [0, 3, 6, 9, 13, 16, 19, 23],
        "do_sample_frames": False,
    }
    assert frames.shape == (8, 240, 320, 3)


def test_all_frames_when_fewer_than_asked_and_fps_bounds_the_count(video_clips):
    data = video_clips["h264_high_bframes.mp4"]
    frames, metadata = decode_video(data)  # num_frames=32 by default, as vLLM
    assert metadata["frames_indices"] == list(range(24)) and metadata["do_sample_frames"]
    assert len(frames) == 24
    _, by_fps = decode_video(data, num_frames=-1, fps=5)  # floor(0.96 s * 5) = 4
    assert by_fps["frames_indices"] == [0, 7, 15, 23]


@pytest.mark.parametrize(
    "name",
    [
        "h264_high_bframes.mp4",
        "h264_open_gop.mkv",
        "hevc.mp4",
        "hevc_10bit.mkv",
        "hevc_temporal_layers.mp4",
        "hevc_claims_one_layer.mp4",
        "h264_short_gops.mp4",
        "hevc_short_gops.mp4",
    ],
)
def test_sampled_frames_are_the_same_frames_as_decoding_everything(video_clips, name):
    """Sampling a few frames skips the H.264 and HEVC frames nothing refers
    to (or, where the stream breaks what skipping relies on, reads every
    frame again): the frames kept are those of decoding every frame."""
    data = video_clips[name]
    every, _ = decode_video(data, num_frames=-1)
    for num_frames in (2, 3, 5):
        some, metadata = decode_video(data, num_frames=num_frames)
        assert len(metadata["frames_indices"]) == num_frames
        assert np.array_equal(some, every[metadata["frames_indices"]]), num_frames


SHORT_GOPS = ["h264_short_gops.mp4", "hevc_short_gops.mp4"]


@pytest.mark.parametrize("name", SHORT_GOPS)
def test_a_read_decodes_only_the_gops_of_its_frames_up_to_the_last_of_each(video_clips, name):
    """No picture after an IDR picture refers to one before it: a read
    leaves undecoded every GOP that holds no wanted frame, and each other
    GOP's packets after the last that a wanted frame needs."""
    gop = video_clips_module.SHORT_GOP
    data = video_clips[name]
    for wanted in ([3], [3, 5 * gop + 3], [gop - 1, 4 * gop + 2], [2 * gop, 2 * gop + 1]):
        capture = VideoCapture(data, settle_count=True)
        before = capture.packets_decoded()
        _, indices = capture.read(wanted)
        assert indices == wanted
        gops = {index // gop for index in wanted}
        # The reference frames alone of every GOP up to the last wanted
        # frame's would be more than these GOPs' packets.
        assert capture.packets_decoded() - before <= len(gops) * gop, wanted
    first = VideoCapture(data, settle_count=True)
    before = first.packets_decoded()
    first.read([0])
    assert first.packets_decoded() - before < gop // 2


@pytest.mark.parametrize(
    "name", [*SHORT_GOPS, "h264_unreadable_tail.mp4", "h264_high_bframes.mp4", "vp9_short_gops.webm"]
)
def test_any_frames_read_are_those_of_decoding_everything(video_clips, name):
    """Random sets of frames, with the count settled at open and shared
    with the read: each read gives the frames of decoding every frame."""
    data = video_clips[name]
    count = VideoCapture(data, settle_count=True).info()["frame_count"]
    every, every_indices = VideoCapture(data, settle_count=True).read(list(range(count)))
    assert every_indices == list(range(count))
    rng = random.Random(name)
    for _ in range(30):
        wanted = sorted(rng.sample(range(count), rng.randint(1, 6)))
        for settle_count in (True, False):
            capture = VideoCapture(data, settle_count=settle_count)
            if capture.info()["frame_count"] != count:
                with pytest.raises(VideoFrameCountChanged):
                    capture.read(wanted)
                continue
            frames, indices = capture.read(wanted)
            assert indices == wanted, (wanted, settle_count)
            assert np.array_equal(frames, every[wanted]), (wanted, settle_count)


def test_frames_read_from_a_damaged_h264_stream_are_those_of_decoding_everything(video_clips):
    """The decoder conceals a damaged H.264 picture from the last picture
    it decoded, which is another one when frames were skipped: a read that
    skips gives up on the decoder's first error and decodes every frame,
    so its frames are those of decoding everything (one decoder thread,
    where decoding is deterministic)."""
    data = video_clips["h264_short_gops.mp4"]
    rng = random.Random(7)
    differing = []
    for trial in range(12):
        bad = video_clips_module.damage(data, rng)
        capture = VideoCapture(bad, threads=1, settle_count=True)
        count = capture.info()["frame_count"]
        every, every_indices = capture.read(list(range(count)))
        at = {index: k for k, index in enumerate(every_indices)}
        for _ in range(4):
            wanted = sorted(rng.sample(range(count), rng.randint(1, 6)))
            frames, indices = VideoCapture(bad, threads=1, settle_count=True).read(wanted)
            assert indices == [i for i in wanted if i in at], (trial, wanted)
            if not all(np.array_equal(frame, every[at[i]]) for frame, i in zip(frames, indices, strict=True)):
                differing.append((trial, wanted))
    assert differing == []


def test_qwen3_vl_loader_samples_at_two_fps_with_at_least_four_frames(video_clips):
    _, metadata = decode_video(video_clips["h264_high_bframes.mp4"], loader="qwen3_vl")
    assert metadata["frames_indices"] == [0, 8, 15, 23]


def test_qwen2_vl_loader_samples_a_multiple_of_the_temporal_patch(video_clips):
    _, metadata = decode_video(video_clips["h264_high_bframes.mp4"], loader="qwen2_vl")
    assert metadata["frames_indices"] == [0, 6, 12, 18]


def test_a_video_a_loader_has_nothing_to_sample_in_is_a_typed_error(bad_videos):
    """A valid one-frame clip gives the qwen2_vl loader no pair of frames:
    a ValueError that says so (a 400 at the frontend and in vLLM), not a
    ZeroDivisionError from its index arithmetic."""
    data = bad_videos["one_frame.mp4"]
    with pytest.raises(ValueError, match=r"groups of 2 .* 1 frame"):
        decode_video(data, loader="qwen2_vl")


def test_a_frame_rate_the_loaders_arithmetic_cannot_use_is_a_typed_error(monkeypatch, video_clips):
    """Whatever a header's frame count and rate make of a loader's index
    arithmetic (an overflow, a division by zero), the read fails with a
    VideoDecodeError naming them."""
    from pixelwire.video import loaders

    def overflowing(*args, **kwargs):
        return int(float("inf"))

    monkeypatch.setattr(loaders.Qwen3VL, "frame_indices", overflowing)
    with pytest.raises(pixelwire.VideoDecodeError, match=r"nothing it can sample .*OverflowError"):
        decode_video(video_clips["h264_high_bframes.mp4"], loader="qwen3_vl")


def test_the_bundled_ffmpeg_holds_three_demuxers_its_decoders_and_no_protocol():
    """pixelwire's FFmpeg opens nothing but the bytes it is given: no input
    protocol (no file:, no network), and only the MP4/MOV, Matroska/WebM
    and AVI demuxers (no concat, playlists, SDP/RTP or image sequences).
    SECURITY.md lists the same components."""
    components = pixelwire._native.ffmpeg_components()
    assert components["protocols"] == []
    assert sorted(components["demuxers"]) == ["avi", "matroska,webm", "mov,mp4,m4a,3gp,3g2,mj2"]
    decoders = ["av1", "h263", "h264", "hevc", "libdav1d", "mpeg4", "vp8", "vp9"]
    assert sorted(components["decoders"]) == decoders


def test_a_cancelled_control_stops_the_open_before_it_decodes(video_clips):
    """A capture whose control is cancelled decodes nothing: its open (the
    end-of-stream check that settles the frame count, decoding to the end
    for VP9) raises Cancelled at once."""
    for name in ("vp9.webm", "h264_high_bframes.mp4", "mpeg4_bframes.avi"):
        control = pixelwire._native.BatchControl()
        control.cancel()
        with pytest.raises(pixelwire.Cancelled):
            VideoCapture(video_clips[name], settle_count=True, control=control)
        with pytest.raises(pixelwire.Cancelled):
            decode_video(video_clips[name], control=control)


def test_an_abandoned_read_stops_within_a_frame(long_video):
    """A read of 32 frames across 3,000 on one decoder thread, cancelled
    from another thread after 0.1 s, raises Cancelled (the time it took to
    stop is printed)."""
    import threading

    control = pixelwire._native.BatchControl()
    outcome: dict[str, Any] = {}

    def read() -> None:
        try:
            decode_video(long_video, num_frames=32, threads=1, control=control)
            outcome["done"] = time.monotonic()
        except pixelwire.Cancelled:
            outcome["cancelled"] = time.monotonic()

    thread = threading.Thread(target=read)
    thread.start()
    time.sleep(0.1)
    control.cancel()
    cancelled_at = time.monotonic()
    thread.join(60)
    assert "cancelled" in outcome, outcome
    print(f"\n  stopped {1000 * (outcome['cancelled'] - cancelled_at):.1f} ms after the cancel")


def test_decoder_thread_count_does_not_change_the_frames(video_clips):
    data = video_clips["h264_open_gop.mkv"]
    one, _ = decode_video(data, threads=1)
    many, _ = decode_video(data, threads=4)
    assert np.array_equal(one, many)


def test_any_buffer_is_accepted(video_clips):
    data = video_clips["vp9.webm"]
    expected, _ = decode_video(data)
    for buffer in (bytearray(data), memoryview(data)):
        assert np.array_equal(decode_video(buffer)[0], expected)


def test_high_bit_depth_and_odd_sizes_keep_their_stream_size(video_clips):
    for name, pix_fmt in (("hevc_10bit.mkv", "yuv420p10le"), ("vp9_10bit.mkv", "yuv420p10le")):
        assert VideoCapture(video_clips[name]).info()["pix_fmt"] == pix_fmt
    for name in ("h264_odd_853x480_444.mp4", "vp9_odd_853x480.webm"):
        frames, _ = decode_video(video_clips[name])
        assert frames.shape[1:] == (480, 853, 3), name


def test_rotated_clips_come_back_rotated_as_opencv_rotates_them(video_clips):
    """OpenCV applies the display matrix (CAP_PROP_ORIENTATION_AUTO) and
    reports the rotated size; the pixels are the unrotated frame turned."""
    for name, turns in (("h264_rotated_90.mp4", -1), ("h264_rotated_270.mp4", 1)):
        data = video_clips[name]
        info = VideoCapture(data).info()
        assert (info["rotation"], info["width"], info["height"]) == (-90 * turns % 360, 240, 320)
        frames, _ = decode_video(data)
        upright, _ = decode_video(video_clips_module.rotate_mp4(data, 0))
        assert np.array_equal(frames, np.rot90(upright, k=turns, axes=(1, 2)))


def test_variable_frame_rate_counts_the_frames_that_are_there(video_clips):
    """The header's estimate (duration x average fps) overstates a VFR clip;
    the seek to the end that vLLM does finds the 12 real frames."""
    info = VideoCapture(video_clips["h264_vfr.mkv"]).info()
    assert info["header_frame_count"] > 12 and info["frame_count"] == 12


def _sampled(capture: VideoCapture, **kwargs: Any) -> list[int]:
    return sample_video(capture, "opencv", 32, None, kwargs)[1]


def test_h264_hevc_and_vp9_leave_the_frame_count_to_the_read_unless_settled(video_clips):
    """The end-of-stream count is shared with the read for an H.264 or HEVC
    stream whose seek to the end lands on an IDR picture, and a VP9 stream
    whose seek lands on a shown key frame: provisional at open (the
    header's); other codecs, and settle_count, settle it at open."""
    shared_names = ("h264_high_bframes.mp4", "hevc.mp4", "h264_unreadable_tail.mp4")
    for name in (*shared_names, "vp9.webm", "vp9_short_gops.webm", "vp9_10bit.mkv"):
        shared = VideoCapture(video_clips[name]).info()
        assert not shared["frame_count_settled"], name
        assert shared["frame_count"] == shared["header_frame_count"], name
        assert VideoCapture(video_clips[name], settle_count=True).info()["frame_count_settled"], name
    for name in ("av1.mkv", "mpeg4.mp4", "vp8.webm"):
        assert VideoCapture(video_clips[name]).info()["frame_count_settled"], name
    # The VP9 clip's last GOP is decoded once, by the read, not also at open.
    data = video_clips["vp9_short_gops.webm"]
    decoded = {}
    for settle_count in (False, True):
        capture = VideoCapture(data, settle_count=settle_count)
        capture.read([0, capture.info()["frame_count"] - 1])
        decoded[settle_count] = capture.packets_decoded()
    assert decoded[False] + video_clips_module.SHORT_GOP <= decoded[True], decoded


def test_a_count_shared_with_the_read_gives_the_frames_of_the_count_settled_at_open(
    video_clips, corrupt_video
):
    """On every clip, the corrupt one and the one whose last frames do not
    decode: where the provisional count is the settled one, the read gives
    the settled read's frames; where it is not, the read refuses with
    VideoFrameCountChanged; decode_video gives the settled frames either way."""
    changed = []
    for name, data in {**video_clips, "corrupt.mp4": corrupt_video}.items():
        settled = VideoCapture(data, settle_count=True)
        count = settled.info()["frame_count"]
        wanted = _sampled(settled)
        frames, indices = settled.read(wanted)
        shared = VideoCapture(data)
        if shared.info()["frame_count"] == count:
            again, again_indices = shared.read(_sampled(shared))
            assert again_indices == indices, name
            assert np.array_equal(again, frames), name
        else:
            changed.append(name)
            with pytest.raises(VideoFrameCountChanged):
                shared.read(_sampled(shared))
        decoded, metadata = decode_video(data)
        assert metadata["total_num_frames"] == count and metadata["frames_indices"] == indices, name
        assert np.array_equal(decoded, frames), name
    assert changed == ["h264_unreadable_tail.mp4"]


def test_a_read_that_stops_before_the_end_still_settles_the_count(video_clips):
    """A read whose last index is before where the seek to the end lands
    does not read on to the end: it settles the count (decoding the end as
    OpenCV does) and refuses when that is not the count it was sampled over."""
    data = video_clips["h264_unreadable_tail.mp4"]
    count = VideoCapture(data, settle_count=True).info()["frame_count"]
    assert count < VideoCapture(data).info()["frame_count"]
    with pytest.raises(VideoFrameCountChanged, match=f"has {count} frames"):
        VideoCapture(data).read([0, 1])
    good = video_clips["h264_high_bframes.mp4"]
    early, early_indices = VideoCapture(good).read([0, 1])
    assert early_indices == [0, 1]
    assert np.array_equal(early, VideoCapture(good, settle_count=True).read([0, 1])[0])


def test_rgb24_direct_differs_from_bgr24_swapped_at_high_bit_depth(video_clips):
    """Why frames go through BGR24 as OpenCV's do: swscale's direct RGB24
    output is identical for 8-bit input but not for 10-bit."""

    def read(name: str, rgb_direct: bool) -> np.ndarray:
        return VideoCapture(video_clips[name]).read(range(12), rgb_direct=rgb_direct)[0]

    assert np.array_equal(read("h264.avi", True), read("h264.avi", False))
    assert not np.array_equal(read("hevc_10bit.mkv", True), read("hevc_10bit.mkv", False))


# -- bad input -----------------------------------------------------------------


@pytest.mark.parametrize(
    "data", [b"", b"\x00" * 1000, bytes(np.random.default_rng(0).integers(0, 256, 50_000, np.uint8))]
)
def test_bytes_that_are_no_video_raise_video_decode_error(data):
    with pytest.raises(VideoDecodeError):
        decode_video(data)


def test_audio_only_and_zero_frame_files_raise_video_decode_error(bad_videos):
    with pytest.raises(VideoDecodeError, match="no video stream"):
        decode_video(bad_videos["audio_only.mka"])
    with pytest.raises(VideoDecodeError):
        decode_video(bad_videos["zero_frames.mkv"])


@pytest.mark.parametrize("name", ["ffv1.mkv", "mjpeg.avi"])
def test_a_codec_pixelwire_does_not_decode_raises_unsupported_video(bad_videos, name):
    with pytest.raises(UnsupportedVideo, match="no decoder"):
        decode_video(bad_videos[name])
    assert issubclass(UnsupportedVideo, VideoDecodeError)
    assert issubclass(VideoDecodeError, pixelwire.DecodeError)


def test_an_mp4_cut_before_its_index_raises_video_decode_error(bad_videos):
    data = bad_videos["h264_moov_last.mp4"]
    with pytest.raises(VideoDecodeError):
        decode_video(data[: len(data) // 2])


def test_truncated_and_corrupt_streams_give_the_frames_that_decode(video_clips):
    data = video_clips["h264_open_gop.mkv"]
    truncated, metadata = decode_video(data[: len(data) * 6 // 10], num_frames=-1)
    assert 0 < len(truncated) < 24 and metadata["frames_indices"] == list(range(len(truncated)))
    corrupt = bytearray(data)
    noise = np.random.default_rng(1).integers(0, 256, 2000, np.uint8)
    corrupt[len(data) // 3 : len(data) // 3 + 2000] = noise.tobytes()
    frames, metadata = decode_video(bytes(corrupt), num_frames=-1)
    assert len(frames) == len(metadata["frames_indices"]) <= 24


def test_decode_video_resizes_each_frame_to_the_video_processors_size(video_clips):
    """``resize``: the same metadata, each frame at the policy's size for
    the frames sampled (Qwen2-VL's per frame, Qwen3-VL's per video), the
    frames a read with that size gives; a per-video policy keeps the size
    frames of a video sized for the count its processor's own sampling
    keeps (vLLM has it sample those again)."""
    per_frame = SmartPolicy(factor=28, min_pixels=3136, max_pixels=12544)
    per_video = read_qwen3_vl_video({"size": {"shortest_edge": 4096, "longest_edge": 200000}})
    assert per_video is not None
    data = video_clips["h264_odd_853x480_444.mp4"]
    full, metadata = decode_video(data, loader="qwen3_vl")
    assert len(full) == 4 < metadata["total_num_frames"]
    for policy, target in ((per_frame, (84, 140)), (per_video, (160, 288))):
        frames, resized_metadata = decode_video(data, loader="qwen3_vl", resize=policy)
        assert resized_metadata == metadata and frames.shape == (4, *target, 3) and frames.flags.c_contiguous
        options = {"resize": target, "resize_kernel": policy.kernel, "resize_filter": policy.filter}
        read, _ = VideoCapture(data).read(metadata["frames_indices"], **options)
        np.testing.assert_array_equal(frames, read)
    every, metadata = decode_video(data, num_frames=-1, resize=per_video)
    # int(6 / 25 * 2) = 0 frames, at least 4: the size for 4.
    assert metadata["do_sample_frames"] and every.shape == (6, 160, 288, 3)
    assert decode_video(data, num_frames=-1, resize=per_frame)[0].shape == (6, 84, 140, 3)


def test_a_per_video_size_follows_the_frames_that_decode(corrupt_video):
    """A corrupt stream decodes fewer frames than were asked for (here all
    of them, sized for the 4 the processor would sample of them): the size
    of a per-video policy is the one for the frames that decoded (the count
    the processor sees), not for those asked for."""
    policy = read_qwen3_vl_video({"size": {"shortest_edge": 4096, "longest_edge": 200000}})
    assert policy is not None
    frames, metadata = decode_video(corrupt_video, num_frames=-1, resize=policy)
    valid, total = metadata["frames_indices"], metadata["total_num_frames"]
    assert 0 < len(valid) < total
    target = policy.video_target(240, 320, len(valid), total, metadata["fps"])
    asked = policy.video_target(240, 320, total, total, metadata["fps"])
    assert target != asked != (240, 320) and frames.shape == (len(valid), *target, 3)
    options = {"resize": target, "resize_kernel": policy.kernel, "resize_filter": policy.filter}
    np.testing.assert_array_equal(frames, VideoCapture(corrupt_video).read(valid, **options)[0])


def test_a_far_frame_index_ends_at_the_end_of_the_stream(video_clips):
    """A header can claim hours of frames; reading stops where the stream does."""
    started = time.monotonic()
    frames, indices = VideoCapture(video_clips["vp8.webm"]).read([3, 10**12])
    assert indices == [3] and frames.shape[0] == 1
    assert time.monotonic() - started < 5


def test_a_tiny_file_claiming_a_thousand_hours_is_refused_unless_max_seconds_allows_it(video_clips):
    """Refused from the headers by default; allowed, it is sampled over the
    frames that are really there."""
    data = video_clips_module.claim_duration_mkv(video_clips["h264_open_gop.mkv"], 3.6e9)
    with pytest.raises(VideoTooLarge, match="max_seconds") as raised:
        decode_video(data)
    over = raised.value
    assert (over.setting, over.limit, over.actual) == ("max_seconds", 10_800, 3_600_000)
    started = time.monotonic()
    allowed = VideoLimits(max_seconds=4_000_000)
    info = VideoCapture(data, limits=allowed).info()
    frames, metadata = decode_video(data, limits=allowed)
    assert info["header_frame_count"] == 90_000_000 and metadata["total_num_frames"] == 24
    assert len(frames) == 24 and time.monotonic() - started < 5


def test_a_video_claiming_a_million_frames_a_second_is_counted_by_its_frames(bad_videos):
    """A header's rate cannot make a video cheap: 400 720p frames claiming
    0.4 ms pass a one-second max_seconds, but max_decode_pixels counts the
    frames up to the last sampled one, from the headers, before any frame
    memory; within it they decode."""
    data = bad_videos["h264_million_fps.mp4"]
    frame = 1280 * 720
    assert len(decode_video(data, limits=VideoLimits(max_seconds=1))[0]) == 32
    with pytest.raises(VideoTooLarge) as raised:
        decode_video(data, limits=VideoLimits(max_seconds=1, max_decode_pixels=399 * frame))
    assert (raised.value.setting, raised.value.actual) == ("max_decode_pixels", 400 * frame)
    # Sampling only the start needs only the start decoded.
    frames, _ = decode_video(data, num_frames=2, limits=VideoLimits(max_decode_pixels=400 * frame))
    assert len(frames) == 2


def test_decoding_past_the_budget_stops_as_it_goes(video_clips):
    """The budget also holds as the decoder runs, whatever the headers said:
    the frame count's check at the end of a VP9 stream decodes the stream,
    and stops once it has decoded twice the budget's frames (each pass may
    take it once)."""
    data = video_clips["vp9.webm"]  # 12 frames of 320x240
    with pytest.raises(VideoTooLarge) as raised:
        VideoCapture(data, settle_count=True, limits=VideoLimits(max_decode_pixels=2 * 320 * 240))
    assert raised.value.setting == "max_decode_pixels"
    assert VideoCapture(data, settle_count=True, limits=VideoLimits(max_decode_pixels=12 * 320 * 240))


def test_a_short_video_decodes_while_a_long_one_of_another_client_waits(long_video, video_clips):
    """With one decode running at a time, a long video (32 frames across
    3,000, read on one thread: about 0.3 s alone) of client "a" hands its
    turn on between packets to client "b"'s short clip, which ends while
    the long one is still decoding; first come, first served, the clip
    would wait for it."""
    import threading

    pixelwire._native.configure_video_turns(1)
    ended: list[str] = []
    started = threading.Event()

    def decode(name: str, data: bytes, client: str) -> None:
        if name == "long":
            started.set()
        decode_video(data, num_frames=32 if name == "long" else 2, threads=1, client=client)
        ended.append(name)

    long = threading.Thread(target=decode, args=("long", long_video, "a"))
    long.start()
    started.wait()
    time.sleep(0.05)
    short = threading.Thread(target=decode, args=("short", video_clips["vp8.webm"], "b"))
    short.start()
    short.join(60)
    long.join(120)
    assert ended == ["short", "long"]


@pytest.mark.parametrize("name", ["h264_short_gops.mp4", "hevc_short_gops.mp4", "long"])
def test_a_read_in_pieces_gives_the_frames_of_one_read(video_clips, long_video, name):
    """With two decoder threads, a stream of several coded video sequences
    is read in two pieces at once, split at an IDR picture (the plan says
    where); the frames and metadata are those of one decoder reading from
    the start."""
    data = long_video if name == "long" else video_clips[name]
    capture = VideoCapture(data, threads=2)
    _, wanted = sample_video(capture, "opencv", 32, None, {})
    plan = capture.read_plan(wanted)
    assert len(plan) == 2 and sorted(i for piece in plan for i in piece) == sorted(set(wanted)), plan
    assert VideoCapture(data, threads=1).read_plan(wanted) == [sorted(set(wanted))]
    pieces, one = decode_video(data, threads=2), decode_video(data, threads=1)
    np.testing.assert_array_equal(pieces[0], one[0])
    assert pieces[1] == one[1]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("h264_open_gop.mkv", "open GOPs: its later I pictures are recovery points, not IDR"),
        ("hevc.mp4", "one IDR picture; the others are CRA pictures, whose leading pictures look back"),
        ("vp9.webm", "not H.264 or HEVC"),
        ("h264_high_bframes.mp4", "one coded video sequence"),
    ],
)
def test_a_stream_without_a_second_idr_picture_is_read_in_one_piece(video_clips, name, why):
    """Where decoding cannot start afresh with the same frames (or there is
    no second sequence), the read is not split."""
    capture = VideoCapture(video_clips[name], threads=2)
    _, wanted = sample_video(capture, "opencv", 32, None, {})
    assert capture.read_plan(wanted) == [sorted(set(wanted))], why


def test_a_capture_reads_once(video_clips):
    capture = VideoCapture(video_clips["vp8.webm"])
    capture.read([0])
    with pytest.raises(ValueError, match="closed"):
        capture.read([0])


# -- limits --------------------------------------------------------------------


def test_limits_are_checked_before_frames_are_decoded(video_clips):
    data = video_clips["h264_high_bframes.mp4"]  # 320x240, 24 frames
    cases = [
        (VideoLimits(max_bytes=len(data) - 1), "max_bytes", len(data)),
        (VideoLimits(max_pixels=320 * 240 - 1), "max_pixels", 320 * 240),
        (VideoLimits(max_frames=7), "max_frames", 8),
        (VideoLimits(max_frame_bytes=8 * 320 * 240 * 3 - 1), "max_frame_bytes", 8 * 320 * 240 * 3),
    ]
    for limits, setting, actual in cases:
        with pytest.raises(VideoTooLarge) as raised:
            decode_video(data, num_frames=8, limits=limits)
        assert (raised.value.setting, raised.value.actual) == (setting, actual)
        assert isinstance(raised.value, ImageTooLarge)
    frames, _ = decode_video(data, num_frames=8, limits=VideoLimits(max_frames=8, max_pixels=320 * 240))
    assert len(frames) == 8


def test_video_limits_defaults_and_repr():
    limits = VideoLimits(max_frames=3)
    assert limits.max_frames == 3 and limits.max_pixels == VideoLimits().max_pixels
    assert VideoLimits().max_seconds == pixelwire.config.MAX_VIDEO_SECONDS == 3 * 3600
    assert repr(limits).startswith("VideoLimits(max_bytes=") and "max_seconds=10800" in repr(limits)
    # The decoding of max_seconds of 1080p at 30 frames a second.
    default = VideoLimits().max_decode_pixels
    assert default == pixelwire.config.MAX_VIDEO_DECODE_PIXELS == 10_800 * 30 * 1920 * 1080


def test_decode_video_without_limits_takes_them_from_the_environment(video_clips, monkeypatch):
    data = video_clips["vp8.webm"]  # 0.48 s
    monkeypatch.setenv("PIXELWIRE_MAX_VIDEO_SECONDS", "0")
    with pytest.raises(VideoTooLarge, match="max_seconds"):
        decode_video(data)
    assert len(decode_video(data, limits=VideoLimits())[0]) == 12
    monkeypatch.setenv("PIXELWIRE_MAX_VIDEO_FRAMES", "many")
    with pytest.raises(ValueError, match="PIXELWIRE_MAX_VIDEO_FRAMES"):
        decode_video(data)


# -- hostile input -------------------------------------------------------------

# What each of video_clips.hostile's files gives: an error class and the
# setting it names, or None where vLLM's loader returns the frames that
# decode (a stream cut or scrambled after its headers).
HOSTILE_OUTCOMES: dict[str, tuple[type[Exception], str | None] | None] = {
    "truncated_before_index.mp4": (VideoDecodeError, None),
    "truncated_mid_stream.mkv": None,
    "corrupt_mid_stream.mkv": None,
    "zero_frames.mkv": (VideoDecodeError, None),
    "audio_only.mka": (VideoDecodeError, None),
    "claims_1000_hours.mkv": (VideoTooLarge, "max_seconds"),
    "claims_1e9_frames.avi": (VideoTooLarge, "max_seconds"),
    "unknown_codec_ffv1.mkv": (UnsupportedVideo, None),
    "h264_over_8k.mp4": (VideoTooLarge, "max_pixels"),
    # Only the first video track is probed; OpenCV's reading gets no frame
    # of a one-frame clip (vLLM's loader returns none either).
    "vp9_4k_200_tracks.mkv": (VideoDecodeError, None),
    "stsz_claims_89e6_samples.mp4": (VideoDecodeError, None),
}

# Decodes one file in a fresh interpreter and prints what happened and the
# process's peak RSS (KiB) before and after: a crash shows as a signal, a
# hang as a timeout.
DECODE_AND_MEASURE = """
import json, resource, sys
import pixelwire
data = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    frames, _ = pixelwire.decode_video(data)
    outcome = f"{len(frames)} frames"
except (pixelwire.VideoDecodeError, pixelwire.VideoTooLarge) as e:
    outcome = type(e).__name__
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"outcome": outcome, "before_kib": before, "peak_kib": peak}))
"""


def test_every_hostile_file_has_an_expected_outcome(hostile_videos):
    assert set(hostile_videos) == set(HOSTILE_OUTCOMES)


@pytest.mark.parametrize("name", sorted(HOSTILE_OUTCOMES))
def test_each_hostile_file_is_a_typed_error_or_the_frames_that_decode(hostile_videos, name):
    expected = HOSTILE_OUTCOMES[name]
    started = time.monotonic()
    if expected is None:
        frames, metadata = decode_video(hostile_videos[name], num_frames=-1)
        assert 0 < len(frames) == len(metadata["frames_indices"]) <= 24
    else:
        error, setting = expected
        with pytest.raises(error) as raised:
            decode_video(hostile_videos[name])
        if setting is not None:
            assert raised.value.setting == setting and setting in str(raised.value)
    assert time.monotonic() - started < 5


def test_decoding_hostile_files_keeps_peak_memory_near_a_small_clips(hostile_videos, video_clips, tmp_path):
    """Each file decoded in its own process: the peak RSS stays within
    64 MiB of decoding a small valid clip (a bound, not a timing)."""

    def measure(data: bytes) -> dict[str, Any]:
        path = tmp_path / "input"
        path.write_bytes(data)
        done = subprocess.run(
            [sys.executable, "-c", DECODE_AND_MEASURE, str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    small = measure(video_clips["h264_open_gop.mkv"])
    peaks, grown = {}, {}
    for name, data in sorted(hostile_videos.items()):
        measured = measure(data)
        expected = HOSTILE_OUTCOMES[name]
        outcome = measured["outcome"]
        assert outcome.endswith(" frames") if expected is None else outcome == expected[0].__name__
        peaks[name] = measured["peak_kib"]
        grown[name] = round((measured["peak_kib"] - measured["before_kib"]) / 1024, 1)
    mib = {name: round(peak / 1024, 1) for name, peak in peaks.items()}
    print(f"\npeak RSS (MiB) {small['peak_kib'] / 1024:.1f} for a small clip, {mib}; grown: {grown}")
    assert all(peak < small["peak_kib"] + 64 * 1024 for peak in peaks.values()), peaks


def test_unknown_loader_and_what_vllm_does_differently_are_value_errors(video_clips):
    data = video_clips["vp8.webm"]
    with pytest.raises(ValueError, match="unknown video loader"):
        decode_video(data, loader="glm4v")
    for unsupported in ({"backend": "torchcodec"}, {"frame_recovery": True}):
        with pytest.raises(ValueError, match="opencv backend"):
            decode_video(data, **unsupported)


def test_a_video_with_no_decodable_frame_raises_video_decode_error(video_clips):
    """Frames that all fail to decode (the stream zeroed after its headers)
    are a VideoDecodeError naming the codec, not an empty array."""
    data = video_clips["h264_baseline.mkv"]
    with pytest.raises(VideoDecodeError, match=r"no frame of the video could be decoded \(h264\)"):
        decode_video(data[:600] + bytes(len(data) - 600), num_frames=4)


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs two CPUs to narrow the affinity to one",
)
def test_default_decoder_threads_follow_the_cpu_affinity(
    video_clips: dict[str, bytes], tmp_path: Any
) -> None:
    """A decoder's default threads are the CPUs the process may run on
    (taskset, a container's cpuset), not every online CPU: a child narrowed
    to one CPU gets one thread where this process gets one a CPU."""
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(video_clips["h264_high_bframes.mp4"])
    script = (
        "import os, sys\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from pixelwire._native import VideoCapture\n"
        "print(VideoCapture(open(sys.argv[1], 'rb').read()).info()['threads'])\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script, str(clip)], capture_output=True, text=True, check=True
    )
    assert int(child.stdout) == 1
    wide = VideoCapture(video_clips["h264_high_bframes.mp4"]).info()["threads"]
    assert wide == min(16, len(os.sched_getaffinity(0)))
