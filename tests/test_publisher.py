"""The publisher (`python/pixelwire/publisher/`, `src/publisher/`):
batches decoded side by side and the failures in them, batches at the
worker, pool exhaustion and recovery, and leases that reclaim unread slots,
read back over real NIXL (UCX). No mocks."""

from __future__ import annotations

import asyncio
import base64
import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import pixelwire
from pixelwire._native import VideoCapture
from pixelwire.config import Layout
from pixelwire.publisher_process import PublisherProcess
from pixelwire.resize import ResizePolicy, image_policy_from_config
from pixelwire.resize.families.smart import SmartPolicy
from pixelwire.resize.families.smart_video import read_qwen3_vl_video
from pixelwire.video.sampling import VideoSampling

from reference import CORPUS, corpus_files

MiB = 1024 * 1024

try:
    pixelwire.transfer.nixl_library_path()
except pixelwire.TransferError as missing:  # pragma: no cover - CI installs it
    pytest.skip(f"NIXL runtime not installed: {missing}", allow_module_level=True)


def test_unread_slots_are_reclaimed_and_late_reads_refused(
    random_png: Callable[..., bytes],
    wait_for: Callable[..., bool],
    start_publisher_process: Callable[..., PublisherProcess],
) -> None:
    publisher_process = start_publisher_process(lease=1.0)
    data = (corpus_files()[0].parent / "hopper.png").read_bytes()
    desc = publisher_process.publish(data)["desc"]
    assert wait_for(lambda: publisher_process.stats()["reclaimed_by_lease"] == 1, 10)
    assert publisher_process.stats()["slots_in_use"] == 0

    async def main() -> None:
        async with pixelwire.Reader(timeout=10) as reader:
            with pytest.raises(pixelwire.DescriptorError, match="lease has expired"):
                await reader.read_decoded(desc, output="numpy")
            # A reader whose clock disagrees still never gets pixels: the
            # slot was scrubbed (and may hold another image by now).
            skewed = copy.deepcopy(desc)
            skewed["pixelwire"]["expires_at"] = time.time() + 3600
            with pytest.raises(pixelwire.TransferError, match="reclaimed or reused"):
                await reader.read_decoded(skewed, output="numpy")
            publisher_process.publish(random_png(128, 128, seed=5))  # reuses the slot
            with pytest.raises(pixelwire.TransferError, match="reclaimed or reused"):
                await reader.read_decoded(skewed, output="numpy")

    asyncio.run(main())


def test_pool_exhaustion_and_recovery(
    random_png: Callable[..., bytes],
    wait_for: Callable[..., bool],
    start_publisher_process: Callable[..., PublisherProcess],
) -> None:
    publisher_process = start_publisher_process(pool_bytes=1 * MiB, acquire=0.5)
    image = random_png(300, 300)  # 270 000 bytes of pixels
    descs = [publisher_process.publish(image)["desc"] for _ in range(3)]
    started = time.monotonic()
    answer = publisher_process.publish(image)
    waited = time.monotonic() - started
    assert answer.get("error") == "PoolExhausted", answer
    assert waited >= 0.45

    async def main() -> None:
        async with pixelwire.Reader() as reader:
            await reader.read_decoded(descs[0], output="numpy")

    asyncio.run(main())
    assert wait_for(lambda: publisher_process.stats()["slots_in_use"] == 2)
    assert "desc" in publisher_process.publish(image)
    stats = publisher_process.stats()
    assert stats["registered_bytes"] <= 1 * MiB


# Formats, modes and orientations a request's images come in.
BATCH = [
    "hopper.png",
    "flower2.jpg",
    "transparent.png",
    "pil_sample_cmyk.jpg",
    "flower.webp",
    "transparent.gif",
]


async def _until_no_slot_is_in_use(publisher: pixelwire.Publisher) -> dict[str, int]:
    """The publisher's stats once every slot is free (frees by notification
    land on the publisher's own thread), or after 10 s."""
    deadline = time.monotonic() + 10
    while publisher.stats()["slots_in_use"] and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return publisher.stats()


@pytest.mark.parametrize("layout", ["HWC", "RGBX"])
@pytest.mark.parametrize("resized", [False, True])
def test_a_batch_publishes_what_one_publish_at_a_time_does(layout: Layout, resized: bool) -> None:
    """decode_and_publish_many, images decoded side by side on native
    threads: each one, read back over NIXL, is what decode_and_publish gives
    for it alone and what decode_image gives (resized to its own target
    when the policy resizes), with the same descriptor fields, in order."""
    sources = [(CORPUS / name).read_bytes() for name in BATCH]
    size = {"shortest_edge": 3136, "longest_edge": 50176}
    policy = image_policy_from_config(
        {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2, "size": size}
    )
    resize = policy if resized else None

    async def main() -> dict[str, int]:
        async with pixelwire.Publisher() as publisher, pixelwire.Reader() as reader:
            batch = await publisher.decode_and_publish_many(sources, layout=layout, resize=resize)
            assert len(batch) == len(sources)
            targets = set()
            for name, data, decoded in zip(BATCH, sources, batch, strict=True):
                assert isinstance(decoded, pixelwire.Decoded), f"{name}: {decoded!r}"
                alone = await publisher.decode_and_publish(data, layout=layout, resize=resize)
                assert isinstance(alone, pixelwire.Decoded)
                fields = (
                    "shape",
                    "size",
                    "format",
                    "content_hash",
                    "source_sha256",
                    "resize",
                    "layout",
                    "extra",
                )
                for field in fields:
                    assert getattr(decoded, field) == getattr(alone, field), f"{name}: {field}"
                assert decoded.slot != alone.slot
                got = await reader.read_decoded(decoded, output="numpy")
                np.testing.assert_array_equal(
                    got, await reader.read_decoded(alone, output="numpy"), err_msg=name
                )
                height, width = decoded.shape[:2]
                if resize is None:
                    expected = pixelwire.decode_image(data)
                else:
                    assert decoded.resize is not None
                    assert (height, width) == resize.target(*decoded.resize["source"])
                    expected = pixelwire.decode_image(
                        data, resize=(height, width), resize_kernel=resize.kernel, resize_filter=resize.filter
                    )
                targets.add((height, width))
                np.testing.assert_array_equal(got, expected, err_msg=name)
            assert len(targets) > 1, "the images differ in size, resized or not"
            return await _until_no_slot_is_in_use(publisher)

    stats = asyncio.run(main())
    assert stats["slots_in_use"] == 0 and stats["bytes_in_use"] == 0, stats
    assert stats["published"] == 2 * len(sources) and stats["freed_by_notification"] == 2 * len(sources)


def test_a_failing_image_in_a_batch_costs_only_itself(random_png: Callable[..., bytes]) -> None:
    """Each image that cannot be published is its own typed error, in its
    place, returned not raised; every other image is published, reads back
    right, and no slot outlives its image."""
    good = (CORPUS / "hopper.png").read_bytes()
    url = "data:image/png;base64," + base64.b64encode(good).decode()
    sources: list[Any] = [
        good,
        good[:200],  # a PNG cut short: a slot is taken, then the decode fails
        b"not an image",
        random_png(2000, 1500),  # 9 MB of pixels, more than the whole pool
        "http://10.0.0.1/a.png",  # refused by the default guard
        random_png(6000, 1),  # over the publisher's max_side
        url,
        bytearray(good),
        memoryview(good),
    ]
    expected_errors = {
        1: pixelwire.DecodeError,
        2: pixelwire.UnsupportedFormat,
        3: pixelwire.PoolExhausted,
        4: pixelwire.BlockedURL,
        5: pixelwire.ImageTooLarge,
    }
    pixels = pixelwire.decode_image(good)

    async def main() -> dict[str, int]:
        limits = pixelwire.Limits(max_side=5000)
        publisher = pixelwire.Publisher(pool_bytes=8 * MiB, limits=limits, acquire_timeout=0.5)
        async with publisher, pixelwire.Reader() as reader:
            results = await publisher.decode_and_publish_many(sources)
            assert len(results) == len(sources)
            for index, result in enumerate(results):
                if index in expected_errors:
                    assert type(result) is expected_errors[index], f"{index}: {result!r}"
                    if isinstance(result, pixelwire.DecodeError):
                        assert result.index is None  # its place in the list says which input
                else:
                    assert isinstance(result, pixelwire.Decoded), f"{index}: {result!r}"
                    np.testing.assert_array_equal(await reader.read_decoded(result, output="numpy"), pixels)
            assert "more than the whole pool" in str(results[3])
            assert isinstance(results[5], pixelwire.ImageTooLarge) and results[5].setting == "max_side"
            stats = await _until_no_slot_is_in_use(publisher)
            assert stats["published"] == 4 and stats["returned"] == 1, stats  # the cut PNG's slot
            # Options no image could be published with fail the whole call, before any work.
            with pytest.raises(ValueError, match="RGBX"):
                await publisher.decode_and_publish_many([good, good], mode="L", layout="RGBX")
            assert publisher.stats()["published"] == 4
            return publisher.stats()

    stats = asyncio.run(main())
    assert stats["slots_in_use"] == 0 and stats["bytes_in_use"] == 0, stats


def test_a_batch_at_the_worker_passes_every_image_through() -> None:
    async def main() -> None:
        publisher = pixelwire.Publisher(decode_at="worker")
        good = (CORPUS / "hopper.png").read_bytes()
        sources: list[Any] = [good, "https://images.test/a.png", b"not an image"]
        batch = await publisher.decode_and_publish_many(sources)
        assert batch == [await publisher.decode_and_publish(source) for source in sources]
        assert all(isinstance(item, pixelwire.PassThrough) for item in batch)
        assert not publisher.is_open

    asyncio.run(main())


def test_each_failing_video_is_a_typed_error_and_keeps_no_slot(
    video_clips: dict[str, bytes], bad_videos: dict[str, bytes]
) -> None:
    """A video the publisher cannot publish raises its own error: over a
    limit (before any slot is taken), bigger than the videos' share of the
    pool (half of it), a codec
    pixelwire does not decode, no decodable frame (its slot is given back);
    none keeps a slot, and a good video after them reads back right."""
    good = video_clips["h264_baseline.mkv"]
    frames_zeroed = good[:600] + bytes(len(good) - 600)
    sampling = VideoSampling(num_frames=6)

    async def main() -> dict[str, int]:
        publisher = pixelwire.Publisher(pool_bytes=4 * MiB, acquire_timeout=0.5)
        async with publisher, pixelwire.Reader() as reader:
            with pytest.raises(pixelwire.VideoTooLarge) as over:
                await publisher.decode_and_publish_video(
                    good, sampling=sampling, limits=pixelwire.VideoLimits(max_frames=5)
                )
            assert over.value.setting == "max_frames"
            with pytest.raises(pixelwire.PoolExhausted, match="more than the videos' share of the pool"):
                await publisher.decode_and_publish_video(good, sampling=VideoSampling(num_frames=32))
            with pytest.raises(pixelwire.UnsupportedVideo):
                await publisher.decode_and_publish_video(bad_videos["ffv1.mkv"], sampling=sampling)
            with pytest.raises(pixelwire.VideoDecodeError, match="no frame"):
                await publisher.decode_and_publish_video(frames_zeroed, sampling=sampling)
            assert publisher.stats()["returned"] == 1, "the zeroed video's slot went back"
            video = await publisher.decode_and_publish_video(good, sampling=sampling)
            assert isinstance(video, pixelwire.DecodedVideo)
            frames = await reader.read_decoded(video.to_dict(), output="numpy")
            np.testing.assert_array_equal(frames, pixelwire.decode_video(good, num_frames=6)[0])
            return await _until_no_slot_is_in_use(publisher)

    stats = asyncio.run(main())
    assert stats["published"] == 1 and stats["bytes_in_use"] == 0, stats


def test_a_video_publish_whose_caller_goes_away_stops_decoding(long_video: bytes) -> None:
    """A video sampled at its first and last frames is decoded up to the
    last; its caller going away mid-decode stops the decoding at the next
    frame and gives the slot back unpublished (before, the decode ran to
    the end and published frames nobody would read, holding a video decode
    call all the while). The next video publishes and reads back right."""
    sampling = VideoSampling(num_frames=2)

    async def main() -> dict[str, int]:
        async with pixelwire.Publisher() as publisher, pixelwire.Reader() as reader:
            task = asyncio.create_task(publisher.decode_and_publish_video(long_video, sampling=sampling))
            deadline = time.monotonic() + 30
            while not publisher.stats()["slots_in_use"]:
                assert time.monotonic() < deadline and not task.done(), "the decode never took its slot"
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            stats = await _until_no_slot_is_in_use(publisher)
            assert stats["returned"] == 1 and stats["published"] == 0, stats
            video = await publisher.decode_and_publish_video(long_video, sampling=sampling)
            assert isinstance(video, pixelwire.DecodedVideo)
            frames = await reader.read_decoded(video.to_dict(), output="numpy")
            np.testing.assert_array_equal(frames, pixelwire.decode_video(long_video, num_frames=2)[0])
            return await _until_no_slot_is_in_use(publisher)

    stats = asyncio.run(main())
    assert stats["published"] == 1 and stats["bytes_in_use"] == 0, stats


def test_a_video_whose_provisional_frame_count_was_wrong_is_sampled_again(
    video_clips: dict[str, bytes],
) -> None:
    """A video whose last frames do not decode: the count left to the read
    turns out wrong there, so the publish samples again over the count
    OpenCV gives; what ships is decode_video's frames and metadata, and the
    first attempt's slot went back."""
    data = video_clips["h264_unreadable_tail.mp4"]

    async def main() -> dict[str, int]:
        async with pixelwire.Publisher() as publisher, pixelwire.Reader() as reader:
            video = await publisher.decode_and_publish_video(data, sampling=VideoSampling(num_frames=32))
            assert isinstance(video, pixelwire.DecodedVideo)
            frames = await reader.read_decoded(video.to_dict(), output="numpy")
            expected, metadata = pixelwire.decode_video(data, num_frames=32)
            assert video.loader_metadata == metadata
            header = VideoCapture(data).info()["header_frame_count"]
            assert metadata["total_num_frames"] < header
            np.testing.assert_array_equal(frames, expected)
            return publisher.stats()

    stats = asyncio.run(main())
    assert stats["published"] == 1, stats


def test_a_video_at_the_worker_passes_through() -> None:
    async def main() -> None:
        publisher = pixelwire.Publisher(decode_at="worker")
        url = "https://videos.test/a.mp4"
        assert await publisher.decode_and_publish_video(url) == pixelwire.PassThrough(url)
        assert not publisher.is_open

    asyncio.run(main())


def test_video_frames_ship_at_the_size_the_video_processor_resizes_them_to(
    video_clips: dict[str, bytes],
) -> None:
    """With a policy (per frame, Qwen2-VL's; per video, Qwen3-VL's), each
    sampled frame (rotated first where the stream says so) is resized with
    the processor's arithmetic, exactly as that frame alone would be, to
    the size for the video's frame count; they are ``decode_video(resize=)``'s
    frames, and the descriptor records the policy and the source size."""
    import io

    from PIL import Image

    per_frame = SmartPolicy(factor=28, min_pixels=3136, max_pixels=12544)
    per_video = read_qwen3_vl_video({"size": {"shortest_edge": 4096, "longest_edge": 200000}})
    assert per_video is not None

    def resized_alone(frame: np.ndarray, target: tuple[int, int], policy: ResizePolicy) -> np.ndarray:
        png = io.BytesIO()
        Image.fromarray(frame).save(png, "PNG")
        return pixelwire.decode_image(png.getvalue(), resize=target, resize_kernel=policy.kernel)

    async def main() -> None:
        async with pixelwire.Publisher() as publisher, pixelwire.Reader() as reader:
            for policy in (per_frame, per_video):
                for name in ("h264_high_bframes.mp4", "h264_rotated_90.mp4", "vp9_odd_853x480.webm"):
                    data = video_clips[name]
                    video = await publisher.decode_and_publish_video(
                        data, sampling=VideoSampling(num_frames=4), resize=policy
                    )
                    assert isinstance(video, pixelwire.DecodedVideo)
                    frames = await reader.read_decoded(video.to_dict(), output="numpy")
                    full, metadata = pixelwire.decode_video(data, num_frames=4)
                    target = policy.video_target(*full.shape[1:3], 4, metadata["total_num_frames"])
                    assert frames.shape[1:3] == target != full.shape[1:3], name
                    np.testing.assert_array_equal(
                        frames, np.stack([resized_alone(f, target, policy) for f in full]), err_msg=name
                    )
                    ours, _ = pixelwire.decode_video(data, num_frames=4, resize=policy)
                    np.testing.assert_array_equal(frames, ours, err_msg=name)
                    assert video.resize == {"policy": policy.identity, "source": list(full.shape[1:3])}

    asyncio.run(main())


def test_a_published_per_video_size_follows_the_frames_that_decode(corrupt_video: bytes) -> None:
    """A corrupt stream decodes fewer frames than were asked for: with a
    per-video policy the published frames are at the size for the frames
    that decoded (decode_video's frames), and the slot first filled at the
    other size is freed, not leaked."""
    policy = read_qwen3_vl_video({"size": {"shortest_edge": 4096, "longest_edge": 200000}})
    assert policy is not None
    expected, metadata = pixelwire.decode_video(corrupt_video, num_frames=-1, resize=policy)
    assert len(expected) < metadata["total_num_frames"] and expected.shape[1:3] != (240, 320)

    async def main() -> dict[str, int]:
        async with pixelwire.Publisher() as publisher, pixelwire.Reader() as reader:
            video = await publisher.decode_and_publish_video(
                corrupt_video, sampling=VideoSampling(num_frames=-1), resize=policy
            )
            assert isinstance(video, pixelwire.DecodedVideo)
            assert video.loader_metadata == metadata
            frames = await reader.read_decoded(video.to_dict(), output="numpy")
            np.testing.assert_array_equal(frames, expected)
            return await _until_no_slot_is_in_use(publisher)

    stats = asyncio.run(main())
    assert stats["slots_in_use"] == 0 and stats["bytes_in_use"] == 0, stats


def test_videos_decode_on_their_own_threads_at_a_lowered_priority(video_clips: dict[str, bytes]) -> None:
    """A video decodes on one of a few threads of its own (VIDEO_DECODE_THREADS,
    of which VIDEO_DECODE_CALLS decode at once), whose nice value
    (inherited by the decoder threads FFmpeg starts from it) is the image
    pool's, so that long videos cannot crowd out images."""
    import threading
    from pathlib import Path

    from pixelwire import config

    async def main() -> None:
        async with pixelwire.Publisher() as publisher:
            await publisher.decode_and_publish_video(video_clips["h264_baseline.mkv"])

    asyncio.run(main())
    threads = [t for t in threading.enumerate() if t.name.startswith("pixelwire-video")]
    assert 1 <= len(threads) <= config.VIDEO_DECODE_THREADS
    for thread in threads:
        stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
        nice = int(stat.rpartition(")")[2].split()[16])
        assert nice == config.VIDEO_DECODE_NICE, (thread.name, nice)


def _notification_thread_wakes() -> int:
    """Voluntary context switches of this process's publisher threads: the
    notification thread (``pixelwire-publisher``) and the decode pool's,
    whose names share the 15 characters ``comm`` keeps."""
    from pathlib import Path

    found = []
    for task in Path("/proc/self/task").iterdir():
        if (task / "comm").read_text().strip() == "pixelwire-publi":
            status = (task / "status").read_text()
            found.append(int(status.split("voluntary_ctxt_switches:")[1].split()[0]))
    assert found, "no publisher thread"
    return sum(found)


def test_the_notification_thread_sleeps_while_nothing_is_handed_out(
    random_png: Callable[..., bytes],
) -> None:
    """With no hand-out outstanding the notification thread waits for a
    lease instead of polling every millisecond (an idle frontend woke 1,000
    times a second); with one outstanding it polls, and the READ's
    notification still frees the slot at once."""

    async def main() -> None:
        async with pixelwire.Publisher() as publisher:
            await asyncio.sleep(0.3)
            before = _notification_thread_wakes()
            await asyncio.sleep(1.0)
            idle = _notification_thread_wakes() - before
            assert idle <= 10, f"{idle} wake-ups in an idle second"

            decoded = await publisher.decode_and_publish(random_png(64, 64, seed=3))
            before = _notification_thread_wakes()
            await asyncio.sleep(0.2)
            assert _notification_thread_wakes() - before >= 20, "no polling while a hand-out is outstanding"
            async with pixelwire.Reader(timeout=10) as reader:
                await reader.read_decoded(decoded.to_dict(), output="numpy")
            deadline = time.monotonic() + 5
            while publisher.stats()["slots_in_use"] and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert publisher.stats()["slots_in_use"] == 0
            await asyncio.sleep(0.3)
            before = _notification_thread_wakes()
            await asyncio.sleep(1.0)
            assert _notification_thread_wakes() - before <= 10

    asyncio.run(main())
