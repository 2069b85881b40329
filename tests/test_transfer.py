"""End to end: pixels from a publisher process to this (worker) process
over real NIXL (UCX), with real OS processes: the corpus round trip, a
publisher killed mid-read, many concurrent reads, memory over 2000 cycles,
both decode modes, the private-URL guard, the RGBX layout. No mocks.
The reader and the publisher on their own: `tests/test_reader.py`,
`tests/test_publisher.py`."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import pixelwire
from pixelwire.descriptor import parse_descriptor
from pixelwire.publisher_process import PublisherProcess

from reference import CORPUS, corpus_files

MiB = 1024 * 1024

try:
    pixelwire.transfer.nixl_library_path()
except pixelwire.TransferError as missing:  # pragma: no cover - CI installs it
    pytest.skip(f"NIXL runtime not installed: {missing}", allow_module_level=True)


def _decodable() -> list[tuple[Path, np.ndarray]]:
    out = []
    for path in corpus_files():
        try:
            out.append((path, pixelwire.decode_image(path.read_bytes())))
        except pixelwire.PixelwireError:
            continue
    return out


def test_round_trip_over_the_corpus(
    publisher_process: PublisherProcess, wait_for: Callable[..., bool]
) -> None:
    """Acceptance 1 and 2: every decodable corpus file arrives identical, as
    numpy, PIL and (where torch is installed) torch; every slot is then freed
    by the reader's notification."""
    cases = _decodable()
    try:
        import torch  # noqa: F401

        outputs = ["numpy", "pil", "torch"]
    except ImportError:
        outputs = ["numpy", "pil"]

    async def main() -> int:
        reads = 0
        async with pixelwire.Reader(timeout=20) as reader:
            for output in outputs:
                for path, expected in cases:
                    answer = publisher_process.publish(path.read_bytes())
                    got = await reader.read_decoded(answer["desc"], output=output)  # type: ignore[arg-type]
                    reads += 1
                    if output == "pil":
                        assert isinstance(got, Image.Image)
                        array = np.asarray(got)
                        got = array[:, :, None] if array.ndim == 2 else array
                    elif output == "torch":
                        got = got.numpy()
                    np.testing.assert_array_equal(got, expected, err_msg=f"{path.name} as {output}")
            assert reader.remote_count == 1, "metadata loaded once for the one publisher"
        return reads

    reads = asyncio.run(main())
    assert wait_for(lambda: publisher_process.stats()["freed_by_notification"] == reads)
    stats = publisher_process.stats()
    print(f"\n{reads} reads ({len(cases)} files x {outputs}); publisher stats {stats}")
    assert stats["slots_in_use"] == 0 and stats["bytes_in_use"] == 0
    assert stats["published"] == reads and stats["reclaimed_by_lease"] == 0


def test_frontend_killed_gives_transfer_error_and_worker_survives(
    random_png: Callable[..., bytes], start_publisher_process: Callable[..., PublisherProcess]
) -> None:
    data = random_png(256, 256)
    doomed = start_publisher_process()
    before = doomed.publish(data)["desc"]
    during = doomed.publish(random_png(2000, 1500))["desc"]

    async def main() -> None:
        async with pixelwire.Reader(timeout=5) as reader:
            await reader.read_decoded(before, output="numpy")  # connect first
            second = doomed.publish(data)["desc"]
            doomed.kill()
            started = time.monotonic()
            with pytest.raises(pixelwire.TransferError):
                await reader.read_decoded(second, output="numpy")
            with pytest.raises(pixelwire.TransferError):
                await reader.read_decoded(during, output="numpy")
            assert time.monotonic() - started < 12
            healthy = start_publisher_process()
            desc = healthy.publish(data)["desc"]
            got = await reader.read_decoded(desc, output="numpy")
            np.testing.assert_array_equal(got, pixelwire.decode_image(data))

    asyncio.run(main())


def test_64_concurrent_reads_on_one_reader(
    publisher_process: PublisherProcess, random_png: Callable[..., bytes], wait_for: Callable[..., bool]
) -> None:
    images = [random_png(96 + i, 80, seed=i) for i in range(64)]
    descs = [publisher_process.publish(img)["desc"] for img in images]

    async def main() -> list[np.ndarray]:
        async with pixelwire.Reader() as reader:
            ticks = 0
            done = asyncio.Event()

            async def heartbeat() -> None:
                nonlocal ticks
                while not done.is_set():
                    ticks += 1
                    await asyncio.sleep(0.001)

            beat = asyncio.create_task(heartbeat())
            results = await asyncio.gather(*(reader.read_decoded(d, output="numpy") for d in descs))
            done.set()
            await beat
            assert ticks > 0, "the event loop kept running while reads were in flight"
            return list(results)

    for got, img in zip(asyncio.run(main()), images, strict=True):
        np.testing.assert_array_equal(got, pixelwire.decode_image(img))
    assert wait_for(lambda: publisher_process.stats()["slots_in_use"] == 0)


def _own_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_2000_cycles_keep_memory_bounded(
    publisher_process: PublisherProcess, random_png: Callable[..., bytes], wait_for: Callable[..., bool]
) -> None:
    image = random_png(128, 96)
    expected = pixelwire.decode_image(image)
    bound_kib = 48 * 1024

    async def main() -> tuple[int, int, int, int]:
        async with pixelwire.Reader() as reader:
            for _ in range(200):  # warm up pools and caches
                await reader.read_decoded(publisher_process.publish(image)["desc"], output="numpy")
            worker0, front0 = _own_rss_kib(), publisher_process.rss_kib()
            for i in range(2000):
                got = await reader.read_decoded(publisher_process.publish(image)["desc"], output="numpy")
                if i % 500 == 0:
                    np.testing.assert_array_equal(got, expected)
            return worker0, _own_rss_kib(), front0, publisher_process.rss_kib()

    worker0, worker1, front0, front1 = asyncio.run(main())
    print(f"\nRSS over 2000 cycles: worker {worker0} -> {worker1} KiB, publisher {front0} -> {front1} KiB")
    assert worker1 - worker0 < bound_kib
    assert front1 - front0 < bound_kib
    assert wait_for(lambda: publisher_process.stats()["slots_in_use"] == 0)


@pytest.fixture
def image_server() -> Iterator[tuple[str, dict[str, bytes]]]:
    """A real HTTP server on 127.0.0.1 serving corpus images."""
    import http.server
    import threading

    files = {name: (corpus_files()[0].parent / name).read_bytes() for name in ("hopper.png", "flower2.jpg")}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = files.get(self.path.lstrip("/"))
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", files
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize("decode_at", ["frontend", "worker"])
def test_both_modes_give_the_worker_identical_pixels(
    decode_at: str,
    image_server: tuple[str, dict[str, bytes]],
    start_publisher_process: Callable[..., PublisherProcess],
) -> None:
    """The same URL gives the worker identical pixels
    whether it was decoded at the frontend (NIXL) or at the worker."""
    base, files = image_server
    publisher_process = start_publisher_process(
        env={"PIXELWIRE_DECODE_AT": decode_at, "PIXELWIRE_ALLOW_PRIVATE": "1"}
    )

    async def main() -> None:
        async with pixelwire.Reader(fetcher=pixelwire.Fetcher(allow_private=True)) as reader:
            for name, data in files.items():
                item = publisher_process.ask(cmd="publish_source", source=f"{base}/{name}")["item"]
                assert ("url" in item) == (decode_at == "worker")
                got = await reader.load(item, output="numpy")
                np.testing.assert_array_equal(got, pixelwire.decode_image(data))
            await reader.fetcher.close()

    asyncio.run(main())


def test_default_guard_blocks_private_urls_at_the_frontend(
    image_server: tuple[str, dict[str, bytes]], publisher_process: PublisherProcess
) -> None:
    base, _ = image_server
    answer = publisher_process.ask(cmd="publish_source", source=f"{base}/hopper.png")
    assert answer["error"] == "BlockedURL"


def test_rgbx_layout_maps_into_pil_and_unpacks_for_arrays(publisher_process: PublisherProcess) -> None:
    names = ["hopper.png", "transparent.png", "flower2.jpg", "pil_sample_cmyk.jpg"]

    async def main() -> None:
        async with pixelwire.Reader() as reader:
            for name in names:
                data = (CORPUS / name).read_bytes()
                expected = pixelwire.decode_image(data)
                h, w, _ = expected.shape
                desc = publisher_process.publish(data, layout="RGBX")["desc"]
                assert desc["metadata"]["layout"] == "RGBX" and desc["shape"] == [h, w, 3]
                assert desc["nixl_descriptor"]["size"] == h * w * 4
                image = await reader.read_decoded(desc, output="pil")
                assert image.mode == "RGB" and image.size == (w, h)
                assert image.readonly  # mapped over the received pixels, not copied
                np.testing.assert_array_equal(np.asarray(image), expected)
                again = publisher_process.publish(data, layout="RGBX")["desc"]
                array = await reader.read_decoded(again, output="numpy")
                assert array.flags.c_contiguous
                np.testing.assert_array_equal(array, expected)
            # The layout holds RGB only; a descriptor claiming otherwise is refused.
            desc = publisher_process.publish((CORPUS / names[0]).read_bytes(), layout="RGBX")["desc"]
            bad = copy.deepcopy(desc)
            bad["shape"] = [desc["shape"][0], desc["shape"][1], 4]
            with pytest.raises(pixelwire.DescriptorError, match="RGBX"):
                await reader.read_decoded(bad)
            bad = copy.deepcopy(desc)
            bad["metadata"]["layout"] = "CHW"
            with pytest.raises(pixelwire.DescriptorError, match="layout"):
                await reader.read_decoded(bad)
        with pytest.raises(ValueError, match="RGBX"):
            async with pixelwire.Publisher(pool_bytes=MiB) as publisher:
                await publisher.decode_and_publish((CORPUS / names[0]).read_bytes(), mode="L", layout="RGBX")

    asyncio.run(main())


@pytest.mark.parametrize("loader", ["opencv", "qwen2_vl", "qwen3_vl"])
def test_a_video_arrives_as_decode_video_returns_it(
    loader: str,
    video_clips: dict[str, bytes],
    publisher_process: PublisherProcess,
    wait_for: Callable[..., bool],
) -> None:
    """A video published as one slot (the frames a vLLM loader samples,
    decoded straight into it) is read over NIXL as exactly the frames and
    metadata ``decode_video`` returns, with dynamo's Video metadata beside
    them; each slot is freed by the reader's notification."""
    names = ["h264_high_bframes.mp4", "h264_rotated_90.mp4", "vp9_odd_853x480.webm", "av1.mkv"]

    async def main() -> None:
        async with pixelwire.Reader(timeout=20) as reader:
            for name in names:
                data = video_clips[name]
                answer = publisher_process.publish_video(data, loader, {"num_frames": 6})
                desc = answer["desc"]
                remote = parse_descriptor(desc)
                frames = await reader.read_decoded(desc, output="numpy")
                expected, metadata = pixelwire.decode_video(data, loader=loader, num_frames=6)
                np.testing.assert_array_equal(frames, expected, err_msg=name)
                assert remote.video is not None and remote.video.loader_metadata == metadata, name
                assert desc["shape"] == list(expected.shape)
                fps = metadata["fps"]
                assert desc["metadata"]["Video"] == {
                    "source_fps": fps,
                    "source_duration": metadata["duration"],
                    "sampled_timestamps": [i / fps for i in metadata["frames_indices"]],
                }
                assert remote.video.sampling["loader"] == loader

    asyncio.run(main())
    assert wait_for(lambda: publisher_process.stats()["freed_by_notification"] == len(names))
    assert publisher_process.stats()["slots_in_use"] == 0
