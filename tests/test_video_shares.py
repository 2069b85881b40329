"""``pixelwire.video.shares``: one client's videos hold at most its share of
the decode threads, and the videos decoding at once at most their share of
the pool, so that another client's video and every image find room."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pixelwire._native import BatchControl, Cancelled, PoolExhausted
from pixelwire.video.shares import ClientShares, PoolShare


def test_a_clients_further_videos_wait_for_its_own_while_another_client_goes_on() -> None:
    """Client "a" holds its two places; its third video waits, in order,
    while client "b" gets a place at once; a place "a" gives back goes to
    its own next video, and an idle client is forgotten."""

    async def main() -> list[str]:
        shares = ClientShares(per_client=2)
        order: list[str] = []
        release = asyncio.Event()

        async def video(client: str, name: str) -> None:
            async with shares.held(client):
                order.append(f"{name} in")
                if name.startswith("a"):
                    await release.wait()
            order.append(f"{name} out")

        first = [asyncio.create_task(video("a", f"a{n}")) for n in range(3)]
        await asyncio.sleep(0.01)
        await video("b", "b0")
        assert order == ["a0 in", "a1 in", "b0 in", "b0 out"]
        release.set()
        await asyncio.gather(*first)
        assert shares.clients() == 0
        return order

    order = asyncio.run(main())
    assert order.index("a2 in") > order.index("a0 out")


def test_a_video_cancelled_while_it_waits_leaves_its_clients_places_as_they_were() -> None:
    async def main() -> None:
        shares = ClientShares(per_client=1)
        holder_done = asyncio.Event()

        async def hold() -> None:
            async with shares.held("a"):
                await holder_done.wait()

        holder = asyncio.create_task(hold())
        await asyncio.sleep(0)
        waiter = asyncio.create_task(hold())
        await asyncio.sleep(0.01)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        holder_done.set()
        await holder
        assert shares.clients() == 0
        # The place is free again: a new video of "a" gets it at once.
        async with shares.held("a"):
            pass

    asyncio.run(main())


def test_client_shares_need_a_place_each() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ClientShares(per_client=0)


def test_videos_hold_the_pool_within_their_share_and_wait_for_it() -> None:
    """A video over the whole share is refused at once; one that does not
    fit yet waits until another video's bytes come back; the wait ends with
    PoolExhausted after its timeout, or Cancelled once its request goes."""
    share = PoolShare(100)
    with pytest.raises(PoolExhausted, match="videos' share of the pool"):
        with share.taken(101, 1.0, BatchControl()):
            pass
    entered = threading.Event()
    leave = threading.Event()

    def first() -> None:
        with share.taken(60, 1.0, BatchControl()):
            entered.set()
            leave.wait(5)

    holder = threading.Thread(target=first)
    holder.start()
    entered.wait(5)
    with pytest.raises(PoolExhausted, match="stayed full"):
        with share.taken(60, 0.1, BatchControl()):
            pass
    control = BatchControl()
    threading.Timer(0.05, control.cancel).start()
    with pytest.raises(Cancelled):
        with share.taken(60, 5.0, control):
            pass
    threading.Timer(0.05, leave.set).start()
    with share.taken(60, 5.0, BatchControl()):
        assert share.held == 60
    holder.join()
    assert share.held == 0
