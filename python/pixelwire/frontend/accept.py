"""The frontend's accept loop: client connections taken from the kernel at
once and set up a few at a time, those of the clients holding the fewest
connections first.

asyncio accepts connections in the order they came, and sets each one up
(a task, a transport, the protocol) before the loop turns to anything
else it has to do: behind a burst of a thousand slow clients' connections
from one address, another client's connection waited for all of them to
be set up, and its request's next steps waited behind each further burst.
Here a ready listener is drained at once (an ``accept`` is a few
microseconds), the accepted sockets wait in a queue ordered by how many
connections their client holds, and each turn of the loop sets up at
most ``batch`` of them, so another client's connection is set up next and
its requests go on between the batches.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import socket
from collections.abc import Callable

log = logging.getLogger("pixelwire.frontend")

# After the process runs out of file descriptors, how long accepting pauses
# (as asyncio's own accept loop does).
_RETRY_SECONDS = 1.0


class FairAccept:
    """Accepts ``listeners``' connections for ``factory``'s protocols.
    ``held(address)`` says how many connections a client address holds;
    ``refuses(address, its_waiting, all_waiting)`` whether one more from it
    is over the limits, with those accepted and not yet set up: such a
    connection is closed as it is accepted, before anything is made for it."""

    def __init__(
        self,
        listeners: list[socket.socket],
        factory: Callable[[], asyncio.Protocol],
        held: Callable[[str], int],
        refuses: Callable[[str, int, int], bool],
        batch: int,
        most_waiting: int,
    ) -> None:
        self.listeners = listeners
        self.factory = factory
        self.held = held
        self.refuses = refuses
        self.batch = batch
        self.most_waiting = most_waiting
        self._loop = asyncio.get_running_loop()
        # (connections its client held and had waiting, order of arrival, socket, client)
        self._waiting: list[tuple[int, int, socket.socket, str]] = []
        self._waiting_from: dict[str, int] = {}
        self._arrival = itertools.count()
        self._setting_up = False
        self._tasks: set[asyncio.Task[object]] = set()

    def start(self) -> None:
        for listener in self.listeners:
            listener.setblocking(False)
            self._loop.add_reader(listener.fileno(), self._accept, listener)

    def close(self) -> None:
        for listener in self.listeners:
            self._loop.remove_reader(listener.fileno())
        for _, _, connection, _ in self._waiting:
            connection.close()
        self._waiting.clear()
        self._waiting_from.clear()

    def _accept(self, listener: socket.socket) -> None:
        """Takes every connection the kernel holds for ``listener`` (up to
        ``most_waiting`` waiting to be set up)."""
        while len(self._waiting) < self.most_waiting:
            try:
                connection, address = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                break
            except OSError as error:
                # Out of file descriptors (or memory): stop for a while
                # rather than spin on a listener that stays ready.
                log.warning("accepting connections paused for %.0f s: %s", _RETRY_SECONDS, error)
                self._loop.remove_reader(listener.fileno())
                self._loop.call_later(_RETRY_SECONDS, self._resume, listener)
                break
            client = str(address[0]) if isinstance(address, tuple) and address else "?"
            its_waiting = self._waiting_from.get(client, 0)
            if self.refuses(client, its_waiting, len(self._waiting)):
                connection.close()
                continue
            ahead = self.held(client) + its_waiting
            self._waiting_from[client] = its_waiting + 1
            heapq.heappush(self._waiting, (ahead, next(self._arrival), connection, client))
        if self._waiting and not self._setting_up:
            self._setting_up = True
            self._loop.call_soon(self._set_up)

    def _resume(self, listener: socket.socket) -> None:
        if listener.fileno() >= 0:
            self._loop.add_reader(listener.fileno(), self._accept, listener)

    def _set_up(self) -> None:
        """Sets up at most ``batch`` waiting connections, fewest held first;
        the rest on the loop's next turn."""
        for _ in range(min(self.batch, len(self._waiting))):
            _, _, connection, client = heapq.heappop(self._waiting)
            left = self._waiting_from[client] - 1
            if left:
                self._waiting_from[client] = left
            else:
                del self._waiting_from[client]
            task = self._loop.create_task(self._connect(connection))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._waiting:
            self._loop.call_soon(self._set_up)
        else:
            self._setting_up = False
            # The listeners may have more than most_waiting had room for.
            for listener in self.listeners:
                self._accept(listener)

    async def _connect(self, connection: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self.factory, connection)
        except OSError:
            connection.close()  # gone before it was set up
