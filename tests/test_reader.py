"""The reader (`python/pixelwire/reader.py`, `src/reader.rs`) over real
NIXL (UCX) from a publisher in a child process: split, chunked and verified
reads, small reads in place, concurrent large reads, `read_into` and its
quarantine, tickets, zero-copy slots, settings, and descriptors that are
tampered with or come in dynamo's shape. No mocks."""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import pixelwire
from pixelwire.config import ReaderSettings
from pixelwire.publisher_process import PublisherProcess

MiB = 1024 * 1024

try:
    pixelwire.transfer.nixl_library_path()
except pixelwire.TransferError as missing:  # pragma: no cover - CI installs it
    pytest.skip(f"NIXL runtime not installed: {missing}", allow_module_level=True)


# Memory a failed READ may still write, kept for the life of the test
# process rather than handed back to the allocator under a transfer.
_LANDING_ZONES: list[np.ndarray] = []


def test_tampered_descriptors_never_give_pixels(
    publisher_process: PublisherProcess, random_png: Callable[..., bytes], wait_for: Callable[..., bool]
) -> None:
    first = publisher_process.publish(random_png(64, 64, seed=1))["desc"]
    other = publisher_process.publish(random_png(64, 64, seed=2))["desc"]

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
            # frees first's slot: once the publisher has taken it, `first`
            # itself is refused, and the reader still works for the rest.
            # (Before that, first's slot still holds first's pixels and a
            # read of it is right to give them.)
            assert wait_for(lambda: publisher_process.stats()["freed_by_notification"] >= 1)
            with pytest.raises(pixelwire.TransferError, match="reclaimed or reused"):
                await reader.read_decoded(first, output="numpy")
            fresh = publisher_process.publish(random_png(64, 64, seed=3))["desc"]
            for good in (other, fresh):
                await reader.read_decoded(good, output="numpy")

    asyncio.run(main())


def _lent_slot(array: np.ndarray) -> bool:
    """Whether the array's memory is a receive slot lent zero-copy."""
    base: Any = array
    while base is not None:
        if type(base).__name__ == "PixelBuffer":
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False


def test_zero_copy_while_the_pool_has_room_then_copies(
    publisher_process: PublisherProcess, random_png: Callable[..., bytes]
) -> None:
    image = random_png(600, 580, seed=3)  # ~1 MiB of pixels
    expected = pixelwire.decode_image(image)

    async def main() -> None:
        async with pixelwire.Reader(pool_bytes=4 * MiB, region_bytes=4 * MiB) as reader:
            kept = []
            for _ in range(4):
                kept.append(
                    await reader.read_decoded(publisher_process.publish(image)["desc"], output="numpy")
                )
            lent = [_lent_slot(a) for a in kept]
            assert lent == [True, True, False, False], lent
            for array in kept:
                np.testing.assert_array_equal(array, expected)
            kept[0][0, 0, 0] ^= 0xFF  # owned memory: writable, and no one else's
            del kept, array
            # Dropping the arrays gave the slots back: lent again.
            again = await reader.read_decoded(publisher_process.publish(image)["desc"], output="numpy")
            assert _lent_slot(again)
            np.testing.assert_array_equal(again, expected)

    asyncio.run(main())


def test_dynamo_rdma_metadata_descriptor(
    publisher_process: PublisherProcess, random_png: Callable[..., bytes], wait_for: Callable[..., bool]
) -> None:
    """A dynamo nixl_connect RdmaMetadata-shaped dict, with the shape given."""
    data = random_png(200, 150, seed=9)
    desc = publisher_process.publish(data)["desc"]
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

    asyncio.run(main())
    assert wait_for(lambda: publisher_process.stats()["slots_in_use"] == 0)


@pytest.mark.parametrize("read_threads", [0, 3])
def test_split_reads_deliver_every_byte(
    read_threads: int,
    ppm_of_size: Callable[..., bytes],
    wait_for: Callable[..., bool],
    start_publisher_process: Callable[..., PublisherProcess],
) -> None:
    """A READ split across the UCX backend's threads (any split, odd sizes
    and a tail shorter than a page) gives the same pixels as one READ, and
    frees every slot by notification."""
    publisher_process = start_publisher_process(pool_bytes=128 * MiB)
    images = [ppm_of_size(n, seed=n) for n in (3, 3 * 4097, 3 * 1024 * 1025, 3 * 2000 * 2621)]

    async def main() -> None:
        reader = pixelwire.Reader(read_threads=read_threads, split_min_bytes=4096)
        async with reader:
            for data in images:
                desc = publisher_process.publish(data)["desc"]
                got = await reader.read_decoded(desc, output="numpy")
                np.testing.assert_array_equal(got, pixelwire.decode_image(data))

    asyncio.run(main())
    assert wait_for(lambda: publisher_process.stats()["freed_by_notification"] == len(images))


@pytest.mark.parametrize(
    ("chunk_bytes", "hash_threads"),
    [(1, 1), (300_000, 3), (1 << 20, 4), (1 << 40, 2)],
    ids=["one-piece-chunks", "odd-chunks", "default-chunks", "one-chunk"],
)
def test_verified_reads_hash_every_piece_however_they_are_chunked(
    chunk_bytes: int,
    hash_threads: int,
    ppm_of_size: Callable[..., bytes],
    start_publisher_process: Callable[..., PublisherProcess],
) -> None:
    """A verified read goes in chunks of whole 256 KiB hash pieces, all in
    flight, each hashed as it lands: any chunk setting (rounded to pieces)
    and any number of hashing threads give the image's pixels for sizes that
    are not multiples of a piece or a chunk, and a hash that names other
    pixels is still refused."""
    publisher_process = start_publisher_process(pool_bytes=128 * MiB)
    piece = 256 * 1024
    images = [ppm_of_size(n, seed=n) for n in (3, 3 * (piece + 1), 3 * 1000 * 350, 3 * 2000 * 2621)]

    async def main() -> None:
        reader = pixelwire.Reader(chunk_bytes=chunk_bytes, hash_threads=hash_threads, verify=True)
        async with reader:
            for data in images:
                desc = publisher_process.publish(data)["desc"]
                got = await reader.read_decoded(desc, output="numpy")
                np.testing.assert_array_equal(got, pixelwire.decode_image(data))
                del got
            other = publisher_process.publish(images[1])["desc"]
            forged = publisher_process.publish(images[2])["desc"]
            forged["content_hash"] = other["content_hash"]
            with pytest.raises(pixelwire.TransferError, match="content hash"):
                await reader.read_decoded(forged, output="numpy")
            await reader.read_decoded(other, output="numpy")

    asyncio.run(main())


def test_chunked_read_into_calls_back_in_order_and_checks_the_slot_last(
    ppm_of_size: Callable[..., bytes],
    wait_for: Callable[..., bool],
    start_publisher_process: Callable[..., PublisherProcess],
) -> None:
    """`read_into` with chunks: the callback sees each chunk in order as it
    lands; the slot header is still checked after the last one, so a
    reclaimed slot raises even though chunks were handed out, and an
    exception from the callback comes back as it is. The lease is short
    enough to wait out, long enough for the first read (which connects)
    to end inside it on a loaded machine."""
    publisher_process = start_publisher_process(lease=5.0)
    from pixelwire import config
    from pixelwire._native import NativeReader
    from pixelwire.nixl import ensure_nixl

    ensure_nixl()
    # The native reader is what is under test.
    native = NativeReader(config.ReaderSettings(timeout=10, verify=True))
    data = ppm_of_size(3 * (1 << 20), seed=11)
    expected = pixelwire.decode_image(data).reshape(-1)
    buffer = np.zeros(expected.size, dtype=np.uint8)
    registration = native.register(addr=buffer.ctypes.data, size=buffer.size, mem_type="Dram", device=0)
    fields = {"local_addr": buffer.ctypes.data, "mem_type": "Dram", "device": 0, "chunk_bytes": 1 << 20}

    def parsed(desc: dict[str, Any]) -> pixelwire.descriptor.RemoteImage:
        return pixelwire.descriptor.parse_descriptor(desc, None)

    seen: list[tuple[int, int]] = []
    desc = publisher_process.publish(data)["desc"]
    native.read_into(parsed(desc), on_chunk=lambda at, n: seen.append((at, n)), **fields)
    assert seen == [(0, 1 << 20), (1 << 20, 1 << 20), (2 << 20, 1 << 20)]
    np.testing.assert_array_equal(buffer, expected)

    class Stop(Exception):
        pass

    def stop(at: int, n: int) -> None:
        raise Stop(at)

    with pytest.raises(Stop):
        native.read_into(parsed(publisher_process.publish(data)["desc"]), on_chunk=stop, **fields)
    # Chunks were in flight when it stopped: that memory is quarantined
    # (kept allocated here meanwhile); the next read goes elsewhere.
    assert native.quarantined(registration) and native.deregister(registration)
    fresh = np.zeros(expected.size, dtype=np.uint8)
    native.register(addr=fresh.ctypes.data, size=fresh.size, mem_type="Dram", device=0, owner=fresh)
    fields["local_addr"] = fresh.ctypes.data

    stale = publisher_process.publish(data)["desc"]
    assert wait_for(lambda: publisher_process.stats()["reclaimed_by_lease"] >= 2, 30)
    seen.clear()
    with pytest.raises(pixelwire.TransferError, match="reclaimed or reused"):
        native.read_into(parsed(stale), on_chunk=lambda at, n: seen.append((at, n)), **fields)
    assert len(seen) == 3, "every chunk landed before the check refused them"
    _LANDING_ZONES.append(buffer)


def test_chunks_are_handed_on_while_later_ones_are_still_to_be_read(
    publisher_process: PublisherProcess, ppm_of_size: Callable[..., bytes]
) -> None:
    """A chunked READ hands its chunks on (to be hashed, or copied to a GPU)
    while the chunks after them are still to be READ, not once every chunk
    has landed: NIXL's threaded UCX engine returns from a post only once
    its threads have issued the READ, which on one host is mostly once the
    bytes are copied, so a reader that posted every chunk before handing
    any on overlapped nothing. After a first read (which connects), the
    first of eight chunks is handed on before the last has been posted (a
    chunk's completion is seen a post or two after its bytes are in), its
    bytes still the zeros the buffer was filled with, in at least one of
    five reads (one is enough to show the overlap, and a loaded machine may
    delay some); the pixels are whole every time."""
    from pixelwire._native import NativeReader
    from pixelwire.nixl import ensure_nixl

    ensure_nixl()
    native = NativeReader(ReaderSettings(timeout=10, verify=True))
    data = ppm_of_size(8 << 20, seed=17)
    expected = pixelwire.decode_image(data).reshape(-1)
    buffer = np.zeros(expected.size, dtype=np.uint8)
    native.register(addr=buffer.ctypes.data, size=buffer.size, mem_type="Dram", device=0, owner=buffer)
    last = buffer[7 << 20 :]
    last_landed_first = []
    for round_ in range(6):
        buffer[:] = 0
        image = pixelwire.descriptor.parse_descriptor(publisher_process.publish(data)["desc"])
        seen: list[tuple[int, bool]] = []
        native.read_into(
            image,
            local_addr=buffer.ctypes.data,
            mem_type="Dram",
            device=0,
            chunk_bytes=1 << 20,
            on_chunk=lambda at, n, seen=seen: seen.append((at, bool(last.any()))),
        )
        assert [at for at, _ in seen] == [k << 20 for k in range(8)]
        np.testing.assert_array_equal(buffer, expected)
        if round_ > 0:
            last_landed_first.append(seen[0][1])
    assert not all(last_landed_first), "the first chunk was handed on after the last had landed, every time"


@pytest.mark.parametrize(
    "settings",
    [{}, {"inline_wait": 0.0}, {"inline_bytes": 0}],
    ids=["waited-in-place", "never-in-place", "all-off-the-loop"],
)
def test_small_reads_give_the_same_pixels_in_place_or_off_the_loop(
    settings: dict[str, Any],
    random_png: Callable[..., bytes],
    wait_for: Callable[..., bool],
    publisher_process: PublisherProcess,
) -> None:
    """Small host reads run on a native thread that the loop waits for in
    place up to `inline_wait`, else off the loop; either way the pixels are
    the image's and every slot is freed by notification. The first read
    (which connects) and a read larger than `inline_bytes` are in the mix."""
    images = [random_png(16 + 7 * i, 9 + 5 * i, seed=i) for i in range(12)] + [random_png(400, 300, seed=99)]

    async def main() -> None:
        async with pixelwire.Reader(**settings) as reader:
            for data in images:
                desc = publisher_process.publish(data)["desc"]
                got = await reader.read_decoded(desc, output="numpy")
                np.testing.assert_array_equal(got, pixelwire.decode_image(data))
                del got  # zero-copy: the array holds its receive slot
            assert reader.stats()["bytes_in_use"] == 0

    asyncio.run(main())
    assert wait_for(lambda: publisher_process.stats()["freed_by_notification"] == len(images))


def test_concurrent_large_reads_are_awaited_through_the_loop_and_survive_close(
    publisher_process: PublisherProcess, ppm_of_size: Callable[..., bytes], wait_for: Callable[..., bool]
) -> None:
    """Reads larger than `inline_bytes` are awaited through the reader's
    completion signal on the event loop: many at once give each its own
    image's pixels and free every slot by notification; closing the reader
    while reads are still in flight lets them finish (none hangs), and the
    reader reopens on the next read. A second event loop (its own thread)
    reads through the same reader too, and so do successive event loops."""
    images = [ppm_of_size(3 * 1024 * (100 + 12 * i), seed=40 + i) for i in range(12)]
    expected = [pixelwire.decode_image(d) for d in images]
    freed_before = publisher_process.stats()["freed_by_notification"]

    async def read_all(reader: pixelwire.Reader, close_midway: bool) -> None:
        descs = [publisher_process.publish(d)["desc"] for d in images]
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

    asyncio.run(main())
    # The same reader in successive event loops, each awaiting its own reads.
    reader = pixelwire.Reader()
    for _ in range(2):
        asyncio.run(read_all(reader, close_midway=False))
    asyncio.run(reader.close())
    assert wait_for(
        lambda: publisher_process.stats()["freed_by_notification"] - freed_before == 6 * len(images)
    )


def test_read_into_host_memory_checks_the_content_hash(
    publisher_process: PublisherProcess, ppm_of_size: Callable[..., bytes]
) -> None:
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
    other = publisher_process.publish(ppm_of_size(1 << 20, seed=22))["desc"]
    for verify in (True, False):
        native = NativeReader(config.ReaderSettings(timeout=10, verify=verify))
        buffer = np.zeros(want.size, dtype=np.uint8)
        registration = native.register(addr=buffer.ctypes.data, size=buffer.size, mem_type="Dram", device=0)
        fields = {"local_addr": buffer.ctypes.data, "mem_type": "Dram", "device": 0, "chunk_bytes": 1 << 20}
        forged = dict(publisher_process.publish(data)["desc"], content_hash=other["content_hash"])
        image = pixelwire.descriptor.parse_descriptor(forged, None)
        if verify:
            with pytest.raises(pixelwire.TransferError, match="content hash"):
                native.read_into(image, **fields)
        else:
            native.read_into(image, **fields)
            np.testing.assert_array_equal(buffer, want)
        buffer[:] = 0
        native.read_into(
            pixelwire.descriptor.parse_descriptor(publisher_process.publish(data)["desc"], None), **fields
        )
        np.testing.assert_array_equal(buffer, want)
        assert native.deregister(registration)


def test_memory_a_failed_read_may_still_write_is_quarantined(
    publisher_process: PublisherProcess, ppm_of_size: Callable[..., bytes], wait_for: Callable[..., bool]
) -> None:
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
        return pixelwire.descriptor.parse_descriptor(publisher_process.publish(data)["desc"])

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
    assert wait_for(lambda: native.stats()["quarantined_caller_buffers"] == 0, 10)
    stats = native.stats()
    assert (stats["registered_caller_buffers"], stats["quarantined_slots"]) == (0, 0), stats
    assert owner() is None, "let go with its registration"
    assert not native.deregister(registration)


def test_a_read_that_may_still_land_says_so(
    publisher_process: PublisherProcess, ppm_of_size: Callable[..., bytes]
) -> None:
    """A READ that times out once posted raises a `TransferError` whose
    `may_land`, set when the native reader builds it, says the transfer
    may still write the destination. UCX may finish a READ inside the post
    itself (a synchronous copy), before any deadline is looked at, so the
    read is tried until one times out; every timeout must say so."""
    from pixelwire._native import NativeReader
    from pixelwire.nixl import ensure_nixl

    ensure_nixl()
    native = NativeReader(ReaderSettings(timeout=1e-9, verify=False))
    data = ppm_of_size(24 << 20, seed=14)
    buffer = np.zeros(pixelwire.decode_image(data).size, dtype=np.uint8)
    _LANDING_ZONES.append(buffer)
    native.register(addr=buffer.ctypes.data, size=buffer.size, mem_type="Dram", device=0)
    timeouts: list[pixelwire.TransferError] = []
    for _ in range(20):
        image = pixelwire.descriptor.parse_descriptor(publisher_process.publish(data)["desc"])
        try:
            native.read_into(image, local_addr=buffer.ctypes.data, mem_type="Dram", device=0)
        except pixelwire.TransferError as error:
            assert "timed out" in str(error)
            timeouts.append(error)
            break
    assert timeouts, "no READ of 24 MiB was still running 1 ns after it started"
    assert timeouts[0].may_land is True


_DROP_AFTER_A_TIMEOUT = """
import gc, sys
import numpy as np
import pixelwire
from pixelwire.config import ReaderSettings
from pixelwire.nixl import ensure_nixl
from pixelwire.publisher_process import PublisherProcess
from pixelwire._native import NativeReader

ensure_nixl()
data = open(sys.argv[1], "rb").read()
for round in range(3):
    publisher = PublisherProcess(pool_bytes=64 << 20, lease=60.0, acquire=5.0)
    native = NativeReader(ReaderSettings(timeout=1e-9, verify=False))
    buffer = np.zeros(pixelwire.decode_image(data).size, dtype=np.uint8)
    native.register(addr=buffer.ctypes.data, size=buffer.size, mem_type="Dram", device=0)
    for _ in range(20):
        image = pixelwire.descriptor.parse_descriptor(publisher.publish(data)["desc"])
        try:
            native.read_into(image, local_addr=buffer.ctypes.data, mem_type="Dram", device=0)
        except pixelwire.TransferError:
            break
    print("abandoned", native.stats()["abandoned_reads"], flush=True)
    publisher.close()
    del native
    gc.collect()
    print("dropped", flush=True)
"""


def test_a_reader_dropped_after_a_timed_out_read_ends_cleanly(
    tmp_path: Path, ppm_of_size: Callable[..., bytes]
) -> None:
    """A READ that timed out is kept (`abandoned_reads`) until UCX is done
    with it, not let go while still queued, and a reader dropped after one,
    with the frontend gone meanwhile, ends cleanly: a UCX worker destroyed
    with a READ still queued aborts the process (an assertion that its
    queues are empty), as CI saw once in a garbage collection after such a
    test. In a child process: an abort there is a failure here, not the
    end of the suite."""
    image = tmp_path / "image.ppm"
    image.write_bytes(ppm_of_size(24 << 20, seed=14))
    child = subprocess.run(
        [sys.executable, "-c", _DROP_AFTER_A_TIMEOUT, str(image)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stdout + child.stderr
    assert child.stdout.count("dropped") == 3
    assert "abandoned 1" in child.stdout, "the timed-out READ was kept until it ended"


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

    asyncio.run(main())
    ensure_nixl()
    with pytest.raises(AttributeError, match="pool_bytes"):
        NativeReader(object())  # type: ignore[arg-type]


def test_read_remote_reads_a_parsed_descriptor_and_still_checks_it(
    publisher_process: PublisherProcess, random_png: Callable[..., bytes]
) -> None:
    """`Reader.read_remote` reads what `parse_descriptor` made (no second
    parse) as `read_decoded` reads the descriptor itself; the reader's own
    checks still apply: an expired lease or an image over `max_pixels` is
    refused before any READ."""
    data = random_png(40, 30, seed=3)
    image = pixelwire.descriptor.parse_descriptor(publisher_process.publish(data)["desc"])

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

    asyncio.run(main())


def test_a_started_read_is_taken_once(
    publisher_process: PublisherProcess, random_png: Callable[..., bytes], wait_for: Callable[..., bool]
) -> None:
    """`start_read` returns at once; its ticket gives the pixels when the
    read ends (or None while it has not, within a zero wait), then refuses
    to give them a second time; a ticket's error is the read's error."""
    from pixelwire import config
    from pixelwire._native import NativeReader
    from pixelwire.nixl import ensure_nixl

    ensure_nixl()
    native = NativeReader(config.ReaderSettings(timeout=10, verify=True))
    data = random_png(33, 21, seed=5)
    image = pixelwire.descriptor.parse_descriptor(publisher_process.publish(data)["desc"], None)
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
    assert wait_for(lambda: publisher_process.stats()["freed_by_notification"] == 1)
    with pytest.raises(pixelwire.TransferError):
        native.start_read(image).wait()
