"""Slow clients, run as a process of their own (so that their event loop
shares no interpreter with the client they are measured against):
``python slow_clients.py PORT ATTEMPTS AT_ONCE`` opens ``ATTEMPTS``
connections to ``PORT`` on 127.0.0.1, ``AT_ONCE`` at a time, each sending
part of a request head and then nothing for up to a second, and prints,
as JSON, how many the server closed itself and how long the run took.

``python slow_clients.py sink`` is a server for them that is not the
frontend (a control: the same clients, the machine as busy, the frontend
left alone): it prints its port, then holds each connection until its
client closes it."""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time

HALF_A_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le"


async def attempt(port: int, attempts: int, at_once: int) -> int:
    """How many of the connections the frontend closed (or refused) itself."""
    closed = 0
    gate = asyncio.Semaphore(at_once)

    async def one() -> None:
        nonlocal closed
        async with gate:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                closed += 1
                return
            try:
                writer.write(HALF_A_HEAD)
                if await asyncio.wait_for(reader.read(1), 1) == b"":
                    closed += 1
            except (TimeoutError, OSError):
                pass
            finally:
                writer.close()

    await asyncio.gather(*(one() for _ in range(attempts)))
    return closed


async def sink() -> None:
    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(65536):
            pass
        writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", 0, backlog=4096)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


def main() -> None:
    if sys.argv[1:] == ["sink"]:
        resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1:] * 2)
        asyncio.run(sink())
        return
    port, attempts, at_once = (int(arg) for arg in sys.argv[1:4])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, at_once + 256)), hard))
    started = time.monotonic()
    closed = asyncio.run(attempt(port, attempts, at_once))
    print(json.dumps({"closed": closed, "seconds": time.monotonic() - started}))


if __name__ == "__main__":
    main()
