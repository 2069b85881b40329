"""The frontend's accept loop (``pixelwire.frontend.accept``), in process:
connections waiting in the kernel are set up a batch a turn, those of the
client holding the fewest connections first, whatever order they came in."""

from __future__ import annotations

import asyncio
import socket

from pixelwire.frontend.accept import FairAccept


class _Recorded(asyncio.Protocol):
    def __init__(self, order: list[str]) -> None:
        self.order = order

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.order.append(transport.get_extra_info("peername")[0])


async def _set_up_order(first: int, then: int, held: dict[str, int], limit: int = 10_000) -> list[str]:
    """The order in which ``first`` connections from 127.0.0.1 and then
    ``then`` from 127.0.0.2, all waiting in the kernel before the accept
    loop starts, are set up, the clients said to hold ``held`` already and
    each allowed ``limit`` (those over it are refused)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=first + then)
    port = listener.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(first)]
    clients += [
        socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)) for _ in range(then)
    ]
    order: list[str] = []
    refused: list[str] = []

    def refuses(client: str, its_waiting: int, all_waiting: int) -> bool:
        if held.get(client, 0) + its_waiting >= limit:
            refused.append(client)
            return True
        return False

    accepting = FairAccept([listener], lambda: _Recorded(order), lambda c: held.get(c, 0), refuses, 8, 4096)
    accepting.start()
    try:
        for _ in range(200):
            if len(order) + len(refused) == first + then:
                break
            await asyncio.sleep(0.01)
    finally:
        accepting.close()
        listener.close()
        for client in clients:
            client.close()
    return order


def test_a_client_holding_few_connections_is_set_up_before_a_burst_from_one_holding_many() -> None:
    order = asyncio.run(_set_up_order(200, 2, held={"127.0.0.1": 1000}))
    assert len(order) == 202
    assert order[:2] == ["127.0.0.2", "127.0.0.2"], order[:10]


def test_one_clients_waiting_connections_count_against_its_later_ones() -> None:
    """Two clients holding nothing: the one with 100 connections waiting
    has them set up in turn with the other's three, not all before them."""
    order = asyncio.run(_set_up_order(100, 3, held={}))
    assert len(order) == 103
    assert order[:6] == ["127.0.0.1", "127.0.0.2"] * 3, order[:10]


def test_connections_over_a_clients_limit_are_closed_as_accepted_never_set_up() -> None:
    """A client allowed 10 and holding none: of its 30 waiting, 10 are set
    up; the other client's are set up too."""
    order = asyncio.run(_set_up_order(30, 2, held={}, limit=10))
    assert order.count("127.0.0.1") == 10 and order.count("127.0.0.2") == 2, order
