"""Bounds on the frontend's client connections, below aiohttp: how many
are open in all and from one address, how long a request's head may take
to arrive, and how slowly its body may come.

aiohttp holds a connection as long as its client keeps it open, and waits
for a request head or body without end: 2,000 connections that each send
one byte every 20 s are all held, and enough of them take every file
descriptor the process has. So each connection is admitted only while
the totals allow (refused ones are closed at once), a connection must
finish each request head within ``header_timeout`` of opening or of its
last answer (else it is closed), and a body must keep up
``min_body_rate`` bytes a second after a grace of ``header_timeout``
(else the request is answered 408 and the connection closed). The
process's soft limit on open files is raised to fit the connections
(:func:`make_room_for_connections`).

aiohttp's protocol for a connection (its parser, timers and a task) is made
only once the connection's first request head has arrived whole: until
then the connection costs the event loop its transport and its bytes, so
thousands of slow clients that never finish a head do not slow the loop
that serves the others.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import StreamReader

log = logging.getLogger("pixelwire.frontend")


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    max_connections_per_client: int
    header_timeout: float
    min_body_rate: int

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, not {value}")


class BodyTooSlow(Exception):
    """A request body that came slower than the minimum rate."""


class ConnectionGuard:
    """Admits, times and closes the frontend's client connections."""

    def __init__(self, limits: ConnectionLimits, on_closed: Callable[[str], None] | None = None) -> None:
        self.limits = limits
        self._on_closed = on_closed or (lambda reason: None)
        self._per_client: dict[str, int] = {}
        # Open connections' transports, with the time their current request
        # head must have arrived by (None while a request is handled).
        self._deadlines: dict[asyncio.Transport, float | None] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def open_connections(self) -> int:
        return len(self._deadlines)

    def held(self, client: str) -> int:
        """The connections ``client`` (an address) holds open."""
        return self._per_client.get(client, 0)

    def refuses(self, client: str, its_waiting: int, all_waiting: int) -> bool:
        """Whether a connection just accepted from ``client`` is over the
        limits, counting those accepted and not yet admitted (``its_waiting``
        of the client's, ``all_waiting`` in all); counted as closed if so."""
        if len(self._deadlines) + all_waiting >= self.limits.max_connections:
            self._on_closed("max_connections")
            return True
        if self._per_client.get(client, 0) + its_waiting >= self.limits.max_connections_per_client:
            self._on_closed("max_connections_per_client")
            return True
        return False

    def protocol_factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A factory for ``loop.create_server`` that guards ``inner``'s protocols."""
        return lambda: _Guarded(self, inner)

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    # -- called by the protocol wrapper and the application ---------------------------------

    def admit(self, transport: asyncio.Transport) -> bool:
        client = _client(transport)
        if len(self._deadlines) >= self.limits.max_connections:
            self._on_closed("max_connections")
            return False
        if self._per_client.get(client, 0) >= self.limits.max_connections_per_client:
            self._on_closed("max_connections_per_client")
            return False
        self._per_client[client] = self._per_client.get(client, 0) + 1
        self._deadlines[transport] = time.monotonic() + self.limits.header_timeout
        return True

    def release(self, transport: asyncio.Transport) -> None:
        if transport not in self._deadlines:
            return  # never admitted
        del self._deadlines[transport]
        client = _client(transport)
        left = self._per_client.get(client, 1) - 1
        if left > 0:
            self._per_client[client] = left
        else:
            self._per_client.pop(client, None)

    def request_started(self, transport: asyncio.Transport | None) -> None:
        """A request's head arrived on ``transport``: no head deadline while it is handled."""
        if transport in self._deadlines:
            self._deadlines[transport] = None

    def request_ended(self, transport: asyncio.Transport | None) -> None:
        """The answer is out: the next head must arrive within the timeout."""
        if transport in self._deadlines:
            self._deadlines[transport] = time.monotonic() + self.limits.header_timeout

    async def body(self, content: StreamReader) -> AsyncIterator[bytes]:
        """The chunks of a request body, as they arrive, while they keep
        up the minimum rate after the grace (raises :class:`BodyTooSlow`)."""
        started = time.monotonic()
        received = 0
        rate, grace = self.limits.min_body_rate, self.limits.header_timeout
        while True:
            # The moment the bytes so far stop being enough.
            due = started + grace + received / rate
            try:
                chunk = await asyncio.wait_for(content.readany(), max(0.0, due - time.monotonic()))
            except TimeoutError:
                self._on_closed("body_too_slow")
                raise BodyTooSlow(
                    f"the request body came slower than {rate} bytes/s ({received} bytes in "
                    f"{time.monotonic() - started:.0f} s)"
                ) from None
            if not chunk:
                return
            received += len(chunk)
            yield chunk

    async def _sweep(self) -> None:
        """Closes every connection whose request head is overdue."""
        while True:
            await asyncio.sleep(min(1.0, self.limits.header_timeout / 4))
            now = time.monotonic()
            overdue = [
                t for t, deadline in self._deadlines.items() if deadline is not None and deadline < now
            ]
            for transport in overdue:
                self._on_closed("header_timeout")
                transport.abort()


# File descriptors kept for the frontend's own use beside its client
# connections: upstream connections, fetches, NIXL, logs.
_OWN_DESCRIPTORS = 1024


def make_room_for_connections(max_connections: int) -> None:
    """Raises this process's soft limit on open files so that
    ``max_connections`` fit with room for the frontend's own; where the hard
    limit does not allow it, says what the host allows."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + _OWN_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = raised
    if soft != resource.RLIM_INFINITY and soft < wanted:
        log.warning(
            "open files are limited to %d (ulimit -n): --max-connections %d needs %d; clients past %d "
            "connections may be refused by the kernel rather than closed by the frontend (raise the hard "
            "limit or lower --max-connections)",
            soft,
            max_connections,
            wanted,
            max(0, soft - _OWN_DESCRIPTORS),
        )


def _client(transport: asyncio.Transport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


# A request head is taken to be complete at an empty line (CRLF, or the bare
# LF aiohttp's parser takes too), or once this many bytes have come without
# one (aiohttp then answers for the head's size).
_HEAD_ENDS = (b"\r\n\r\n", b"\n\n")
_HEAD_BYTES = 64 * 1024


class _Guarded(asyncio.Protocol):
    """One client connection: admitted (or closed at once) and released by
    the guard. aiohttp's protocol for it is made only once a whole request
    head has arrived: a connection that never sends one (a slow client,
    thousands at once) costs the event loop its bytes and nothing more,
    never aiohttp's per-connection handler, parser, timers and task."""

    def __init__(self, guard: ConnectionGuard, inner: Callable[[], Any]) -> None:
        self.guard = guard
        self.make_inner = inner
        self.inner: Any = None
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # a stream server's
        if not self.guard.admit(transport):
            transport.abort()
            return
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.inner is not None:
            self.inner.data_received(data)
            return
        if self.transport is None:
            return
        # The head's end may straddle two reads.
        searched = max(0, len(self.head) - 3)
        self.head += data
        if len(self.head) >= _HEAD_BYTES or any(self.head.find(end, searched) >= 0 for end in _HEAD_ENDS):
            head, self.head = bytes(self.head), bytearray()
            self.inner = self.make_inner()
            self.inner.connection_made(self.transport)
            self.inner.data_received(head)

    def eof_received(self) -> bool | None:
        if self.inner is None:
            return None  # no whole head came: close
        answer: bool | None = self.inner.eof_received()
        return answer

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return
        self.guard.release(self.transport)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()
