"""Issue 3: pixels from a frontend process to this (worker) process over
real NIXL (UCX), with real OS processes. No mocks."""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import io
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import pixelwire
from pixelwire.bench.transfer import ppm_of_size
from pixelwire.config import Layout, ReaderSettings
from pixelwire.publisher_process import PublisherProcess
from pixelwire.resize import ResizePolicy

from reference import CORPUS, corpus_files

MiB = 1024 * 1024

try:
    pixelwire.transfer.nixl_library_path()
except pixelwire.TransferError as missing:  # pragma: no cover - CI installs it
    pytest.skip(f"NIXL runtime not installed: {missing}", allow_module_level=True)


def Frontend(pool_bytes: int = 64 * MiB, lease: float = 60.0, acquire: float = 5.0) -> PublisherProcess:
    return PublisherProcess(pool_bytes=pool_bytes, lease=lease, acquire=acquire)


@pytest.fixture
def frontend() -> Iterator[PublisherProcess]:
    f = Frontend()
    yield f
    f.close()


# Memory a failed READ may still write, kept for the life of the test
# process rather than handed back to the allocator under a transfer.
_LANDING_ZONES: list[np.ndarray] = []


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def _wait_for(predicate: Any, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _decodable() -> list[tuple[Path, np.ndarray]]:
    out = []
    for path in corpus_files():
        try:
            out.append((path, pixelwire.decode_image(path.read_bytes())))
        except pixelwire.PixelwireError:
            continue
    return out


def test_round_trip_over_the_corpus(frontend: PublisherProcess) -> None:
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
                    answer = frontend.publish(path.read_bytes())
                    got = await reader.read_decoded(answer["desc"], output=output)  # type: ignore[arg-type]
                    reads += 1
                    if output == "pil":
                        assert isinstance(got, Image.Image)
                        array = np.asarray(got)
                        got = array[:, :, None] if array.ndim == 2 else array
                    elif output == "torch":
                        got = got.numpy()
                    np.testing.assert_array_equal(got, expected, err_msg=f"{path.name} as {output}")
            assert reader.remote_count == 1, "metadata loaded once for the one frontend"
        return reads

    reads = run(main())
    assert _wait_for(lambda: frontend.stats()["freed_by_notification"] == reads)
    stats = frontend.stats()
    print(f"\n{reads} reads ({len(cases)} files x {outputs}); frontend stats {stats}")
    assert stats["slots_in_use"] == 0 and stats["bytes_in_use"] == 0
    assert stats["published"] == reads and stats["reclaimed_by_lease"] == 0


def test_unread_slots_are_reclaimed_and_late_reads_refused() -> None:
    frontend = Frontend(lease=1.0)
    try:
        data = (corpus_files()[0].parent / "hopper.png").read_bytes()
        desc = frontend.publish(data)["desc"]
        assert _wait_for(lambda: frontend.stats()["reclaimed_by_lease"] == 1, 10)
        assert frontend.stats()["slots_in_use"] == 0

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
                frontend.publish(_png(128, 128, seed=5))  # reuses the slot
                with pytest.raises(pixelwire.TransferError, match="reclaimed or reused"):
                    await reader.read_decoded(skewed, output="numpy")

        run(main())
    finally:
        frontend.close()


def _png(width: int, height: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


def test_pool_exhaustion_and_recovery() -> None:
    frontend = Frontend(pool_bytes=1 * MiB, acquire=0.5)
    try:
        image = _png(300, 300)  # 270 000 bytes of pixels
        descs = [frontend.publish(image)["desc"] for _ in range(3)]
        started = time.monotonic()
        answer = frontend.publish(image)
        waited = time.monotonic() - started
        assert answer.get("error") == "PoolExhausted", answer
        assert waited >= 0.45

        async def main() -> None:
            async with pixelwire.Reader() as reader:
                await reader.read_decoded(descs[0], output="numpy")

        run(main())
        assert _wait_for(lambda: frontend.stats()["slots_in_use"] == 2)
        assert "desc" in frontend.publish(image)
        stats = frontend.stats()
        assert stats["registered_bytes"] <= 1 * MiB
    finally:
        frontend.close()


def test_frontend_killed_gives_transfer_error_and_worker_survives() -> None:
    data = _png(256, 256)
    doomed = Frontend()
    before = doomed.publish(data)["desc"]
    during = doomed.publish(_png(2000, 1500))["desc"]

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
            healthy = Frontend()
            try:
                desc = healthy.publish(data)["desc"]
                got = await reader.read_decoded(desc, output="numpy")
                np.testing.assert_array_equal(got, pixelwire.decode_image(data))
            finally:
                healthy.close()

    try:
        run(main())
    finally:
        if doomed.proc.poll() is None:
            doomed.kill()
        doomed.close()


def test_tampered_descriptors_never_give_pixels(frontend: PublisherProcess) -> None:
    first = frontend.publish(_png(64, 64, seed=1))["desc"]
    other = frontend.publish(_png(64, 64, seed=2))["desc"]

    def tamper(change: Any) -> dict[str, Any]:
        d = copy.deepcopy(first)
        change(d)
        return d

    def set_size(d: dict[str, Any], size: int, shape: list[int]) -> None:
        d["nixl_descriptor"]["size"] = size
        d["shape"] = shape

    descriptor_errors = [
        tamper(lambda d: d["nixl_descriptor"].__setitem__("size", 64 * 64 * 3 + 1)),
        tamper(lambda d: d.__setitem__("shape", [64, 65, 3])),
        tamper(lambda d: d.__setitem__("shape", [64, 64, 2])),
        tamper(lambda d: d.__setitem__("dtype", "FLOAT32")),
        tamper(lambda d: d["nixl_descriptor"].__setitem__("mem_type", "Block")),
        tamper(lambda d: d.__setitem__("nixl_metadata", "b64:!!!not-base64")),
        tamper(lambda d: d.__setitem__("nixl_metadata", "b64:" + base64.b64encode(b"not zlib").decode())),
        tamper(lambda d: d.__setitem__("nixl_metadata", "raw-metadata")),
        tamper(lambda d: d["nixl_descriptor"].__setitem__("addr", -5)),
        tamper(lambda d: d["pixelwire"].__setitem__("notification", "free everything")),
        tamper(lambda d: d.__setitem__("content_hash", "xyz")),
        # The whole-image hash of earlier versions: refused, never compared.
        tamper(lambda d: d.__setitem__("content_hash", d["content_hash"].split(":")[-1])),
        tamper(lambda d: set_size(d, 10**9, [10**9 // 3, 1, 3])),
    ]
    transfer_errors = [
        # Outside every registered region: NIXL itself refuses.
        tamper(lambda d: d["nixl_descriptor"].__setitem__("addr", d["nixl_descriptor"]["addr"] + 512 * MiB)),
        tamper(lambda d: d["nixl_descriptor"].__setitem__("addr", 4096)),
        # Inside registered memory, but someone else's pixels: the hash tells.
        tamper(lambda d: d["nixl_descriptor"].__setitem__("addr", other["nixl_descriptor"]["addr"])),
        tamper(lambda d: d["nixl_descriptor"].__setitem__("addr", d["nixl_descriptor"]["addr"] + 64)),
        tamper(lambda d: d.__setitem__("content_hash", "xxh3-256k:0123456789abcdef")),
    ]

    async def main() -> None:
        async with pixelwire.Reader(timeout=5, max_pixels=10**8) as reader:
            for bad in descriptor_errors:
                with pytest.raises(pixelwire.DescriptorError):
                    await reader.read_decoded(bad, output="numpy")
            for bad in transfer_errors:
                with pytest.raises(pixelwire.TransferError):
                    await reader.read_decoded(bad, output="numpy")
            # Each tampered read of `first` ended with the notification that
            # frees first's slot: once the frontend has taken it, `first`
            # itself is refused, and the reader still works for the rest.
            # (Before that, first's slot still holds first's pixels and a
            # read of it is right to give them.)
            assert _wait_for(lambda: frontend.stats()["freed_by_notification"] >= 1)
            with pytest.raises(pixelwire.TransferError, match="reclaimed or reused"):
                await reader.read_decoded(first, output="numpy")
            fresh = frontend.publish(_png(64, 64, seed=3))["desc"]
            for good in (other, fresh):
                await reader.read_decoded(good, output="numpy")

    run(main())


def test_64_concurrent_reads_on_one_reader(frontend: PublisherProcess) -> None:
    images = [_png(96 + i, 80, seed=i) for i in range(64)]
    descs = [frontend.publish(img)["desc"] for img in images]

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

    for got, img in zip(run(main()), images, strict=True):
        np.testing.assert_array_equal(got, pixelwire.decode_image(img))
    assert _wait_for(lambda: frontend.stats()["slots_in_use"] == 0)


def _own_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_2000_cycles_keep_memory_bounded(frontend: PublisherProcess) -> None:
    image = _png(128, 96)
    expected = pixelwire.decode_image(image)
    bound_kib = 48 * 1024

    async def main() -> tuple[int, int, int, int]:
        async with pixelwire.Reader() as reader:
            for _ in range(200):  # warm up pools and caches
                await reader.read_decoded(frontend.publish(image)["desc"], output="numpy")
            worker0, front0 = _own_rss_kib(), frontend.rss_kib()
            for i in range(2000):
                got = await reader.read_decoded(frontend.publish(image)["desc"], output="numpy")
                if i % 500 == 0:
                    np.testing.assert_array_equal(got, expected)
            return worker0, _own_rss_kib(), front0, frontend.rss_kib()

    worker0, worker1, front0, front1 = run(main())
    print(f"\nRSS over 2000 cycles: worker {worker0} -> {worker1} KiB, frontend {front0} -> {front1} KiB")
    assert worker1 - worker0 < bound_kib
    assert front1 - front0 < bound_kib
    assert _wait_for(lambda: frontend.stats()["slots_in_use"] == 0)


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
    decode_at: str, image_server: tuple[str, dict[str, bytes]]
) -> None:
    """The same URL gives the worker identical pixels
    whether it was decoded at the frontend (NIXL) or at the worker."""
    base, files = image_server
    frontend = PublisherProcess(env={"PIXELWIRE_DECODE_AT": decode_at, "PIXELWIRE_ALLOW_PRIVATE": "1"})
    try:

        async def main() -> None:
            async with pixelwire.Reader(fetcher=pixelwire.Fetcher(allow_private=True)) as reader:
                for name, data in files.items():
                    item = frontend.ask(cmd="publish_source", source=f"{base}/{name}")["item"]
                    assert ("url" in item) == (decode_at == "worker")
                    got = await reader.load(item, output="numpy")
                    np.testing.assert_array_equal(got, pixelwire.decode_image(data))
                await reader.fetcher.close()

        run(main())
    finally:
        frontend.close()


def test_default_guard_blocks_private_urls_at_the_frontend(
    image_server: tuple[str, dict[str, bytes]],
) -> None:
    base, _ = image_server
    frontend = PublisherProcess()
    try:
        answer = frontend.ask(cmd="publish_source", source=f"{base}/hopper.png")
        assert answer["error"] == "BlockedURL"
    finally:
        frontend.close()


def _lent_slot(array: np.ndarray) -> bool:
    """Whether the array's memory is a receive slot lent zero-copy."""
    base: Any = array
    while base is not None:
        if type(base).__name__ == "PixelBuffer":
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False


def test_zero_copy_while_the_pool_has_room_then_copies(frontend: PublisherProcess) -> None:
    image = _png(600, 580, seed=3)  # ~1 MiB of pixels
    expected = pixelwire.decode_image(image)

    async def main() -> None:
        async with pixelwire.Reader(pool_bytes=4 * MiB, region_bytes=4 * MiB) as reader:
            kept = []
            for _ in range(4):
                kept.append(await reader.read_decoded(frontend.publish(image)["desc"], output="numpy"))
            lent = [_lent_slot(a) for a in kept]
            assert lent == [True, True, False, False], lent
            for array in kept:
                np.testing.assert_array_equal(array, expected)
            kept[0][0, 0, 0] ^= 0xFF  # owned memory: writable, and no one else's
            del kept, array
            # Dropping the arrays gave the slots back: lent again.
            again = await reader.read_decoded(frontend.publish(image)["desc"], output="numpy")
            assert _lent_slot(again)
            np.testing.assert_array_equal(again, expected)

    run(main())


def test_dynamo_rdma_metadata_descriptor(frontend: PublisherProcess) -> None:
    """A dynamo nixl_connect RdmaMetadata-shaped dict, with the shape given."""
    data = _png(200, 150, seed=9)
    desc = frontend.publish(data)["desc"]
    rdma = {
        "descriptors": [
            {"device": "cpu", "ptr": desc["nixl_descriptor"]["addr"], "size": desc["nixl_descriptor"]["size"]}
        ],
        "nixl_metadata": desc["nixl_metadata"],
        "notification_key": desc["pixelwire"]["notification"],
        "operation_kind": "read",
    }

    async def main() -> None:
        async with pixelwire.Reader() as reader:
            with pytest.raises(pixelwire.DescriptorError, match="shape"):
                await reader.read_decoded(rdma, output="numpy")
            got = await reader.read_decoded(rdma, output="numpy", shape=desc["shape"])
            np.testing.assert_array_equal(got, pixelwire.decode_image(data))

    run(main())
    assert _wait_for(lambda: frontend.stats()["slots_in_use"] == 0)


def test_rgbx_layout_maps_into_pil_and_unpacks_for_arrays(frontend: PublisherProcess) -> None:
    names = ["hopper.png", "transparent.png", "flower2.jpg", "pil_sample_cmyk.jpg"]

    async def main() -> None:
        async with pixelwire.Reader() as reader:
            for name in names:
                data = (CORPUS / name).read_bytes()
                expected = pixelwire.decode_image(data)
                h, w, _ = expected.shape
                desc = frontend.publish(data, layout="RGBX")["desc"]
                assert desc["metadata"]["layout"] == "RGBX" and desc["shape"] == [h, w, 3]
                assert desc["nixl_descriptor"]["size"] == h * w * 4
                image = await reader.read_decoded(desc, output="pil")
                assert image.mode == "RGB" and image.size == (w, h)
                assert image.readonly  # mapped over the received pixels, not copied
                np.testing.assert_array_equal(np.asarray(image), expected)
                again = frontend.publish(data, layout="RGBX")["desc"]
                array = await reader.read_decoded(again, output="numpy")
                assert array.flags.c_contiguous
                np.testing.assert_array_equal(array, expected)
            # The layout holds RGB only; a descriptor claiming otherwise is refused.
            desc = frontend.publish((CORPUS / names[0]).read_bytes(), layout="RGBX")["desc"]
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

    run(main())


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
    policy = ResizePolicy.from_processor_config(
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

    stats = run(main())
    assert stats["slots_in_use"] == 0 and stats["bytes_in_use"] == 0, stats
    assert stats["published"] == 2 * len(sources) and stats["freed_by_notification"] == 2 * len(sources)


def test_a_failing_image_in_a_batch_costs_only_itself() -> None:
    """Each image that cannot be published is its own typed error, in its
    place, returned not raised; every other image is published, reads back
    right, and no slot outlives its image."""
    good = (CORPUS / "hopper.png").read_bytes()
    url = "data:image/png;base64," + base64.b64encode(good).decode()
    sources: list[Any] = [
        good,
        good[:200],  # a PNG cut short: a slot is taken, then the decode fails
        b"not an image",
        _png(2000, 1500),  # 9 MB of pixels, more than the whole pool
        "http://10.0.0.1/a.png",  # refused by the default guard
        _png(6000, 1),  # over the publisher's max_side
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

    stats = run(main())
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

    run(main())


@pytest.mark.parametrize("read_threads", [0, 3])
def test_split_reads_deliver_every_byte(read_threads: int) -> None:
    """A READ split across the UCX backend's threads (any split, odd sizes
    and a tail shorter than a page) gives the same pixels as one READ, and
    frees every slot by notification."""
    frontend = Frontend(pool_bytes=128 * MiB)
    try:
        images = [ppm_of_size(n, seed=n) for n in (3, 3 * 4097, 3 * 1024 * 1025, 3 * 2000 * 2621)]

        async def main() -> None:
            reader = pixelwire.Reader(read_threads=read_threads, split_min_bytes=4096)
            async with reader:
                for data in images:
                    desc = frontend.publish(data)["desc"]
                    got = await reader.read_decoded(desc, output="numpy")
                    np.testing.assert_array_equal(got, pixelwire.decode_image(data))

        run(main())
        assert _wait_for(lambda: frontend.stats()["freed_by_notification"] == len(images))
    finally:
        frontend.close()


@pytest.mark.parametrize(
    ("chunk_bytes", "hash_threads"),
    [(1, 1), (300_000, 3), (1 << 20, 4), (1 << 40, 2)],
    ids=["one-piece-chunks", "odd-chunks", "default-chunks", "one-chunk"],
)
def test_verified_reads_hash_every_piece_however_they_are_chunked(
    chunk_bytes: int, hash_threads: int
) -> None:
    """A verified read goes in chunks of whole 256 KiB hash pieces, all in
    flight, each hashed as it lands: any chunk setting (rounded to pieces)
    and any number of hashing threads give the image's pixels for sizes that
    are not multiples of a piece or a chunk, and a hash that names other
    pixels is still refused."""
    frontend = Frontend(pool_bytes=128 * MiB)
    try:
        piece = 256 * 1024
        images = [ppm_of_size(n, seed=n) for n in (3, 3 * (piece + 1), 3 * 1000 * 350, 3 * 2000 * 2621)]

        async def main() -> None:
            reader = pixelwire.Reader(chunk_bytes=chunk_bytes, hash_threads=hash_threads, verify=True)
            async with reader:
                for data in images:
                    desc = frontend.publish(data)["desc"]
                    got = await reader.read_decoded(desc, output="numpy")
                    np.testing.assert_array_equal(got, pixelwire.decode_image(data))
                    del got
                other = frontend.publish(images[1])["desc"]
                forged = frontend.publish(images[2])["desc"]
                forged["content_hash"] = other["content_hash"]
                with pytest.raises(pixelwire.TransferError, match="content hash"):
                    await reader.read_decoded(forged, output="numpy")
                await reader.read_decoded(other, output="numpy")

        run(main())
    finally:
        frontend.close()


def test_chunked_read_into_calls_back_in_order_and_checks_the_slot_last() -> None:
    """`read_into` with chunks: the callback sees each chunk in order as it
    lands; the slot header is still checked after the last one, so a
    reclaimed slot raises even though chunks were handed out, and an
    exception from the callback comes back as it is."""
    frontend = Frontend(lease=1.0)
    from pixelwire import config
    from pixelwire._native import NativeReader
    from pixelwire.nixl import ensure_nixl

    ensure_nixl()
    # The native reader is what is under test.
    native = NativeReader(config.ReaderSettings(timeout=10, verify=True))
    try:
        data = ppm_of_size(3 * (1 << 20), seed=11)
        expected = pixelwire.decode_image(data).reshape(-1)
        buffer = np.zeros(expected.size, dtype=np.uint8)
        registration = native.register(addr=buffer.ctypes.data, size=buffer.size, mem_type="Dram", device=0)
        fields = {"local_addr": buffer.ctypes.data, "mem_type": "Dram", "device": 0, "chunk_bytes": 1 << 20}

        def parsed(desc: dict[str, Any]) -> pixelwire.descriptor.RemoteImage:
            return pixelwire.descriptor.parse_descriptor(desc, None)

        seen: list[tuple[int, int]] = []
        desc = frontend.publish(data)["desc"]
        native.read_into(parsed(desc), on_chunk=lambda at, n: seen.append((at, n)), **fields)
        assert seen == [(0, 1 << 20), (1 << 20, 1 << 20), (2 << 20, 1 << 20)]
        np.testing.assert_array_equal(buffer, expected)

        class Stop(Exception):
            pass

        def stop(at: int, n: int) -> None:
            raise Stop(at)

        with pytest.raises(Stop):
            native.read_into(parsed(frontend.publish(data)["desc"]), on_chunk=stop, **fields)
        # Chunks were in flight when it stopped: that memory is quarantined
        # (kept allocated here meanwhile); the next read goes elsewhere.
        assert native.quarantined(registration) and native.deregister(registration)
        fresh = np.zeros(expected.size, dtype=np.uint8)
        native.register(addr=fresh.ctypes.data, size=fresh.size, mem_type="Dram", device=0, owner=fresh)
        fields["local_addr"] = fresh.ctypes.data

        stale = frontend.publish(data)["desc"]
        assert _wait_for(lambda: frontend.stats()["reclaimed_by_lease"] >= 2, 10)
        seen.clear()
        with pytest.raises(pixelwire.TransferError, match="reclaimed or reused"):
            native.read_into(parsed(stale), on_chunk=lambda at, n: seen.append((at, n)), **fields)
        assert len(seen) == 3, "every chunk landed before the check refused them"
        _LANDING_ZONES.append(buffer)
    finally:
        frontend.close()


@pytest.mark.parametrize(
    "settings",
    [{}, {"inline_wait": 0.0}, {"inline_bytes": 0}],
    ids=["waited-in-place", "never-in-place", "all-off-the-loop"],
)
def test_small_reads_give_the_same_pixels_in_place_or_off_the_loop(settings: dict[str, Any]) -> None:
    """Small host reads run on a native thread that the loop waits for in
    place up to `inline_wait`, else off the loop; either way the pixels are
    the image's and every slot is freed by notification. The first read
    (which connects) and a read larger than `inline_bytes` are in the mix."""
    frontend = Frontend()
    try:
        images = [_png(16 + 7 * i, 9 + 5 * i, seed=i) for i in range(12)] + [_png(400, 300, seed=99)]

        async def main() -> None:
            async with pixelwire.Reader(**settings) as reader:
                for data in images:
                    desc = frontend.publish(data)["desc"]
                    got = await reader.read_decoded(desc, output="numpy")
                    np.testing.assert_array_equal(got, pixelwire.decode_image(data))
                    del got  # zero-copy: the array holds its receive slot
                assert reader.stats()["bytes_in_use"] == 0

        run(main())
        assert _wait_for(lambda: frontend.stats()["freed_by_notification"] == len(images))
    finally:
        frontend.close()


def test_concurrent_large_reads_are_awaited_through_the_loop_and_survive_close(
    frontend: PublisherProcess,
) -> None:
    """Reads larger than `inline_bytes` are awaited through the reader's
    completion signal on the event loop: many at once give each its own
    image's pixels and free every slot by notification; closing the reader
    while reads are still in flight lets them finish (none hangs), and the
    reader reopens on the next read. A second event loop (its own thread)
    reads through the same reader too, and so do successive event loops."""
    images = [ppm_of_size(3 * 1024 * (100 + 12 * i), seed=40 + i) for i in range(12)]
    expected = [pixelwire.decode_image(d) for d in images]
    freed_before = frontend.stats()["freed_by_notification"]

    async def read_all(reader: pixelwire.Reader, close_midway: bool) -> None:
        descs = [frontend.publish(d)["desc"] for d in images]
        reads = [asyncio.ensure_future(reader.read_decoded(d, output="numpy")) for d in descs]
        if close_midway:
            await asyncio.sleep(0)
            await reader.close()
        got = await asyncio.wait_for(asyncio.gather(*reads), 30)
        for pixels, want in zip(got, expected, strict=True):
            np.testing.assert_array_equal(pixels, want)

    async def main() -> None:
        reader = pixelwire.Reader()
        await read_all(reader, close_midway=False)
        await read_all(reader, close_midway=True)
        await read_all(reader, close_midway=False)
        await asyncio.to_thread(lambda: asyncio.run(read_all(reader, close_midway=False)))
        await reader.close()

    run(main())
    # The same reader in successive event loops, each awaiting its own reads.
    reader = pixelwire.Reader()
    for _ in range(2):
        run(read_all(reader, close_midway=False))
    run(reader.close())
    assert _wait_for(lambda: frontend.stats()["freed_by_notification"] - freed_before == 6 * len(images))


def test_read_into_host_memory_checks_the_content_hash(frontend: PublisherProcess) -> None:
    """`read_into` a registered host buffer checks the content hash when the
    reader verifies (the CUDA pinned path reads this way): a descriptor whose
    hash names other pixels is a TransferError, the same descriptor read
    with a reader that does not verify is not (the slot header still
    holds), and the true descriptor gives the image's pixels."""
    from pixelwire import config
    from pixelwire._native import NativeReader
    from pixelwire.nixl import ensure_nixl

    ensure_nixl()
    data = ppm_of_size(3 << 20, seed=21)
    want = pixelwire.decode_image(data).reshape(-1)
    other = frontend.publish(ppm_of_size(1 << 20, seed=22))["desc"]
    for verify in (True, False):
        native = NativeReader(config.ReaderSettings(timeout=10, verify=verify))
        buffer = np.zeros(want.size, dtype=np.uint8)
        registration = native.register(addr=buffer.ctypes.data, size=buffer.size, mem_type="Dram", device=0)
        fields = {"local_addr": buffer.ctypes.data, "mem_type": "Dram", "device": 0, "chunk_bytes": 1 << 20}
        forged = dict(frontend.publish(data)["desc"], content_hash=other["content_hash"])
        image = pixelwire.descriptor.parse_descriptor(forged, None)
        if verify:
            with pytest.raises(pixelwire.TransferError, match="content hash"):
                native.read_into(image, **fields)
        else:
            native.read_into(image, **fields)
            np.testing.assert_array_equal(buffer, want)
        buffer[:] = 0
        native.read_into(
            pixelwire.descriptor.parse_descriptor(frontend.publish(data)["desc"], None), **fields
        )
        np.testing.assert_array_equal(buffer, want)
        assert native.deregister(registration)


def test_memory_a_failed_read_may_still_write_is_quarantined(frontend: PublisherProcess) -> None:
    """A READ into registered memory that breaks off while other chunks are
    still in flight may land later: the native reader quarantines that
    memory, and the receive slot for its header, for twice the read
    timeout. Meanwhile a read into it is refused, `stats()` counts both,
    and a deregistration waits with the memory's owner kept; then both
    are let go."""
    from pixelwire._native import NativeReader
    from pixelwire.nixl import ensure_nixl

    ensure_nixl()
    native = NativeReader(ReaderSettings(timeout=2, verify=True))
    data = ppm_of_size(3 * (1 << 20), seed=13)
    buffer = np.zeros(pixelwire.decode_image(data).size, dtype=np.uint8)
    owner = weakref.ref(buffer)
    registration = native.register(
        addr=buffer.ctypes.data, size=buffer.size, mem_type="Dram", device=0, owner=buffer
    )
    fields = {"local_addr": buffer.ctypes.data, "mem_type": "Dram", "device": 0, "chunk_bytes": 1 << 20}

    def image() -> pixelwire.descriptor.RemoteImage:
        return pixelwire.descriptor.parse_descriptor(frontend.publish(data)["desc"])

    class Stop(Exception):
        pass

    def stop(at: int, n: int) -> None:
        raise Stop(at)

    assert not native.quarantined(registration)
    with pytest.raises(Stop):
        native.read_into(image(), on_chunk=stop, **fields)  # two chunks still in flight
    stats = native.stats()
    assert (stats["quarantined_slots"], stats["quarantined_caller_buffers"]) == (1, 1), stats
    assert native.quarantined(registration)
    with pytest.raises(pixelwire.TransferError, match="quarantined") as refused:
        native.read_into(image(), **fields)
    assert refused.value.may_land is False, "refused before any READ"
    assert native.deregister(registration)
    del buffer
    assert owner() is not None, "kept while a READ may still land in it"
    assert native.stats()["registered_caller_buffers"] == 1
    assert _wait_for(lambda: native.stats()["quarantined_caller_buffers"] == 0, 10)
    stats = native.stats()
    assert (stats["registered_caller_buffers"], stats["quarantined_slots"]) == (0, 0), stats
    assert owner() is None, "let go with its registration"
    assert not native.deregister(registration)


def test_a_read_that_may_still_land_says_so(frontend: PublisherProcess) -> None:
    """A READ that times out once posted raises a `TransferError` whose
    `may_land`, set when the native reader builds it, says the transfer
    may still write the destination."""
    from pixelwire._native import NativeReader
    from pixelwire.nixl import ensure_nixl

    ensure_nixl()
    native = NativeReader(ReaderSettings(timeout=1e-9, verify=False))
    data = ppm_of_size(24 << 20, seed=14)
    buffer = np.zeros(pixelwire.decode_image(data).size, dtype=np.uint8)
    _LANDING_ZONES.append(buffer)
    native.register(addr=buffer.ctypes.data, size=buffer.size, mem_type="Dram", device=0)
    image = pixelwire.descriptor.parse_descriptor(frontend.publish(data)["desc"])
    with pytest.raises(pixelwire.TransferError, match="timed out") as late:
        native.read_into(image, local_addr=buffer.ctypes.data, mem_type="Dram", device=0)
    assert late.value.may_land is True


def test_a_reader_takes_its_settings_whole_or_field_by_field() -> None:
    """`Reader(settings)` and `Reader(field=...)` make one `ReaderSettings`
    (defaults from `pixelwire.config` only), brought into range when made;
    the native reader is built from that object alone, and refuses one
    that lacks a field it reads."""
    from pixelwire._native import NativeReader
    from pixelwire.nixl import ensure_nixl

    settings = ReaderSettings(timeout=5, pool_bytes=8 * MiB, region_bytes=64 * MiB, chunk_bytes=0)
    assert (settings.region_bytes, settings.chunk_bytes) == (8 * MiB, 1)
    assert pixelwire.Reader(settings).settings == settings
    assert pixelwire.Reader(settings, verify=False).settings == dataclasses.replace(settings, verify=False)
    assert pixelwire.Reader(timeout=30).settings == ReaderSettings(timeout=30)
    assert pixelwire.Reader().settings == ReaderSettings()
    with pytest.raises(TypeError):
        pixelwire.Reader(no_such_setting=1)
    with pytest.raises(ValueError, match="inline_wait"):
        pixelwire.Reader(inline_wait=-1.0)
    with pytest.raises(ValueError, match="cuda_staging"):
        ReaderSettings(cuda_staging="nowhere")  # type: ignore[arg-type]

    async def main() -> None:
        async with pixelwire.Reader(settings) as reader:
            assert reader.stats()["bytes_in_use"] == 0

    run(main())
    ensure_nixl()
    with pytest.raises(AttributeError, match="pool_bytes"):
        NativeReader(object())  # type: ignore[arg-type]


def test_read_remote_reads_a_parsed_descriptor_and_still_checks_it(frontend: PublisherProcess) -> None:
    """`Reader.read_remote` reads what `parse_descriptor` made (no second
    parse) as `read_decoded` reads the descriptor itself; the reader's own
    checks still apply: an expired lease or an image over `max_pixels` is
    refused before any READ."""
    data = _png(40, 30, seed=3)
    image = pixelwire.descriptor.parse_descriptor(frontend.publish(data)["desc"])

    async def main() -> None:
        async with pixelwire.Reader(timeout=10, max_pixels=40 * 30) as reader:
            expired = dataclasses.replace(image, expires_at=time.time() - 1)
            with pytest.raises(pixelwire.DescriptorError, match="expired"):
                await reader.read_remote(expired)
            async with pixelwire.Reader(max_pixels=40 * 30 - 1) as small:
                with pytest.raises(pixelwire.DescriptorError, match="max_pixels"):
                    await small.read_remote(image)
            got = await reader.read_remote(image, output="numpy")
            np.testing.assert_array_equal(got, pixelwire.decode_image(data))

    run(main())


def test_a_started_read_is_taken_once(frontend: PublisherProcess) -> None:
    """`start_read` returns at once; its ticket gives the pixels when the
    read ends (or None while it has not, within a zero wait), then refuses
    to give them a second time; a ticket's error is the read's error."""
    from pixelwire import config
    from pixelwire._native import NativeReader
    from pixelwire.nixl import ensure_nixl

    ensure_nixl()
    native = NativeReader(config.ReaderSettings(timeout=10, verify=True))
    data = _png(33, 21, seed=5)
    image = pixelwire.descriptor.parse_descriptor(frontend.publish(data)["desc"], None)
    ticket = native.start_read(image)
    early = ticket.wait(0.0)
    pixels = early if early is not None else ticket.wait()
    assert ticket.done
    np.testing.assert_array_equal(
        np.frombuffer(memoryview(pixels), dtype=np.uint8), pixelwire.decode_image(data).reshape(-1)
    )
    with pytest.raises(ValueError, match="already taken"):
        ticket.wait()
    with pytest.raises(ValueError, match="already taken"):
        ticket.wait(0.001)
    del pixels, early
    # A read that fails (its slot already freed by the first read's
    # notification) raises through the ticket as `read` raises.
    assert _wait_for(lambda: frontend.stats()["freed_by_notification"] == 1)
    with pytest.raises(pixelwire.TransferError):
        native.start_read(image).wait()
