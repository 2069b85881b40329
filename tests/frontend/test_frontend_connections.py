"""Bounds on client connections (``pixelwire.frontend.connections``), seen
through a real frontend: a request head that trickles in is cut off, a body
slower than the minimum rate is a 408, one address cannot hold more than
its share of connections, and another client keeps being served while
20,000 slow connections are attempted."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import stack
from frontend_client import p99_ms, started_frontend, victim_rounds
from loopback_servers import Upstream

# The victim connects from another loopback address: another client.
VICTIM_ADDRESS = "127.0.0.2"
# The bound is 2x the p99 without slow connections at the frontend;
# the rest is room for a shared CI machine.
RATIO_BOUND = 2.5


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
    # Read from the other address's answer: 127.0.0.1's closed connections
    # may not all be released yet.
    metrics = answer.split(b"\r\n\r\n", 1)[1].decode()
    assert (
        stack.metric(
            metrics, "pixelwire_frontend_connections_closed_total", reason="max_connections_per_client"
        )
        >= 1
    )


def _slow_clients(*args: str) -> subprocess.Popen[str]:
    script = Path(__file__).with_name("slow_clients.py")
    return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, text=True)


def _served_during(
    service: stack.Service, clip: bytes, port: int
) -> tuple[dict[str, list[tuple[float, float]]], dict[str, float]]:
    """The victim's rounds while 20,000 slow connections, 1,000 at a time,
    go to ``port``; what the slow clients printed."""
    attacker = _slow_clients(str(port), "20000", "1000")
    spans: dict[str, list[tuple[float, float]]] = {"video": [], "image": []}
    while attacker.poll() is None:
        for kind, more in victim_rounds(service, clip, VICTIM_ADDRESS, rounds=1).items():
            spans[kind] += more
    return spans, json.loads(attacker.communicate(timeout=60)[0])


def test_a_client_is_served_while_20000_slow_connections_are_attempted(
    upstream: Upstream, video_bomb: dict[str, bytes], tmp_path: Path
) -> None:
    """Default limits: 20,000 connections that each send half a request
    head, from one address, 1,000 open at a time (slow_clients.py, a
    process of its own), while another address sends a 640x480 photo and a
    5 s 720p video, one after the other: every one of its requests is
    answered, and each kind's p99 stays within RATIO_BOUND of its p99 while
    the same slow clients go to a server that is not the frontend (the
    control: on a machine of two cores, their own process alone costs the
    victim as much as a process spinning on a core does). The p99s without
    any slow clients are printed beside them."""
    video_kwargs = json.dumps({"video": {"video_backend": "opencv", "num_frames": 8}})
    service = started_frontend(tmp_path, upstream.url, "--media-io-kwargs", video_kwargs)
    clip = video_bomb["h264_720p_5s.mp4"]
    sink = _slow_clients("sink")
    try:
        assert sink.stdout is not None
        sink_port = int(sink.stdout.readline())
        victim_rounds(service, clip, VICTIM_ADDRESS, rounds=1)  # NIXL's connection is set up
        quiet = victim_rounds(service, clip, VICTIM_ADDRESS, rounds=4)
        control, _ = _served_during(service, clip, sink_port)
        loaded, attack = _served_during(service, clip, service.port)
    finally:
        sink.kill()
        sink.communicate()
        service.stop()
    ratios = {kind: p99_ms(loaded[kind]) / p99_ms(control[kind]) for kind in loaded}
    print(
        "\n  victim p99 quiet/control/loaded "
        + ", ".join(
            f"{kind} {p99_ms(quiet[kind]):.0f}/{p99_ms(control[kind]):.0f}/{p99_ms(loaded[kind]):.0f} ms "
            f"(loaded: {ratios[kind]:.2f}x the control, "
            f"{p99_ms(loaded[kind]) / p99_ms(quiet[kind]):.2f}x quiet)"
            for kind in loaded
        )
        + f"; {len(loaded['video'])} rounds loaded; {attack['closed']} of 20,000 slow connections closed "
        f"by the frontend, in {attack['seconds']:.0f} s"
    )
    assert all(loaded.values()), "the slow connections were over before the victim's first answer"
    assert max(ratios.values()) <= RATIO_BOUND, ratios
