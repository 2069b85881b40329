"""Bounds on client connections (``pixelwire.frontend.connections``), seen
through a real frontend: a request head that trickles in is cut off, a body
slower than the minimum rate is a 408, one address cannot hold more than
its share of connections, and another client keeps being served while
20,000 slow connections are attempted."""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import stack
from frontend_client import started_frontend
from loopback_servers import Upstream


@pytest.fixture(scope="module")
def strict(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.Service]:
    """A frontend with a 1 s head timeout, a 2,000 bytes/s body rate and 20
    connections an address."""
    service = started_frontend(
        tmp_path_factory.mktemp("strict"), upstream.url,
        "--header-timeout", "1", "--min-body-rate", "2000", "--max-connections-per-client", "20",
    )  # fmt: skip
    yield service
    service.stop()


def _closed_within(connection: socket.socket, seconds: float, trickle: bytes = b"") -> tuple[bool, bytes]:
    """Sends ``trickle`` a byte every 0.2 s until the frontend closes the
    connection (True, what it answered) or ``seconds`` pass (False)."""
    connection.settimeout(0.2)
    deadline = time.monotonic() + seconds
    answer = b""
    sent = 0
    while time.monotonic() < deadline:
        try:
            if sent < len(trickle):
                connection.sendall(trickle[sent : sent + 1])
                sent += 1
            chunk = connection.recv(65536)
            if not chunk:
                return True, answer
            answer += chunk
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return True, answer
    return False, answer


def test_a_request_head_that_trickles_in_is_cut_off(strict: stack.Service) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200
    with socket.create_connection(("127.0.0.1", strict.port)) as connection:
        closed, _ = _closed_within(connection, 10, head)
    assert closed, "a head trickling for 10 s was still held (the timeout is 1 s)"
    metrics = strict.get("/metrics")
    assert stack.metric(metrics, "pixelwire_frontend_connections_closed_total", reason="header_timeout") >= 1


def test_a_body_slower_than_the_minimum_rate_is_a_408_and_the_connection_closes(
    strict: stack.Service,
) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 60000000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", strict.port)) as connection:
        connection.sendall(head)
        closed, answer = _closed_within(connection, 15, b"{" * 100)
    assert closed, "a body trickling for 15 s was still held"
    status_line = answer.split(b"\r\n", 1)[0]
    assert b" 408 " in status_line, answer[:300]
    assert "slower than 2000 bytes/s" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["message"]


def test_one_address_holds_at_most_its_share_of_connections(strict: stack.Service) -> None:
    """Past 20 connections from 127.0.0.1, more are closed at once; another
    address (127.0.0.2) is served meanwhile."""
    held = [socket.create_connection(("127.0.0.1", strict.port)) for _ in range(20)]
    try:
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", strict.port))
        with extra:
            closed, _ = _closed_within(extra, 0.9)
        assert closed, "a 21st connection from the same address was held"
        other = socket.create_connection(("127.0.0.1", strict.port), source_address=("127.0.0.2", 0))
        with other:
            other.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            _, answer = _closed_within(other, 5)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    finally:
        for connection in held:
            connection.close()
    metrics = strict.get("/metrics")
    assert (
        stack.metric(
            metrics, "pixelwire_frontend_connections_closed_total", reason="max_connections_per_client"
        )
        >= 1
    )


async def _attempt_slow_connections(port: int, attempts: int, at_once: int) -> int:
    """``attempts`` connections to ``port``, ``at_once`` at a time, each
    sending part of a request head and then nothing: how many the
    frontend closed itself."""
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
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
                if await asyncio.wait_for(reader.read(1), 1) == b"":
                    closed += 1
            except (TimeoutError, OSError):
                pass
            finally:
                writer.close()

    await asyncio.gather(*(one() for _ in range(attempts)))
    return closed


def test_a_client_is_served_while_20000_slow_connections_are_attempted(
    upstream: Upstream, tmp_path: Path
) -> None:
    """Default limits: 20,000 connections that each send half a request
    head, from one address, 1,000 open at a time, while another address
    asks for /metrics every 20 ms: every one of its requests is answered.
    Its latencies, with and without the slow connections, are printed (a
    measure, not an assertion)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the test opens 1,000 connections at once (open files: hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), hard))
    service = started_frontend(tmp_path, upstream.url)
    try:

        def victim(until: Callable[[], bool]) -> list[float]:
            took = []
            while not until():
                started = time.monotonic()
                with socket.create_connection(
                    ("127.0.0.1", service.port), timeout=30, source_address=("127.0.0.2", 0)
                ) as connection:
                    connection.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    answer = b""
                    while chunk := connection.recv(65536):
                        answer += chunk
                assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
                took.append(time.monotonic() - started)
                time.sleep(0.02)
            return took

        quiet_until = time.monotonic() + 2
        quiet = victim(lambda: time.monotonic() > quiet_until)
        result: dict[str, int] = {}

        def attack() -> None:
            result["closed"] = asyncio.run(_attempt_slow_connections(service.port, 20_000, 1000))

        attacker = threading.Thread(target=attack)
        attacker.start()
        loaded = victim(lambda: not attacker.is_alive())
        attacker.join()
        quiet_p99, loaded_p99 = (statistics.quantiles(t, n=100)[98] * 1000 for t in (quiet, loaded))
        print(
            f"\n  victim /metrics p99: {quiet_p99:.1f} ms quiet, {loaded_p99:.1f} ms during the attack "
            f"({len(loaded)} requests); {result['closed']} of 20,000 slow connections closed by the frontend"
        )
    finally:
        service.stop()
