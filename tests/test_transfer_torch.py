"""torch outputs: a CPU tensor, and a CUDA destination where the worker
READs straight into GPU memory. Runs where torch is installed (the GPU
machine); skipped cleanly in CI, which has no torch."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import pixelwire
from pixelwire.publisher_process import PublisherProcess

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("layout", ["HWC", "RGBX"])
@pytest.mark.parametrize(("device", "staging"), [("cpu", "pinned"), ("cuda", "pinned"), ("cuda", "direct")])
def test_torch_reads_equal_decode_image(
    device: str, staging: str, layout: str, ppm_of_size: Callable[..., bytes]
) -> None:
    """Pinned staging (chunks copied on while the next is READ) and direct
    device READs give decode_image's pixels."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    # Generated images (the corpus does not travel to the GPU machine);
    # decoding itself is covered by the parity tests.
    images = [ppm_of_size(size, seed=i) for i, size in enumerate([3 * 7, 64 << 10, 3 << 20, 24 << 20])]
    publisher_process = PublisherProcess()
    try:

        async def main() -> None:
            async with pixelwire.Reader(cuda_staging=staging, cuda_chunk_bytes=1 << 20) as reader:  # type: ignore[arg-type]
                for data in images:
                    desc = publisher_process.publish(data, layout=layout)["desc"]
                    got = await reader.read_decoded(desc, output="torch", device=device)
                    assert got.is_cuda == (device == "cuda") and got.dtype == torch.uint8
                    assert got.is_contiguous() and got.shape[2] == 3
                    np.testing.assert_array_equal(got.cpu().numpy(), pixelwire.decode_image(data))

        asyncio.run(main())
    finally:
        publisher_process.close()


@pytest.mark.parametrize(("device", "staging"), [("cpu", "pinned"), ("cuda", "pinned"), ("cuda", "direct")])
def test_torch_reads_of_video_frames_equal_decode_video(
    device: str, staging: str, video_clips: dict[str, bytes]
) -> None:
    """A video's sampled frames read into a CPU or CUDA tensor (pinned
    staging in chunks smaller than a frame, or a direct device READ) are
    (T, H, W, 3) and decode_video's frames; a descriptor naming another
    generation of the slot is refused on every path."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    publisher_process = PublisherProcess()
    try:

        async def main() -> None:
            async with pixelwire.Reader(cuda_staging=staging, cuda_chunk_bytes=64 << 10) as reader:  # type: ignore[arg-type]
                for name in ("h264_high_bframes.mp4", "h264_odd_853x480_444.mp4"):
                    desc = publisher_process.publish_video(video_clips[name], video_kwargs={"num_frames": 5})[
                        "desc"
                    ]
                    want, _ = pixelwire.decode_video(video_clips[name], num_frames=5)
                    got = await reader.read_decoded(desc, output="torch", device=device)
                    assert got.is_cuda == (device == "cuda") and got.dtype == torch.uint8
                    assert got.is_contiguous() and tuple(got.shape) == want.shape
                    np.testing.assert_array_equal(got.cpu().numpy(), want)
                    skewed = copy.deepcopy(desc)
                    skewed["pixelwire"]["generation"] += 1
                    with pytest.raises(pixelwire.PixelwireError):
                        await reader.read_decoded(skewed, output="torch", device=device)

        asyncio.run(main())
    finally:
        publisher_process.close()


def test_cuda_reads_check_the_slot_and_keep_one_staging_buffer(ppm_of_size: Callable[..., bytes]) -> None:
    """Into CUDA memory (no content hash there), a descriptor whose slot was
    reclaimed gives a TransferError, never pixels, even when the reader's
    clock says the lease runs on; images of growing size replace the staging
    buffer instead of registering one more each time."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    publisher_process = PublisherProcess(lease=1.0)
    try:

        async def main() -> None:
            # 8 MiB regions: the staging buffer is max(image, 8 MiB).
            async with pixelwire.Reader(timeout=10, region_bytes=8 << 20) as reader:
                for size in (1 << 20, 12 << 20, 24 << 20):
                    data = ppm_of_size(size, seed=size)
                    desc = publisher_process.publish(data)["desc"]
                    got = await reader.read_decoded(desc, output="torch", device="cuda")
                    np.testing.assert_array_equal(got.cpu().numpy(), pixelwire.decode_image(data))
                    assert reader.stats()["registered_caller_buffers"] == 1
                stale = publisher_process.publish(ppm_of_size(3 << 20, seed=9))["desc"]
                deadline = time.monotonic() + 10
                while publisher_process.stats()["reclaimed_by_lease"] < 1 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                skewed = copy.deepcopy(stale)
                skewed["pixelwire"]["expires_at"] = time.time() + 3600
                with pytest.raises(pixelwire.TransferError, match="reclaimed or reused"):
                    await reader.read_decoded(skewed, output="torch", device="cuda")

        asyncio.run(main())
    finally:
        publisher_process.close()


@pytest.mark.parametrize("chunk_bytes", [1, 300_000, 1 << 20, 1 << 40])
def test_pinned_cuda_reads_check_the_content_hash(
    chunk_bytes: int, ppm_of_size: Callable[..., bytes]
) -> None:
    """Through pinned staging, each chunk copied on to the device natively
    as it lands is also hashed: a descriptor whose content hash names other
    pixels is a TransferError (verify on), and the next read of the true
    descriptor gives the image, whatever the chunk setting (rounded to whole
    hash pieces)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    publisher_process = PublisherProcess()
    try:

        async def main() -> None:
            async with pixelwire.Reader(cuda_chunk_bytes=chunk_bytes) as reader:
                for size in (3 * 7, 3 << 20, (5 << 20) + 3 * 11):
                    data = ppm_of_size(size, seed=size)
                    other = publisher_process.publish(ppm_of_size(size, seed=size + 1))["desc"]
                    forged = copy.deepcopy(publisher_process.publish(data)["desc"])
                    forged["content_hash"] = other["content_hash"]
                    with pytest.raises(pixelwire.TransferError, match="content hash"):
                        await reader.read_decoded(forged, output="torch", device="cuda")
                    desc = publisher_process.publish(data)["desc"]
                    got = await reader.read_decoded(desc, output="torch", device="cuda")
                    np.testing.assert_array_equal(got.cpu().numpy(), pixelwire.decode_image(data))

        asyncio.run(main())
    finally:
        publisher_process.close()


def test_cancelled_cuda_reads_keep_their_buffers_until_they_end(ppm_of_size: Callable[..., bytes]) -> None:
    """A CUDA read whose caller is cancelled goes on into its staging buffer
    and device tensor, which are kept (and the staging lock held) until it
    ends: concurrent reads, some cancelled at once, leave the later reads
    correct and let the reader close; reads from a second event loop (in
    its own thread) wait through a signal of their own."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    # Room for every round's images: a read cancelled before it started
    # frees its slot at the publisher only at the lease's end.
    publisher_process = PublisherProcess(pool_bytes=512 << 20)
    try:
        images = [ppm_of_size((3 << 20) + 3 * 1024 * i, seed=i) for i in range(8)]

        async def read_all(reader: pixelwire.Reader) -> None:
            descs = [publisher_process.publish(d)["desc"] for d in images]
            reads = [
                asyncio.ensure_future(reader.read_decoded(d, output="torch", device="cuda")) for d in descs
            ]
            await asyncio.sleep(0)
            for task in reads[::3]:
                task.cancel()
            for task, data in zip(reads, images, strict=True):
                try:
                    got = await asyncio.wait_for(task, 30)
                except asyncio.CancelledError:
                    continue
                np.testing.assert_array_equal(got.cpu().numpy(), pixelwire.decode_image(data))

        async def main() -> None:
            reader = pixelwire.Reader()
            await read_all(reader)
            await read_all(reader)
            await asyncio.to_thread(lambda: asyncio.run(read_all(reader)))
            await asyncio.wait_for(reader.close(), 30)

        asyncio.run(main())
    finally:
        publisher_process.close()


def test_a_cuda_read_whose_tensor_cannot_be_allocated_fails_and_the_next_reads_work(
    monkeypatch: pytest.MonkeyPatch, ppm_of_size: Callable[..., bytes]
) -> None:
    """The device tensor is allocated while the READ runs; when that fails
    (out of device memory) the read raises the allocation's error, the READ
    already started ends without copying anywhere, and the reads after it
    get their own pixels (the staging buffer was not reused before that
    READ ended); every READ, the failed ones' too, frees its slot at the publisher
    by notification."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    real_empty = torch.empty
    failures = {"left": 0}

    def empty(*args: object, **kwargs: object) -> object:
        device = kwargs.get("device")
        if failures["left"] and device is not None and torch.device(device).type == "cuda":  # type: ignore[arg-type]
            failures["left"] -= 1
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_empty(*args, **kwargs)  # type: ignore[call-overload]

    # The read that fails is the largest: its READ is still landing in the
    # staging buffer while a next read that did not wait would use it.
    images = [ppm_of_size(24 << 20, seed=0)] + [
        ppm_of_size((3 << 20) + 3 * 1024 * i, seed=i) for i in range(1, 4)
    ]
    publisher_process = PublisherProcess(lease=30.0)
    try:

        async def main() -> None:
            async with pixelwire.Reader() as reader:
                for round_ in range(3):
                    published = [publisher_process.publish(d) for d in images]
                    assert all("desc" in p for p in published), published
                    descs = [p["desc"] for p in published]
                    failures["left"] = 1
                    monkeypatch.setattr(torch, "empty", empty)
                    with pytest.raises(torch.cuda.OutOfMemoryError):
                        await reader.read_decoded(descs[0], output="torch", device="cuda")
                    monkeypatch.setattr(torch, "empty", real_empty)
                    for desc, data in zip(descs[1:], images[1:], strict=True):
                        got = await asyncio.wait_for(
                            reader.read_decoded(desc, output="torch", device="cuda"), 30
                        )
                        want = pixelwire.decode_image(data)
                        np.testing.assert_array_equal(got.cpu().numpy(), want, f"round {round_}")
            # Every READ ended and notified, the failed reads' too.
            deadline = time.monotonic() + 10
            while publisher_process.stats()["freed_by_notification"] < 12 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            stats = publisher_process.stats()
            assert (stats["freed_by_notification"], stats["slots_in_use"]) == (12, 0)

        asyncio.run(main())
    finally:
        publisher_process.close()


@pytest.fixture
def large_images(
    ppm_of_size: Callable[..., bytes],
) -> Iterator[tuple[PublisherProcess, list[bytes], list[np.ndarray]]]:
    """A publisher process and four distinct 24 MiB images with their pixels (CUDA only)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    images = [ppm_of_size(24 << 20, seed=i) for i in range(4)]
    publisher_process = PublisherProcess(pool_bytes=512 << 20)
    try:
        yield publisher_process, images, [pixelwire.decode_image(data) for data in images]
    finally:
        publisher_process.close()


def _make_torch_streams_busy() -> None:
    """Queues milliseconds of work on every stream torch's pool hands out
    (64 fresh streams cover its 32 of the default priority), the stream a
    reader copies on among them: the copies a read queues then lag behind
    the read by that much, as on a GPU busy with a model."""
    matrix = torch.ones(2048, 2048, device="cuda")
    for _ in range(64):
        with torch.cuda.stream(torch.cuda.Stream()):
            for _ in range(4):
                matrix @ matrix


@pytest.mark.parametrize("chunk_bytes", [8 << 20, 1 << 40])
def test_cuda_pixels_are_ready_in_order_on_the_callers_stream(
    chunk_bytes: int, large_images: tuple[PublisherProcess, list[bytes], list[np.ndarray]]
) -> None:
    """A CUDA read returns with its copies possibly still queued on the
    reader's stream (here surely: that stream is kept busy); a kernel the
    caller launches at once on its current stream (a side stream here)
    still sees the whole image, because the current stream was made to
    wait for the copies."""
    publisher_process, images, expected = large_images

    async def main() -> None:
        side = torch.cuda.Stream()
        wanted = [torch.from_numpy(e).cuda() for e in expected]
        torch.cuda.synchronize()
        async with pixelwire.Reader(cuda_chunk_bytes=chunk_bytes) as reader:
            for _ in range(3):
                descs = [publisher_process.publish(data)["desc"] for data in images]
                _make_torch_streams_busy()
                with torch.cuda.stream(side):
                    for desc, want in zip(descs, wanted, strict=True):
                        got = await reader.read_decoded(desc, output="torch", device="cuda")
                        # Compared on the GPU, launched before anything else.
                        assert torch.equal(got, want)

    asyncio.run(main())


def test_the_next_cuda_read_does_not_change_a_copy_still_queued(
    large_images: tuple[PublisherProcess, list[bytes], list[np.ndarray]],
) -> None:
    """Reads back to back while the reader's copy stream is kept busy, so
    a read's copy is still queued when the next READ starts into the same
    staging buffer: every image read is still itself afterwards, because
    a read waits for the copies queued from its staging buffer first."""
    publisher_process, images, expected = large_images

    async def main() -> None:
        async with pixelwire.Reader(cuda_chunk_bytes=1 << 40) as reader:
            for _ in range(5):
                descs = [publisher_process.publish(data)["desc"] for data in images]
                _make_torch_streams_busy()
                got = [await reader.read_decoded(d, output="torch", device="cuda") for d in descs]
                for pixels, want in zip(got, expected, strict=True):
                    np.testing.assert_array_equal(pixels.cpu().numpy(), want)

    asyncio.run(main())
