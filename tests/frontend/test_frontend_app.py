"""The frontend's application (``pixelwire.frontend.app``), seen through a
real frontend: answers relayed (streams live, redirects handed back), other
routes passed through, upstream failures answered (502, 504) and a dropped
pooled connection retried once, a request's images freed when its client
goes away, clients without the API key refused before any work, the
access log, and the metrics an alert needs shown from the start."""

from __future__ import annotations

import http.client
import json
import re
import socket
import urllib.error
import urllib.request
from pathlib import Path

import stack
from frontend_client import chat, expected, in_use, post, send, started_frontend, wait_empty
from loopback_servers import ClosingUpstream, Counting, Upstream


def test_sse_passes_through_live(frontend: stack.Service) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", frontend.port, timeout=30)
    connection.request(
        "POST", "/v1/chat/completions", body=json.dumps(chat(stack.data_url("hopper.png"), model="stream")),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    response = connection.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type", "").startswith("text/event-stream")
    events = [e for e in response.read().decode().split("\n\n") if e]
    connection.close()
    assert len(events) == 4 and events[-1] == "data: [DONE]"
    assert json.loads(events[0].removeprefix("data: "))["images"] == [expected("hopper.png")]


def test_other_routes_pass_through_with_their_status(frontend: stack.Service) -> None:
    with urllib.request.urlopen(f"{frontend.url}/v1/models?x=1", timeout=10) as response:
        assert response.status == 203
        assert json.loads(response.read()) == {"data": [{"id": "m"}], "query": "x=1"}
    try:
        urllib.request.urlopen(f"{frontend.url}/no/such/route", timeout=10)
        raise AssertionError("expected 404")
    except urllib.error.HTTPError as e:
        with e:
            assert e.code == 404


def test_a_disconnected_clients_images_are_freed_at_once(frontend: stack.Service, upstream: Upstream) -> None:
    upstream.received.clear()
    with socket.create_connection(("127.0.0.1", frontend.port)) as sock:
        body = json.dumps(chat(*[stack.data_url("hopper.png")] * 3, model="hang")).encode()
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        assert upstream.received.wait(20), "the frontend forwarded the request"
        assert in_use(frontend) > 0  # published, never read: the upstream hangs
    # The client is gone: the frontend drops the upstream request and frees
    # the images well before their 30 s lease.
    assert wait_empty(frontend, 5) == 0
    assert stack.metric(frontend.get("/metrics"), "pixelwire_frontend_released_at_request_end_total") >= 3


def test_upstream_down_is_502_and_slow_upstream_is_504(upstream: Upstream, tmp_path: Path) -> None:
    """...and the log says so in one short line (the error's type and
    text, not aiohttp's repr of its connection key)."""
    down = started_frontend(tmp_path, f"http://127.0.0.1:{stack.free_port()}", "--no-check-upstream")
    try:
        code, body = post(down, chat(stack.data_url("hopper.png")))
        assert code == 502 and "unreachable" in body["error"]["message"], body
        assert wait_empty(down, 2) == 0
        (line,) = [line for line in down.tail(200).splitlines() if "is unreachable" in line]
        assert "ClientConnectorError: " in line and "ConnectionKey" not in line and len(line) < 300, line
    finally:
        down.stop()
    slow = started_frontend(tmp_path, upstream.url, "--upstream-timeout", "1")
    try:
        code, body = post(slow, chat(stack.data_url("hopper.png"), model="hang"))
        assert code == 504 and body["error"]["type"] == "GatewayTimeoutError", body
        assert wait_empty(slow, 2) == 0
    finally:
        slow.stop()


def test_an_upstream_without_the_connector_is_a_502_for_images(tmp_path: Path) -> None:
    bare = Upstream(plugin=False)
    service = started_frontend(tmp_path, bare.url)
    try:
        code, body = post(service, chat(stack.data_url("hopper.png")))
        assert code == 502 and "VLLM_MEDIA_CONNECTOR=pixelwire" in body["error"]["message"]
        code, _ = post(service, {"model": "m", "messages": [{"role": "user", "content": "text only"}]})
        assert code == 201
        assert "does NOT run the pixelwire media connector" in service.tail(200)
        assert bare.calls == 1
    finally:
        service.stop()
        bare.close()


def test_images_refused_upstream_is_shown_at_zero_from_the_start(tmp_path: Path, upstream: Upstream) -> None:
    """An alert on its rate needs the series before the first refusal."""
    service = started_frontend(tmp_path, upstream.url)
    try:
        text = service.get("/metrics")
        for path in ("nixl", "passthrough"):
            assert f'pixelwire_frontend_images_refused_upstream_total{{path="{path}"}} 0.0' in text, text
    finally:
        service.stop()


def test_upstream_redirects_are_handed_back_not_followed(
    frontend: stack.Service, upstream: Upstream, trap: Counting
) -> None:
    upstream.redirect_to = f"{trap.url}/trap"
    status, headers, _ = send(frontend, "/redirect", method="GET")
    assert status == 307 and headers["Location"] == f"{trap.url}/trap"
    status, headers, _ = send(frontend, "/redirect", b'{"x": 1}')
    assert status == 307
    status, headers, _ = send(
        frontend, "/v1/chat/completions", chat(stack.data_url("hopper.png"), model="redirect")
    )
    assert status == 307 and headers["Location"] == f"{trap.url}/trap"
    assert trap.hits == 0
    assert wait_empty(frontend, 5) == 0


def test_a_connection_the_upstream_closed_unanswered_is_retried_once(tmp_path: Path) -> None:
    """After the upstream drops a pooled connection, the next request that
    takes it (a POST, which aiohttp never retries itself) is sent again on a
    fresh connection, not answered 502; errors never name the upstream's
    address."""
    closing = ClosingUpstream()
    service = started_frontend(tmp_path, f"http://127.0.0.1:{closing.port}", "--no-check-upstream")
    text = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    try:
        answers = [send(service, "/v1/chat/completions", text)[0] for _ in range(6)]
        assert answers == [200] * 6, answers
        assert closing.dropped >= 1, "the test must have made the upstream drop a connection"
        retries = stack.metric(service.get("/metrics"), "pixelwire_frontend_upstream_retries_total")
        assert retries == closing.dropped
    finally:
        service.stop()
        closing.close()
    down = started_frontend(tmp_path, f"http://127.0.0.1:{closing.port}", "--no-check-upstream")
    try:
        status, _, raw = send(down, "/v1/chat/completions", text)
        assert status == 502, raw
        assert str(closing.port) not in raw.decode() and "127.0.0.1" not in raw.decode()
    finally:
        down.stop()


def test_an_absolute_form_target_is_a_json_400(frontend: stack.Service, upstream: Upstream) -> None:
    seen = len(upstream.paths)
    status, headers, raw = send(frontend, f"http://127.0.0.1:{frontend.port}/v1/models", method="GET")
    assert status == 400, raw
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(raw)["error"]["type"] == "BadRequestError"
    assert len(upstream.paths) == seen


def test_a_client_without_the_api_key_costs_no_work(upstream: Upstream, tmp_path: Path) -> None:
    """With --api-key, a request without the key (or with another) is a 401
    before its body is read: nothing fetched, decoded or published, vLLM
    never asked. The key is forwarded with the request; /metrics and a GET
    of /health (probes) need none."""
    service = started_frontend(tmp_path, upstream.url, "--api-key", "right-key", "--api-key", "second-key")
    try:
        calls = upstream.calls
        body = json.dumps(chat(stack.data_url("hopper.png"))).encode()
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "right-key"}):
            connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
            connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
            response = connection.getresponse()
            answer = json.loads(response.read())
            connection.close()
            assert response.status == 401, answer
            assert answer["error"]["type"] == "AuthenticationError"
            assert response.getheader("WWW-Authenticate") == "Bearer"
        status, _, _ = send(service, "/tokenize", chat(stack.data_url("hopper.png")))
        assert status == 401  # every route, not only /v1
        metrics = service.get("/metrics")
        assert stack.metric(metrics, "pixelwire_frontend_images_total", path="nixl") == 0
        assert upstream.calls == calls
        for key in ("right-key", "second-key"):
            connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
            response = connection.getresponse()
            raw = response.read()
            connection.close()
            assert response.status == 201, raw
            assert json.loads(raw)["images"] == [expected("hopper.png")]
        assert upstream.calls == calls + 2
    finally:
        service.stop()


def test_an_options_request_goes_on_without_its_body_which_is_never_read(
    upstream: Upstream, tmp_path: Path
) -> None:
    """OPTIONS needs no API key (CORS preflights): it is forwarded with no
    body, and a body it claims is never read or parsed: a client declaring
    64 MiB and sending none gets its answer at once, then the connection
    closes."""
    service = started_frontend(tmp_path, upstream.url, "--api-key", "right-key")
    try:
        before = len(upstream.options_bodies)
        with socket.create_connection(("127.0.0.1", service.port), timeout=10) as client:
            head = "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n\r\n"
            client.sendall(head.encode() + b"{")
            reply = b""
            while chunk := client.recv(65536):  # the frontend closes the connection after its answer
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 "), reply[:200]
        assert upstream.options_bodies[before:] == [b""]
    finally:
        service.stop()


def test_image_requests_to_a_down_upstream_say_it_is_unreachable(tmp_path: Path) -> None:
    """With the upstream down, an image request is told the upstream is
    unreachable, as a text request is, not that vLLM lacks the connector."""
    down = started_frontend(tmp_path, f"http://127.0.0.1:{stack.free_port()}")
    try:
        status, body = post(down, chat(stack.data_url("hopper.png")))
        assert status == 502 and "unreachable" in body["error"]["message"], body
        assert "connector" not in body["error"]["message"]
    finally:
        down.stop()


def test_metrics_show_the_pool_capacity_and_request_seconds(frontend: stack.Service) -> None:
    """The pool's capacity beside its bytes in use, a latency histogram of
    the requests answered, by route, and help texts for every metric."""
    before = frontend.get("/metrics")
    status, _ = post(frontend, chat(stack.data_url("hopper.png")))
    assert status == 201
    with urllib.request.urlopen(f"{frontend.url}/v1/models", timeout=10) as response:
        assert response.status == 203
    after = frontend.get("/metrics")
    assert stack.metric(after, "pixelwire_frontend_pool_bytes_capacity") == 256 * 1024 * 1024  # the default
    for route in ("chat", "other"):
        count = "pixelwire_frontend_request_seconds_count"
        assert stack.metric(after, count, route=route) == stack.metric(before, count, route=route) + 1
    assert stack.metric(after, "pixelwire_frontend_request_seconds_sum", route="chat") > 0
    helps = [line for line in after.splitlines() if line.startswith("# HELP pixelwire_frontend_")]
    assert helps and all(len(line.split(" ", 3)[3]) > 20 for line in helps), helps


def test_the_access_log_has_a_line_per_request_without_body_or_key(
    upstream: Upstream, tmp_path: Path
) -> None:
    """With --access-log, each request's line says method, path, status,
    bytes, milliseconds and media count, a refused one too; the request's
    body, query and Authorization header never reach the log. Without the
    flag there is no such line."""
    service = started_frontend(tmp_path, upstream.url, "--access-log", "--api-key", "secret-key-123")
    try:
        body = chat(stack.data_url("hopper.png"), stack.data_url("flower2.jpg"))
        body["messages"][0]["content"].append({"type": "text", "text": "body-marker-456"})
        raw = json.dumps(body).encode()
        for key in ("secret-key-123", "wrong-key-789"):
            connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=30)
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            connection.request("POST", "/v1/chat/completions?q=query-marker", body=raw, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            connection.close()
        assert response.status == 401, answer
        service.stop()
        lines = [
            line
            for line in service.log.read_text().splitlines()
            if "pixelwire.frontend.access" in line and "/v1/chat" in line  # not the readiness probes
        ]
        assert len(lines) == 2, lines
        served, refused = (line.split("pixelwire.frontend.access: ", 1)[1] for line in lines)
        assert re.fullmatch(r"POST /v1/chat/completions 201 \d+ bytes [\d.]+ ms 2 media", served), served
        assert int(served.split()[3]) > 0
        assert re.fullmatch(r"POST /v1/chat/completions 401 \d+ bytes [\d.]+ ms 0 media", refused), refused
        log = service.log.read_text()
        for secret in ("secret-key-123", "wrong-key-789", "body-marker-456", "query-marker"):
            assert secret not in log
    finally:
        service.stop()
    (tmp_path / "quiet").mkdir()
    quiet = started_frontend(tmp_path / "quiet", upstream.url)
    try:
        assert post(quiet, chat(stack.data_url("hopper.png")))[0] == 201
    finally:
        quiet.stop()
    assert "pixelwire.frontend.access" not in quiet.log.read_text()


def test_a_read_failure_is_resent_once_with_fresh_references(upstream: Upstream, tmp_path: Path) -> None:
    """The plug-in's answer that it could not READ an image (nothing was
    generated) is not relayed: the request goes upstream once more with its
    image published anew (another reference), and its answer is the
    client's; a second READ failure is the client's answer, and a plug-in
    refusal of another kind is never resent. Every slot ends up free."""
    service = started_frontend(tmp_path, upstream.url)
    try:
        body = chat(stack.data_url("hopper.png"))
        upstream.read_failures = 1
        calls = upstream.calls
        status, raw = post(service, body)
        assert status == 201, raw
        assert json.loads(raw)["images"] == [expected("hopper.png")]
        assert upstream.calls == calls + 2
        first, second = (json.dumps(b["messages"]) for b in upstream.bodies[-2:])
        assert first != second, "the resent request carries a fresh reference"
        metrics = service.get("/metrics")
        assert stack.metric(metrics, "pixelwire_frontend_resent_after_read_failure_total") == 1

        upstream.read_failures = 2
        calls = upstream.calls
        status, answer = post(service, body)
        assert status == 400 and "image READ failed" in answer["error"]["message"], answer
        assert upstream.calls == calls + 2, "resent once, not more"

        upstream.refuse_with = "pixelwire: descriptor reference signature does not match"
        calls = upstream.calls
        status, answer = post(service, body)
        assert status == 400 and "signature" in answer["error"]["message"], answer
        assert upstream.calls == calls + 1
        assert wait_empty(service, 10) == 0
    finally:
        upstream.refuse_with = ""
        upstream.read_failures = 0
        service.stop()
