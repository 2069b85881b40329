"""What videos may hold while they decode: their client's share of the
threads videos are decoded on, and the videos' share of the pool.

The decodes on those threads take turns (the client that has had least
decoding time goes first), but a thread is held from a video's open to its
last frame, and the pool of them is small (each may hold a decoder). Were
they handed out first come, first served, one client sending many long
videos would hold them all and another client's short clip would wait for
one of those to end; here a client's further videos wait for its own."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

from pixelwire._native import BatchControl, Cancelled, PoolExhausted

# How often a video waiting for pool space looks at its request's control.
_CANCEL_POLL = 0.05


@dataclass
class _Share:
    held: int = 0
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)


class ClientShares:
    """At most ``per_client`` decodes of one client at a time; the others
    wait, in order. Clients with nothing held or waiting are forgotten."""

    def __init__(self, per_client: int) -> None:
        if per_client < 1:
            raise ValueError(f"per_client must be at least 1, not {per_client}")
        self.per_client = per_client
        self._shares: dict[str, _Share] = {}

    def clients(self) -> int:
        """Clients holding or waiting for a share now."""
        return len(self._shares)

    @contextlib.asynccontextmanager
    async def held(self, client: str) -> AsyncIterator[None]:
        """Holds one of ``client``'s places for the ``async with`` body."""
        share = self._shares.setdefault(client, _Share())
        if share.held >= self.per_client or share.waiting:
            waiter = asyncio.get_running_loop().create_future()
            share.waiting.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    # Handed a place just as it was cancelled: pass it on.
                    self._release(client, share)
                else:
                    share.waiting.remove(waiter)
                    self._forget_if_idle(client, share)
                raise
        else:
            share.held += 1
        try:
            yield
        finally:
            self._release(client, share)

    def _release(self, client: str, share: _Share) -> None:
        while share.waiting:
            waiter = share.waiting.popleft()
            if not waiter.done():
                # The place goes straight to the next waiter: held stays.
                waiter.set_result(None)
                return
        share.held -= 1
        self._forget_if_idle(client, share)

    def _forget_if_idle(self, client: str, share: _Share) -> None:
        if share.held == 0 and not share.waiting:
            self._shares.pop(client, None)


class PoolShare:
    """The bytes of the pool videos may hold while they decode: a video's
    slot is taken before its first frame is decoded and held until its last
    is, which for a long video is minutes. Held within ``limit`` bytes (a
    share of the pool), so images, whose slots come and go in milliseconds,
    always find the rest free of videos. Taken from a decode thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held = 0
        self._changed = threading.Condition()

    @property
    def held(self) -> int:
        return self._held

    @contextlib.contextmanager
    def taken(self, size: int, timeout: float, control: BatchControl) -> Iterator[None]:
        """Holds ``size`` bytes of the share for the ``with`` body, waiting
        up to ``timeout`` seconds for them: ``PoolExhausted`` when they do
        not come (or can never fit), ``Cancelled`` once ``control`` is
        cancelled while waiting."""
        if size > self.limit:
            raise PoolExhausted(
                f"a video's frames need {size} bytes, more than the videos' share of the pool "
                f"({self.limit} bytes)"
            )
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._held + size > self.limit:
                left = deadline - time.monotonic()
                if control.cancelled:
                    raise Cancelled("the request went away while its video waited for pool space")
                if left <= 0:
                    raise PoolExhausted(
                        f"the pool's share for videos ({self.limit} bytes) stayed full for {timeout:g} s"
                    )
                self._changed.wait(min(left, _CANCEL_POLL))
            self._held += size
        try:
            yield
        finally:
            with self._changed:
                self._held -= size
                self._changed.notify_all()
