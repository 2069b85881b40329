"""Buffer lifecycle of the NIXL transfer under concurrency, growth, leases and
cancellation: reads that hold while the frontend's pool changes, pools that
never lose capacity, leases that end no earlier than advertised, integrity
checks that catch a reclaimed or reused slot with verification off, and
cancelled or failed operations that give back what they took.

Real NIXL between real processes (the publisher is a child process); no mocks.
"""

from __future__ import annotations

import asyncio
import copy
import io
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from PIL import Image

import pixelwire
from pixelwire.publisher_process import PublisherProcess

MiB = 1024 * 1024

try:
    pixelwire.transfer.nixl_library_path()
except pixelwire.TransferError as missing:  # pragma: no cover - CI installs it
    pytest.skip(f"NIXL runtime not installed: {missing}", allow_module_level=True)


@pytest.fixture
def growing_publisher_process(start_publisher_process: Callable[..., PublisherProcess]) -> PublisherProcess:
    """A publisher process whose regions are 1 MiB, so any larger image grows
    the pool (new registered memory, new agent metadata)."""
    return start_publisher_process(pool_bytes=256 * MiB, lease=60.0, acquire=10.0, region_bytes=1 * MiB)


def test_concurrent_reads_hold_while_the_frontend_pool_grows(
    growing_publisher_process: PublisherProcess,
    random_png: Callable[..., bytes],
    wait_for: Callable[..., bool],
) -> None:
    """Descriptors minted before and after each pool growth carry different
    metadata; 16 concurrent reads over them, in random order, must all return
    the right pixels (no read may see the frontend's metadata half-reloaded)."""
    images = {seed: random_png(64 + 24 * seed, 48 + 16 * seed, seed) for seed in range(6)}
    big = {100 + seed: random_png(700 + 40 * seed, 500 + 30 * seed, 100 + seed) for seed in range(6)}
    expected = {key: pixelwire.decode_image(data) for key, data in {**images, **big}.items()}

    async def main() -> int:
        async with pixelwire.Reader(timeout=20) as reader:
            jobs: list[tuple[int, dict[str, Any]]] = []
            for round_ in range(6):
                for seed, data in images.items():
                    jobs += [(seed, d) for d in growing_publisher_process.publish_many(data, 2)["descs"]]
                # > 1 MiB of pixels: a region of its own, so the metadata changes.
                jobs.append((100 + round_, growing_publisher_process.publish(big[100 + round_])["desc"]))
            random.Random(7).shuffle(jobs)
            gate = asyncio.Semaphore(16)
            failures: list[str] = []

            async def one(key: int, desc: dict[str, Any]) -> None:
                async with gate:
                    try:
                        got = await reader.read_decoded(desc, output="numpy")
                    except pixelwire.PixelwireError as error:
                        failures.append(f"{type(error).__name__}: {error}")
                        return
                    np.testing.assert_array_equal(got, expected[key])

            await asyncio.gather(*(one(k, d) for k, d in jobs))
            assert not failures, f"{len(failures)} of {len(jobs)} reads failed: {failures[:3]}"
            return len(jobs)

    reads = asyncio.run(main())
    assert wait_for(lambda: growing_publisher_process.stats()["freed_by_notification"] == reads)
    stats = growing_publisher_process.stats()
    assert stats["regions"] > 1, f"the pool never grew: {stats}"
    assert stats["slots_in_use"] == 0 and stats["bytes_in_use"] == 0


def test_a_frontend_pool_that_grows_costs_its_reader_no_reconnect(
    random_png: Callable[..., bytes],
    wait_for: Callable[..., bool],
    start_publisher_process: Callable[..., PublisherProcess],
) -> None:
    """A frontend's pool growing (a new region: newer metadata) is merged into
    the reader's view of it, not paid for with a reconnect (tens of
    milliseconds while the reads behind it wait); once the frontend drops a
    region, the reader reconnects, so no new region can inherit a dropped
    one's registration. Every read returns its own pixels."""
    # 3.2, 3.9 and 5.0 MB of pixels: the third fits only once a region is dropped.
    sizes = [(1200, 900), (1300, 1000), (1500, 1100)]
    sources = [random_png(w, h, seed=40 + n) for n, (w, h) in enumerate(sizes)]
    publisher_process = start_publisher_process(
        pool_bytes=8 * MiB, lease=60.0, acquire=10.0, region_bytes=1 * MiB
    )

    async def main() -> list[dict[str, int]]:
        seen = []
        async with pixelwire.Reader(timeout=20) as reader:
            for n, data in enumerate(sources):
                got = await reader.read_decoded(publisher_process.publish(data)["desc"], output="numpy")
                np.testing.assert_array_equal(got, pixelwire.decode_image(data))
                assert wait_for(lambda n=n: publisher_process.stats()["freed_by_notification"] == n + 1)
                seen.append({**reader.stats(), "regions": publisher_process.stats()["regions"]})
        return seen

    first, grown, pruned = asyncio.run(main())
    assert (first["remote_connects"], first["remote_merges"]) == (1, 0), first
    assert (grown["regions"], grown["remote_connects"], grown["remote_merges"]) == (2, 1, 1), grown
    assert (pruned["regions"], pruned["remote_connects"], pruned["remote_merges"]) == (2, 2, 1), pruned


def test_pool_regions_give_way_to_a_larger_image(random_png: Callable[..., bytes]) -> None:
    """Three mid-size images fill the cap with three regions; once they are
    released, one image larger than any region (but within the cap) must be
    served: empty regions are dropped to make room."""

    async def main() -> dict[str, int]:
        mid = random_png(4500, 3000, seed=1, noise=False)  # 40.5 MB of pixels: a 64 MiB region each
        large = random_png(6000, 4000, seed=2, noise=False)  # 72 MB: more than a region
        async with pixelwire.Publisher(pool_bytes=200 * MiB, acquire_timeout=3.0) as publisher:
            held = [await publisher.decode_and_publish(mid) for _ in range(3)]
            assert publisher.stats()["regions"] == 3
            for decoded in held:
                assert isinstance(decoded, pixelwire.Decoded)
                assert publisher.release(decoded)
            decoded = await publisher.decode_and_publish(large)
            assert isinstance(decoded, pixelwire.Decoded) and decoded.shape == (4000, 6000, 3)
            assert publisher.release(decoded)
            return publisher.stats()

    stats = asyncio.run(main())
    assert stats["registered_bytes"] <= 200 * MiB
    assert stats["bytes_in_use"] == 0


def test_a_lease_that_cannot_work_is_refused() -> None:
    """A lease of zero (or less than the read margin) would publish slots the
    reaper takes before anyone can read them."""
    for lease in (0.0, 0.05):
        with pytest.raises((ValueError, pixelwire.PixelwireError), match="lease"):
            pixelwire.Publisher(lease_seconds=lease)


def test_the_reclaim_never_comes_before_the_advertised_expiry(
    wait_for: Callable[..., bool], start_publisher_process: Callable[..., PublisherProcess]
) -> None:
    """The lease starts at publish, not at allocation: with a decode that takes
    a good part of the lease, the slot is still live until the descriptor's
    expires_at."""
    noise = np.random.default_rng(3).integers(0, 256, (5000, 5000, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(noise).save(out, "JPEG", quality=95)  # a slow decode: 75 MB of pixels
    data = out.getvalue()
    publisher_process = start_publisher_process(pool_bytes=128 * MiB, lease=1.0, acquire=10.0)
    desc = publisher_process.publish(data)["desc"]
    assert wait_for(lambda: publisher_process.stats()["reclaimed_by_lease"] == 1, 15)
    early = desc["pixelwire"]["expires_at"] - time.time()
    assert early <= 0, f"slot reclaimed {early:.3f} s before its advertised expiry"


@pytest.mark.parametrize("verify", [True, False])
def test_a_reclaimed_or_reused_slot_is_never_read_as_pixels(
    verify: bool,
    random_png: Callable[..., bytes],
    wait_for: Callable[..., bool],
    start_publisher_process: Callable[..., PublisherProcess],
) -> None:
    """With the content hash on or off, a descriptor whose slot was reclaimed
    (and scrubbed or reused) gives a typed error, never pixels, even when the
    reader's clock says the lease is still running."""
    publisher_process = start_publisher_process(pool_bytes=64 * MiB, lease=1.0, acquire=10.0)
    desc = publisher_process.publish(random_png(256, 256, seed=4))["desc"]
    assert wait_for(lambda: publisher_process.stats()["reclaimed_by_lease"] == 1, 10)
    skewed = copy.deepcopy(desc)
    skewed["pixelwire"]["expires_at"] = time.time() + 3600

    async def main() -> None:
        async with pixelwire.Reader(timeout=10, verify=verify) as reader:
            with pytest.raises(pixelwire.TransferError):
                await reader.read_decoded(skewed, output="numpy")
            publisher_process.publish(random_png(256, 256, seed=5))  # the same slot, another image
            with pytest.raises(pixelwire.TransferError):
                await reader.read_decoded(skewed, output="numpy")
            assert reader.stats()["bytes_in_use"] == 0

    asyncio.run(main())


@pytest.mark.parametrize("images", [1, 4])
def test_cancelling_a_publish_mid_decode_frees_its_slots(
    images: int, random_png: Callable[..., bytes]
) -> None:
    """A client that goes away while its image, or its request's batch of
    images, is being decoded: every slot the decode fills is freed as soon
    as it is published, not at lease end (a batch skips the images it has
    not started)."""
    sources = [random_png(3000, 2000, seed=6 + n) for n in range(images)]

    async def main() -> tuple[dict[str, int], dict[str, int]]:
        async with pixelwire.Publisher(lease_seconds=60) as publisher:
            for _attempt in range(3):
                before = publisher.stats()
                task: asyncio.Task[Any]
                if images == 1:
                    task = asyncio.create_task(publisher.decode_and_publish(sources[0]))
                else:
                    task = asyncio.create_task(publisher.decode_and_publish_many(sources))
                # Cancelled once a decode holds a slot, whatever the machine's
                # speed or load (a fixed delay could land before any decode
                # began, or after all of them ended).
                deadline = time.monotonic() + 20
                while not task.done() and publisher.stats()["slots_in_use"] == 0:
                    assert time.monotonic() < deadline, "no decode started"
                    await asyncio.sleep(0.001)
                task.cancel()
                try:
                    finished = await task
                except asyncio.CancelledError:
                    break
                # Every decode ended before the cancel landed: give the
                # images back and try again.
                for decoded in finished if isinstance(finished, list) else [finished]:
                    publisher.release(decoded)
            else:
                pytest.fail("three publishes in a row ended before their cancel")
            deadline = time.monotonic() + 20
            # The images being decoded when the cancel came are published, then freed.
            while publisher.stats()["published"] == before["published"] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            settled = 0
            while settled < 20 and time.monotonic() < deadline:
                settled = settled + 1 if publisher.stats()["slots_in_use"] == 0 else 0
                await asyncio.sleep(0.05)
            return before, publisher.stats()

    before, after = asyncio.run(main())
    published = after["published"] - before["published"]
    assert 1 <= published <= images, (before, after)
    assert after["slots_in_use"] == 0 and after["bytes_in_use"] == 0, after
    assert after["returned"] - before["returned"] == published, "freed by the cancel, not by a lease"


def test_a_cancelled_batch_stops_waiting_for_slots_and_takes_none(random_png: Callable[..., bytes]) -> None:
    """A request's batch waiting for slots in a full pool when its client
    goes away: it stops waiting at once, so a slot freed after the cancel
    goes to the next request, not to an abandoned image that would hold it
    until the whole batch had waited out its acquire timeouts."""
    holder, *sources = [random_png(1400, 1000, seed=20 + n, noise=False) for n in range(5)]  # 4.2 MB each

    async def main() -> tuple[dict[str, int], float]:
        publisher = pixelwire.Publisher(
            pool_bytes=6 * MiB, region_bytes=6 * MiB, lease_seconds=60, acquire_timeout=30
        )
        async with publisher:
            held = await publisher.decode_and_publish(holder)
            assert isinstance(held, pixelwire.Decoded)
            batch = asyncio.create_task(publisher.decode_and_publish_many(sources))
            await asyncio.sleep(0.5)  # every image of the batch is waiting for a slot
            batch.cancel()
            with pytest.raises(asyncio.CancelledError):
                await batch
            assert publisher.release(held)
            started = time.monotonic()
            after = await asyncio.wait_for(publisher.decode_and_publish(sources[0]), 20)
            waited = time.monotonic() - started
            assert isinstance(after, pixelwire.Decoded)
            assert publisher.release(after)
            return publisher.stats(), waited

    stats, waited = asyncio.run(main())
    print(f"\n  the next publish waited {waited:.3f} s for the slot")
    assert waited < 5, "the abandoned batch held the freed slot"
    assert stats["published"] == 2, "the abandoned batch published nothing"
    assert stats["slots_in_use"] == 0, stats


def test_a_read_that_fails_before_its_transfer_locks_no_receive_memory(
    growing_publisher_process: PublisherProcess, random_png: Callable[..., bytes]
) -> None:
    """Bad metadata or an address outside the frontend's memory fail before
    any byte moves: the receive slot is free again at once, and the frontend
    stays loaded for the reads that follow."""
    data = random_png(200, 100, seed=8)
    expected = pixelwire.decode_image(data)

    async def main() -> None:
        async with pixelwire.Reader(timeout=5) as reader:
            good = growing_publisher_process.publish(data)["desc"]
            np.testing.assert_array_equal(await reader.read_decoded(good, output="numpy"), expected)
            bad_metadata = copy.deepcopy(growing_publisher_process.publish(data)["desc"])
            bad_metadata["nixl_metadata"] = "b64:eJxLTEoGAAJNASc="  # zlib("abc"): not agent metadata
            bad_metadata["pixelwire"]["metadata_version"] += 1  # newer than what is loaded
            with pytest.raises(pixelwire.PixelwireError):
                await reader.read_decoded(bad_metadata, output="numpy")
            assert reader.stats()["bytes_in_use"] == 0, "a read that moved nothing holds no receive memory"
            outside = copy.deepcopy(growing_publisher_process.publish(data)["desc"])
            outside["nixl_descriptor"]["addr"] = 4096
            with pytest.raises(pixelwire.TransferError):
                await reader.read_decoded(outside, output="numpy")
            assert reader.stats()["bytes_in_use"] == 0
            assert reader.stats()["remotes"] == 1, "the frontend stays loaded"
            again = growing_publisher_process.publish(data)["desc"]
            np.testing.assert_array_equal(await reader.read_decoded(again, output="numpy"), expected)

    asyncio.run(main())


def test_a_frontend_no_read_uses_is_forgotten_and_connected_again(
    start_publisher_process: Callable[..., PublisherProcess], random_png: Callable[..., bytes]
) -> None:
    """A frontend that died (and so sends no more descriptors) is forgotten
    once no read has used it for the reader's idle limit, while a frontend
    in use stays loaded; an idle one forgotten connects again on its next
    descriptor and gives its own pixels."""
    live, dead = start_publisher_process(), start_publisher_process()
    data = random_png(64, 48, seed=21)
    expected = pixelwire.decode_image(data)

    async def read(reader: pixelwire.Reader, publisher: PublisherProcess) -> None:
        got = await reader.read_decoded(publisher.publish(data)["desc"], output="numpy")
        np.testing.assert_array_equal(got, expected)

    async def main() -> None:
        async with pixelwire.Reader(timeout=5, frontend_idle=1.0) as reader:
            await read(reader, live)
            await read(reader, dead)
            assert reader.remote_count == 2
            dead.kill()
            until = time.monotonic() + 1.6
            while time.monotonic() < until:
                await read(reader, live)
                await asyncio.sleep(0.2)
            assert reader.remote_count == 1, "the dead frontend is forgotten, the live one kept"
            await asyncio.sleep(1.2)
            assert reader.remote_count == 0, "an idle frontend is forgotten too"
            await read(reader, live)
            assert reader.remote_count == 1
            assert reader.stats()["remote_connects"] == 3, "the live frontend connected again"

    asyncio.run(main())
