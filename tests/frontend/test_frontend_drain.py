"""A `pixelwire frontend` stopped with SIGTERM (pixelwire.frontend.drain):
its /health turns 503 at once while it keeps serving, a second SIGTERM
makes it stop listening, and a request in flight (its image still unread in
the pool) finishes with the right pixels before the process exits 0; an
idle frontend stops without waiting out its drain.

Each step waits for an event (the upstream holds a request until the test
releases it; the drain's own window is far longer than the test), never
for a time."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import stack
from frontend_client import chat, expected, post, send, started_frontend
from loopback_servers import Upstream

STEP_SECONDS = 30.0


def _health(service: stack.Service) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"{service.url}/health", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def _until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + STEP_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, f"not within {STEP_SECONDS:g} s: {what}"
        time.sleep(0.05)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_sigterm_drains_then_finishes_the_requests_in_flight(upstream: Upstream, tmp_path: Path) -> None:
    """SIGTERM: /health 503 {"draining": true} and the draining gauge at 1,
    requests still served (each answer closes its connection); a second
    SIGTERM: no more listening, but the held request's image is still
    published and READ right once released; then exit 0."""
    service = started_frontend(tmp_path, upstream.url, "--drain-seconds", "3600")
    try:
        assert _health(service)[0] == 200
        held: dict[str, Any] = {}
        upstream.received.clear()
        body = chat(stack.data_url("hopper.png"), model="held")
        in_flight = threading.Thread(target=lambda: held.update(answer=post(service, body)), daemon=True)
        in_flight.start()
        _until(upstream.received.is_set, "the held request reached the upstream")

        service.process.send_signal(signal.SIGTERM)
        _until(lambda: _health(service)[0] == 503, "/health answers 503 after SIGTERM")
        assert _health(service) == (503, {"draining": True})
        assert stack.metric(service.get("/metrics"), "pixelwire_frontend_draining") == 1

        status, headers, body = send(service, "/v1/chat/completions", chat(stack.data_url("hopper.png")))
        assert status == 201, body
        assert json.loads(body)["images"] == [expected("hopper.png")]
        assert headers.get("Connection", "").lower() == "close", headers

        service.process.send_signal(signal.SIGTERM)
        _until(lambda: not _listening(service.port), "the frontend stops listening after a second SIGTERM")
        assert service.process.poll() is None, "a request is still in flight: the frontend must wait"

        upstream.release()
        in_flight.join(STEP_SECONDS)
        status, answer = held["answer"]
        assert status == 201, answer
        assert json.loads(answer)["images"] == [expected("hopper.png")]
        assert service.process.wait(timeout=STEP_SECONDS) == 0
        assert "stopped" in service.tail()
    finally:
        upstream.release()
        service.stop()


def test_an_idle_frontend_stops_soon_after_sigterm(upstream: Upstream, tmp_path: Path) -> None:
    """No request in flight and none coming (a load balancer's /health
    probes aside): the drain ends after DRAIN_IDLE_SECONDS, not after
    --drain-seconds."""
    service = started_frontend(tmp_path, upstream.url, "--drain-seconds", "3600")
    try:
        assert _health(service)[0] == 200
        service.process.send_signal(signal.SIGTERM)
        probes = 0

        def probed_until_gone() -> bool:
            nonlocal probes
            try:
                probes += 1
                _health(service)
            except (OSError, ValueError):
                pass  # it stopped listening, or closed the connection mid-answer
            return service.process.poll() is not None

        _until(probed_until_gone, "the idle frontend exits, probed every 50 ms meanwhile")
        assert service.process.wait(timeout=STEP_SECONDS) == 0 and probes > 10
        assert "the drain ends early" in service.tail()
    finally:
        service.stop()
