"""The frontend's half of the handshake (``pixelwire.frontend.upstream_watch``),
through a real frontend in front of a fake vLLM whose /metrics the test
controls: each disagreement refuses image requests with a 502 naming the
setting on each side, logs one line per change, shows on /health and the
metrics, and ends as soon as the worker is fixed; a plug-in refusal makes
the frontend look again at once. Mistakes in how the two are set up are
said at start, once in the log and in each image request's answer, with
the fix: an upstream whose /metrics is not vLLM's (a router, a load
balancer that hides it, another server), a worker-mode frontend in front
of a vLLM without the plug-in, an API key vLLM would refuse, an upstream
that does not answer; behind a router, ``--upstream-metrics`` names the
vLLM servers' pages."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pixelwire.resize import image_resize_policy
from pixelwire.signing import secret_fingerprint

import stack
from frontend_client import SECRET, chat, expected, post, started_frontend
from loopback_servers import INFO, VLLM_METRICS, Upstream, worker_info

TEXT = {"model": "m", "messages": [{"role": "user", "content": "text only"}]}
QWEN = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2,
        "min_pixels": 3136, "max_pixels": 12845056, "resample": 3}  # fmt: skip


@pytest.fixture
def worker() -> Iterator[Upstream]:
    """A fake vLLM of this test's own, since the test changes what it declares."""
    u = Upstream()
    yield u
    u.close()


def _model(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    (folder / "preprocessor_config.json").write_text(json.dumps(QWEN))
    return folder


def _health(service: stack.Service) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{service.url}/health", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def _until(check: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.1)


def _cases(tmp_path: Path) -> dict[str, tuple[list[str], str, str]]:
    """Each disagreement: the frontend's options, the worker's info line, and
    what the refusal says (the setting with each side's value)."""
    model = _model(tmp_path)
    policy = image_resize_policy(model)
    assert policy is not None
    kwargs = {"max_pixels": 1 << 20}
    other = image_resize_policy(model, kwargs)
    assert other is not None
    return {
        "secret": ([], worker_info(secret="0123456789abcdef"),
                   f"PIXELWIRE_SECRET differs: frontend fingerprint {secret_fingerprint(SECRET)}, "
                   "worker 0123456789abcdef"),
        "version": ([], worker_info(version="0.0.1"), "worker 0.0.1"),
        "model": (["--model", str(model)], worker_info(), "no resize policy"),
        "kwargs": (["--model", str(model), "--mm-processor-kwargs", json.dumps(kwargs)],
                   worker_info(resize=policy.identity),
                   f"this frontend resizes for {other.identity} (--model, --mm-processor-kwargs), the worker "
                   f"for {policy.identity}"),
        "private": (["--decode-at", "worker", "--allow-private"], worker_info(private="0"),
                    "PIXELWIRE_ALLOW_PRIVATE differs"),
    }  # fmt: skip


def _fixed(case: str, tmp_path: Path) -> str:
    """The info line of the same worker, fixed to agree."""
    model = _model(tmp_path)
    if case in ("model", "kwargs"):
        policy = image_resize_policy(model, {"max_pixels": 1 << 20} if case == "kwargs" else None)
        assert policy is not None
        return worker_info(resize=policy.identity)
    return worker_info(private="1") if case == "private" else INFO


@pytest.mark.parametrize("case", ["secret", "version", "model", "kwargs", "private"])
def test_a_disagreeing_worker_refuses_images_until_it_is_fixed(
    case: str, worker: Upstream, tmp_path: Path
) -> None:
    args, info, words = _cases(tmp_path)[case]
    worker.metrics_text = info
    service = started_frontend(tmp_path, worker.url, *args)
    try:
        url = stack.data_url("hopper.png")
        for _ in range(3):
            status, body = post(service, chat(url))
            assert status == 502 and words in body["error"]["message"], body
            assert body["error"]["type"] == "BadGatewayError"
        assert worker.calls == 0, "nothing reached vLLM"
        status, _ = post(service, TEXT)
        assert status == 201, "text requests still go through"
        lines = service.tail(400).splitlines()
        disagreeing = [line for line in lines if "disagrees with this frontend" in line]
        assert len(disagreeing) == 1 and words in disagreeing[0], disagreeing
        status, health = _health(service)
        assert status == 200, "the status is vLLM's own"
        handshake = health["handshake"]
        assert handshake["agreement"] is False and handshake["plugin_seen"] is True
        (mismatch,) = handshake["mismatches"]
        setting = "resize" if case in ("model", "kwargs") else case
        assert mismatch["setting"] == setting and words in mismatch["message"]
        metrics = service.get("/metrics")
        assert stack.metric(metrics, "pixelwire_frontend_upstream_agreement") == 0
        assert stack.metric(metrics, "pixelwire_frontend_upstream_mismatch", setting=setting) == 1
        # The worker is fixed (restarted with the frontend's settings): an
        # image request a moment later (HANDSHAKE_RECHECK_AGE) is served,
        # not one a periodic check later.
        worker.metrics_text = _fixed(case, tmp_path)
        time.sleep(0.3)
        status, raw = post(service, chat(url))
        assert status == 201, raw
        if case != "private":
            read = json.loads(raw)["images"][0]
            assert "sha" in read
        assert "agrees with this frontend" in service.tail(400)
        metrics = service.get("/metrics")
        assert stack.metric(metrics, "pixelwire_frontend_upstream_agreement") == 1
        assert stack.metric(metrics, "pixelwire_frontend_upstream_mismatch", setting=setting) == 0
        assert _health(service)[1]["handshake"]["mismatches"] == []
    finally:
        service.stop()


def test_a_plugin_refusal_makes_the_frontend_look_again_at_once(worker: Upstream, tmp_path: Path) -> None:
    """The worker restarts with another secret while the frontend agrees
    with its old one: the first refusal (a 400 from the plug-in) goes back to
    the client and counts as refused, and the frontend checks at once, not
    at its next periodic check (30 s)."""
    service = started_frontend(tmp_path, worker.url)
    try:
        url = stack.data_url("hopper.png")
        status, raw = post(service, chat(url))
        assert status == 201 and json.loads(raw)["images"] == [expected("hopper.png")]
        worker.metrics_text = worker_info(secret="fedcba9876543210")
        worker.refuse_with = "pixelwire: descriptor reference signature does not match"
        status, body = post(service, chat(url))
        assert status == 400 and "signature" in body["error"]["message"]
        metrics = service.get("/metrics")
        assert stack.metric(metrics, "pixelwire_frontend_images_refused_upstream_total", path="nixl") == 1
        mismatch = "pixelwire_frontend_upstream_mismatch"
        _until(lambda: stack.metric(service.get("/metrics"), mismatch, setting="secret") == 1, within=5)
        status, body = post(service, chat(url))
        assert status == 502 and "PIXELWIRE_SECRET differs" in body["error"]["message"]
    finally:
        service.stop()


def _silent_until_seen(worker: Upstream, tmp_path: Path) -> stack.Service:
    """A frontend whose looks at a worker not answering /metrics go on
    (every HANDSHAKE_RETRY), started."""
    worker.metrics_silent = True
    service = started_frontend(tmp_path, worker.url)
    worker.metrics_dropped.clear()
    assert worker.metrics_dropped.wait(10)
    return service


def test_a_worker_answering_just_after_a_silent_look_is_served(worker: Upstream, tmp_path: Path) -> None:
    """vLLM starts listening once it is ready: a look that found nothing a
    moment before an image request (well within HANDSHAKE_RECHECK_AGE) must
    not refuse it "unreachable" when vLLM answers now."""
    service = _silent_until_seen(worker, tmp_path)
    try:
        url = stack.data_url("hopper.png")
        worker.metrics_dropped.clear()
        assert worker.metrics_dropped.wait(10)
        worker.metrics_silent = False
        status, raw = post(service, chat(url))
        assert status == 201, raw
        assert json.loads(raw)["images"] == [expected("hopper.png")]
    finally:
        service.stop()


def test_a_look_begun_before_a_request_does_not_refuse_it(worker: Upstream, tmp_path: Path) -> None:
    """A look at the worker in flight when an image request comes (held
    here past HANDSHAKE_RECHECK_AGE, then unanswered) is not the request's
    answer: once it ends, the request waits for a look of its own, which
    finds the worker answering."""
    service = _silent_until_seen(worker, tmp_path)
    try:
        url = stack.data_url("hopper.png")
        gate = threading.Event()
        worker.hold_next_metrics(gate)
        assert worker.metrics_held.wait(10), "the next periodic look is held"
        worker.metrics_silent = False
        outcome: list[tuple[int, Any]] = []
        request = threading.Thread(target=lambda: outcome.append(post(service, chat(url))))
        request.start()
        time.sleep(0.5)
        gate.set()
        request.join(30)
        ((status, raw),) = outcome
        assert status == 201, raw
        assert json.loads(raw)["images"] == [expected("hopper.png")]
        assert stack.metric(service.get("/metrics"), "pixelwire_frontend_upstream_agreement") == 1
    finally:
        service.stop()


def test_health_is_answered_by_the_frontend(worker: Upstream, tmp_path: Path) -> None:
    """GET /health carries vLLM's own status and the handshake's state; with
    vLLM down it is a 502 saying so."""
    service = started_frontend(tmp_path, worker.url)
    try:
        _until(lambda: _health(service)[1]["handshake"]["agreement"] is True)
        status, health = _health(service)
        assert status == 200
        assert health["upstream"] == {"reachable": True, "health_status": 200}
        assert health["decode_at"] == "frontend"
        assert health["handshake"]["plugin_seen"] is True and health["handshake"]["connector"] == "pixelwire"
        worker.health_status = 503
        assert _health(service)[0] == 503
    finally:
        service.stop()
    down = started_frontend(tmp_path, f"http://127.0.0.1:{stack.free_port()}")
    try:
        status, health = _health(down)
        assert status == 502 and health["upstream"]["reachable"] is False
        assert health["handshake"]["agreement"] is False
        assert stack.metric(down.get("/metrics"), "pixelwire_frontend_upstream_agreement") == 0
    finally:
        down.stop()


def _logged(service: stack.Service, words: str) -> list[str]:
    """The frontend's log lines holding ``words``."""
    return [line for line in service.tail(400).splitlines() if words in line]


@pytest.mark.parametrize("case", ["metrics-hidden", "not-vllm"])
def test_an_upstream_whose_metrics_are_not_vllms_is_named_at_start_with_the_fix(
    case: str, worker: Upstream, tmp_path: Path
) -> None:
    """A load balancer that keeps /metrics to itself (404), or a server that
    is not vLLM (a page without vLLM's metrics, as an --upstream of the
    wrong port or path finds): one log line at start, before any request,
    and each image request's 502 says what --upstream must be and how to
    point the check at vLLM's /metrics, never "unreachable"."""
    if case == "metrics-hidden":
        worker.metrics_status = 404
    else:
        worker.metrics_text = "<html><body>a web server</body></html>"
    service = started_frontend(tmp_path, worker.url)
    try:
        _until(lambda: _logged(service, "--upstream-metrics"))
        for _ in range(2):
            status, body = post(service, chat(stack.data_url("hopper.png")))
            assert status == 502, body
            message = body["error"]["message"]
            assert "unreachable" not in message, message
            assert "without /v1" in message and "--upstream-metrics" in message, message
        assert worker.calls == 0, "nothing reached the upstream"
        assert len(_logged(service, "--upstream-metrics")) == 1, "said once"
        handshake = _health(service)[1]["handshake"]
        assert handshake["agreement"] is False and "--upstream-metrics" in handshake["problem"]
        assert stack.metric(service.get("/metrics"), "pixelwire_frontend_upstream_agreement") == 0
    finally:
        service.stop()


def test_behind_a_router_the_handshake_reads_the_vllm_servers_named(worker: Upstream, tmp_path: Path) -> None:
    """--upstream is a router whose /metrics is its own (here 404), and
    --upstream-metrics names each vLLM server's page: a server that
    disagrees refuses image requests naming the setting; once each agrees,
    image requests go through the router."""
    router = Upstream()
    router.metrics_status = 404
    other = Upstream()
    other.metrics_text = worker_info(secret="0123456789abcdef")
    pages = ["--upstream-metrics", f"{worker.url}/metrics", "--upstream-metrics", f"{other.url}/metrics/"]
    service = started_frontend(tmp_path, router.url, *pages)
    try:
        url = stack.data_url("hopper.png")
        status, body = post(service, chat(url))
        assert status == 502 and "PIXELWIRE_SECRET differs" in body["error"]["message"], body
        assert other.url in _logged(service, "disagrees with this frontend")[0]
        other.metrics_text = INFO
        time.sleep(0.3)
        status, raw = post(service, chat(url))
        assert status == 201, raw
        assert json.loads(raw)["images"] == [expected("hopper.png")]
        assert (router.calls, worker.calls, other.calls) == (1, 0, 0), "images go through the router"
    finally:
        service.stop()
        router.close()
        other.close()


def test_worker_mode_in_front_of_a_vllm_without_the_plugin_refuses_images(tmp_path: Path) -> None:
    """With --decode-at worker the plug-in fetches and decodes the URLs the
    frontend passes on; a vLLM without it would load them with its own
    loader: said once at start and in each image request's 502, with both
    fixes; --no-check-upstream passes them on anyway."""
    bare = Upstream(plugin=False)
    assert "vllm:" in VLLM_METRICS
    (tmp_path / "checked").mkdir()
    (tmp_path / "unchecked").mkdir()
    service = started_frontend(tmp_path / "checked", bare.url, "--decode-at", "worker")
    unchecked = started_frontend(
        tmp_path / "unchecked", bare.url, "--decode-at", "worker", "--no-check-upstream"
    )
    try:
        url = stack.data_url("hopper.png")
        _until(lambda: _logged(service, "does NOT run the pixelwire media connector"))
        status, body = post(service, chat(url))
        message = body["error"]["message"]
        assert status == 502 and "VLLM_MEDIA_CONNECTOR=pixelwire" in message, body
        assert "--no-check-upstream" in message
        assert bare.calls == 0
        assert len(_logged(service, "does NOT run the pixelwire media connector")) == 1
        metrics = service.get("/metrics")
        assert stack.metric(metrics, "pixelwire_frontend_upstream_mismatch", setting="connector") == 1
        status, raw = post(unchecked, chat(url))
        assert status == 201 and json.loads(raw)["images"] == [{"url": url[:40]}], raw
    finally:
        service.stop()
        unchecked.stop()
        bare.close()


@pytest.mark.parametrize("case", ["frontend-without-a-key", "another-key"])
def test_an_api_key_vllm_would_refuse_is_said_at_start_and_no_image_work_is_done(
    case: str, worker: Upstream, tmp_path: Path
) -> None:
    """vLLM with --api-key: a frontend without a key (it would fetch and
    decode images for any client, whom vLLM then refuses), or with a key
    vLLM refuses (every request fails there): one log line at start, and
    each image request's 502 names --api-key, before any fetch or decode;
    text requests get vLLM's own answer. Once vLLM takes the key, images
    are served."""
    worker.api_keys = ["vllm-key"]
    args, client_key = (
        ([], "vllm-key") if case == "frontend-without-a-key" else (["--api-key", "mine"], "mine")
    )
    service = started_frontend(tmp_path, worker.url, *args)
    try:
        url = stack.data_url("hopper.png")
        _until(lambda: _logged(service, "--api-key"))
        for _ in range(2):
            status, body = post(service, chat(url), api_key=client_key)
            assert status == 502 and "--api-key" in body["error"]["message"], body
        assert worker.calls == 0, "nothing was sent upstream for the image request"
        metrics = service.get("/metrics")
        assert stack.metric(metrics, "pixelwire_frontend_upstream_mismatch", setting="api_key") == 1
        if case == "another-key":
            assert post(service, TEXT, api_key=client_key)[0] == 401, "vLLM's own answer"
        assert len(_logged(service, "--api-key")) == 1, "said once"
        worker.api_keys = [] if case == "frontend-without-a-key" else ["vllm-key", "mine"]
        time.sleep(0.3)
        status, raw = post(service, chat(url), api_key=client_key)
        assert status == 201, raw
        assert json.loads(raw)["images"] == [expected("hopper.png")]
    finally:
        service.stop()


def test_an_upstream_that_does_not_answer_is_logged_once_in_a_short_line(tmp_path: Path) -> None:
    """vLLM not up yet (or a wrong port): one warning at start, a line
    without aiohttp's long reprs, however many looks and image requests
    follow; each image request's 502 says it does not answer."""
    service = started_frontend(tmp_path, f"http://127.0.0.1:{stack.free_port()}")
    try:
        _until(lambda: _logged(service, "does not answer"))
        for _ in range(3):
            status, body = post(service, chat(stack.data_url("hopper.png")))
            assert status == 502 and "unreachable" in body["error"]["message"], body
        (line,) = _logged(service, "does not answer")
        assert "ConnectionKey" not in line and len(line) < 400, line
    finally:
        service.stop()
