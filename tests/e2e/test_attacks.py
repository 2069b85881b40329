"""Attacks on a real vLLM behind the real pixelwire frontend (``make
test-vllm``).

One vLLM with the pixelwire connector (``PIXELWIRE_SECRET``,
``PIXELWIRE_ALLOW_PRIVATE=1`` so that its own guard lets everything local
through: only the frontend's guard stands between a client and the
loopback) and a second one started with ``--trust-request-mm-kwargs``
(per-request ``media_io_kwargs`` enabled), frontends in front of them, a
local image server, and a TRAP: a local HTTP server that counts every
request, on any path, and that no test may ever make anyone reach. Every
test ends with the trap untouched; the refused references and images must
not give pixels (a 400, and no NIXL read counted by the worker).

The references a frontend mints are made here by a Publisher in the test
process signed with the deployment's secret: the test plays a frontend, so
a genuine reference can be replayed, altered, re-signed or left to expire.
"""

from __future__ import annotations

import asyncio
import http.client
import http.server
import itertools
import json
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import hostile_media
import pytest

import stack
import video_turns

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PNG = "hopper.png"
PNG_BYTES = (stack.CORPUS / PNG).read_bytes()
# A format pixelwire does not decode (vLLM's loader does): the frontend leaves it to the worker.
TIFF_BYTES = (stack.CORPUS / "g4_orientation_6.tif").read_bytes()
TRICKLE_URLS = 64
TRICKLE_INTERVAL = 0.5  # seconds between two bytes of a trickled image
# The frontend's fetcher gives a whole fetch this long (pixelwire.fetch.Fetcher's default).
FETCH_TIMEOUT = 30.0
# A victim connects from another loopback address than the attacks: another client.
VICTIM_ADDRESS = "127.0.0.2"


# -- the local servers ---------------------------------------------------------------------------


def _drain(handler: http.server.BaseHTTPRequestHandler) -> None:
    length = int(handler.headers.get("Content-Length") or 0)
    if length:
        handler.rfile.read(length)


def _answer(
    handler: http.server.BaseHTTPRequestHandler,
    status: int,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> None:
    _drain(handler)
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("Connection", "close")
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)
    handler.close_connection = True


def _trap(handler: http.server.BaseHTTPRequestHandler) -> None:
    # A real image: were the trap ever fetched, its pixels would flow on.
    _answer(handler, 200, PNG_BYTES, {"Content-Type": "image/png"})


def _images(trap_by_name: str) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    served_once: set[str] = set()
    lock = threading.Lock()

    def respond(handler: http.server.BaseHTTPRequestHandler) -> None:
        if handler.path.startswith(f"/{PNG}"):
            _answer(handler, 200, PNG_BYTES, {"Content-Type": "image/png"})
        elif handler.path.startswith("/to-trap"):
            # An allowed host whose image redirects to the trap.
            _answer(handler, 302, headers={"Location": f"{trap_by_name}/via-redirect.png"})
        elif handler.path.startswith("/changes-"):
            # An image the first time it is asked for, a redirect to the trap after.
            with lock:
                first = handler.path not in served_once
                served_once.add(handler.path)
            if first:
                _answer(handler, 200, TIFF_BYTES, {"Content-Type": "image/tiff"})
            else:
                _answer(handler, 302, headers={"Location": f"{trap_by_name}/on-second-fetch.png"})
        else:
            _answer(handler, 404)

    return respond


def _redirect_to(location: str) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    def respond(handler: http.server.BaseHTTPRequestHandler) -> None:
        _answer(handler, 307, headers={"Location": location})

    return respond


def _trickle(stop: threading.Event) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    """A PNG, one byte every TRICKLE_INTERVAL seconds."""

    def respond(handler: http.server.BaseHTTPRequestHandler) -> None:
        _drain(handler)
        handler.send_response(200)
        handler.send_header("Content-Type", "image/png")
        handler.send_header("Content-Length", str(len(PNG_BYTES)))
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.flush()
        handler.close_connection = True
        for i in range(len(PNG_BYTES)):
            if stop.wait(TRICKLE_INTERVAL):
                return
            handler.wfile.write(PNG_BYTES[i : i + 1])
            handler.wfile.flush()

    return respond


# -- the stack -----------------------------------------------------------------------------------


@dataclass
class Served:
    vllm: stack.Service  # per-request media_io_kwargs refused (vLLM's default)
    trusting_vllm: stack.Service  # --trust-request-mm-kwargs
    guarded: stack.Service  # the default guard (no private addresses), in front of vllm
    open: stack.Service  # --allowed-domains 127.0.0.1 --allow-private, in front of vllm
    guarded_trusting: stack.Service  # as guarded, in front of trusting_vllm
    open_trusting: stack.Service  # as open, in front of trusting_vllm
    worker_mode: stack.Service  # as open, --decode-at worker, in front of trusting_vllm
    redirecting: stack.Service  # its upstream answers every request with a 307 to the trap
    trap: str  # http://127.0.0.1:PORT
    trap_port: int
    trap_hits: list[str]
    images: str
    image_hits: list[str]
    trickle: str
    trickle_hits: list[str]
    reported: int = 0  # trap hits up to here have failed a test already

    def assert_trap_untouched(self, since: int) -> None:
        """No request reached the trap since ``since`` (a length of trap_hits)."""
        hits = self.trap_hits[since:]
        self.reported = len(self.trap_hits)
        assert hits == [], f"the trap was reached: {hits}"

    def trap_urls(self) -> dict[str, str]:
        """The trap, spelt as a client might to get past a guard."""
        port = self.trap_port
        return {
            "loopback": f"http://127.0.0.1:{port}/trap.png",
            "localhost": f"http://localhost:{port}/trap.png",
            "v4-mapped-v6": f"http://[::ffff:127.0.0.1]:{port}/trap.png",
            "decimal": f"http://2130706433:{port}/trap.png",
            "uppercase-scheme": f"HTTP://127.0.0.1:{port}/trap.png",
        }


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    logs = tmp_path_factory.mktemp("attack-logs")
    stack.model_dir()
    stop = threading.Event()
    services: list[stack.Service] = []
    with ExitStack() as cleanup:
        cleanup.callback(stop.set)  # the trickle's threads end before its server closes
        trap, trap_hits = cleanup.enter_context(stack.recording_server(_trap))
        trap_port = int(trap.rsplit(":", 1)[1])
        images, image_hits = cleanup.enter_context(
            stack.recording_server(_images(f"http://localhost:{trap_port}"))
        )
        trickle, trickle_hits = cleanup.enter_context(stack.recording_server(_trickle(stop)))
        upstream_redirect, _ = cleanup.enter_context(
            stack.recording_server(_redirect_to(f"{trap}/upstream-redirect"))
        )
        try:
            worker_env = {"PIXELWIRE_SECRET": stack.SECRET, "PIXELWIRE_ALLOW_PRIVATE": "1"}
            vllm = stack.start_vllm("vllm-attacks", logs, connector="pixelwire", extra_env=worker_env)
            services.append(vllm)
            trusting_vllm = stack.start_vllm(
                "vllm-attacks-trusting",
                logs,
                connector="pixelwire",
                extra_env=worker_env,
                # Its own guard the way a worker-mode deployment sets it: the
                # same allowed domains as the frontend (the worker fetches).
                extra_args=("--trust-request-mm-kwargs", "--allowed-media-domains", "127.0.0.1"),
            )
            services.append(trusting_vllm)
            secret = {"PIXELWIRE_SECRET": stack.SECRET}
            local = ("--allowed-domains", "127.0.0.1", "--allow-private")
            trust = "--trust-request-mm-kwargs"  # as the vLLM they front

            def frontend(name: str, upstream: str, *args: str) -> stack.Service:
                service = stack.start_frontend(name, logs, upstream, *args, env=secret)
                services.append(service)
                return service

            s = Served(
                vllm=vllm,
                trusting_vllm=trusting_vllm,
                guarded=frontend("frontend-guarded", vllm.url),
                open=frontend(
                    "frontend-open", vllm.url, *local, "--max-images-per-request", str(TRICKLE_URLS)
                ),
                guarded_trusting=frontend("frontend-guarded-trusting", trusting_vllm.url, trust),
                open_trusting=frontend("frontend-open-trusting", trusting_vllm.url, *local, trust),
                worker_mode=frontend(
                    "frontend-worker-mode", trusting_vllm.url, *local, trust, "--decode-at", "worker"
                ),
                redirecting=frontend("frontend-redirecting", upstream_redirect, "--no-check-upstream"),
                trap=trap,
                trap_port=trap_port,
                trap_hits=trap_hits,
                images=images,
                image_hits=image_hits,
                trickle=trickle,
                trickle_hits=trickle_hits,
            )
            started = time.monotonic()
            for service in services:
                # /health would pass through to the redirecting upstream (and
                # urllib would follow its redirect to the trap).
                service.wait_ready("/metrics" if service is s.redirecting else "/health", timeout=600)
            print(f"\nattack stack ready in {time.monotonic() - started:.0f} s")
            yield s
        finally:
            for service in reversed(services):
                service.stop()


@pytest.fixture(autouse=True)
def trap_untouched(served: Served) -> Iterator[None]:
    """Every test: the trap is never reached, by anyone."""
    before = len(served.trap_hits)
    yield
    served.assert_trap_untouched(max(before, served.reported))


@pytest.fixture(scope="module")
def publisher() -> Iterator[Any]:
    """A Publisher in the test process: the test plays a frontend that signs
    with the deployment's secret."""
    import pixelwire

    publisher = pixelwire.Publisher(pool_bytes=16 << 20, region_bytes=16 << 20, lease_seconds=60)
    yield publisher
    asyncio.run(publisher.close())


# -- helpers -------------------------------------------------------------------------------------


def _send(
    service: stack.Service,
    path: str,
    body: dict[str, Any] | None = None,
    *,
    method: str = "POST",
    timeout: float = 120,
    source: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One request, the path exactly as given, redirects never followed,
    from the loopback address ``source`` when given (another client)."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", service.port, timeout=timeout, source_address=(source, 0) if source else None
    )
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def _error(status: int, raw: bytes, want: int = 400) -> dict[str, Any]:
    assert status == want, raw[:2000]
    error = json.loads(raw)["error"]
    assert set(error) >= {"message", "type", "code"}, error
    return dict(error)


def _parts(urls: list[str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [*parts, {"type": "text", "text": "Describe the image."}]


def _chat(urls: list[str], **extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": _parts(urls)}],
        "max_tokens": 2,
        "temperature": 0,
        **extra,
    }


def _metrics(service: stack.Service) -> str:
    return service.get("/metrics")


def _delta(before: str, after: str, name: str, **labels: str) -> float:
    return stack.metric(after, name, **labels) - stack.metric(before, name, **labels)


def _upstream_calls(frontend: stack.Service) -> float:
    return stack.metric(_metrics(frontend), "pixelwire_frontend_upstream_requests_total")


def _wait_pool_empty(frontend: stack.Service, within: float = 5.0) -> float:
    deadline = time.monotonic() + within
    while True:
        in_use = stack.metric(_metrics(frontend), "pixelwire_frontend_pool_bytes_in_use")
        if in_use == 0 or time.monotonic() > deadline:
            return in_use
        time.sleep(0.1)


def _worker_images(service: stack.Service) -> dict[str, float]:
    text = _metrics(service)
    return {
        path: stack.metric(text, "pixelwire_worker_images_total", path=path)
        for path in ("nixl", "url", "vllm", "passthrough")
    }


def _worker_errors(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("pixelwire_worker_errors_total{"):
            key, _, value = line.rpartition(" ")
            out[key.split('type="', 1)[1].split('"', 1)[0]] = float(value)
    return out


# -- forged, unsigned, altered, replayed and expired references ----------------------------------


def _publish(publisher: Any) -> tuple[Any, str]:
    """A genuine image and its signed reference, as the frontend mints them."""
    from pixelwire.signing import encode_reference

    decoded = asyncio.run(publisher.decode_and_publish(PNG_BYTES, mode="RGB", layout="RGBX"))
    return decoded, encode_reference(decoded.to_dict(), stack.SECRET.encode())


def _wait_freed(publisher: Any, within: float = 10.0) -> int:
    deadline = time.monotonic() + within
    while (in_use := int(publisher.stats()["bytes_in_use"])) and time.monotonic() < deadline:
        time.sleep(0.05)
    return in_use


def _direct(vllm: stack.Service, reference: str) -> Any:
    """A chat completion sent straight to vLLM (past the frontend)."""
    import openai

    with openai.OpenAI(base_url=f"{vllm.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        return client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": _parts([reference])}],  # type: ignore[misc,list-item]
            max_tokens=2,
            temperature=0,
        )


def _refused_directly(vllm: stack.Service, reference: str) -> str:
    """vLLM answers the reference with a 400 and reads no pixels; returns the message."""
    import openai

    before = _metrics(vllm)
    with pytest.raises(openai.BadRequestError) as refused:
        _direct(vllm, reference)
    after = _metrics(vllm)
    for path in ("nixl", "url", "vllm"):
        assert _delta(before, after, "pixelwire_worker_images_total", path=path) == 0, path
    errors = {
        k: v - _worker_errors(before).get(k, 0.0)
        for k, v in _worker_errors(after).items()
        if v != _worker_errors(before).get(k, 0.0)
    }
    message = str(refused.value)
    print(f"\n  vLLM: 400 {message[:300]}\n  worker errors +{errors}")
    return message


def _read_directly(vllm: stack.Service, reference: str) -> None:
    """vLLM reads the reference's pixels over NIXL and answers."""
    before = _worker_images(vllm)
    response = _direct(vllm, reference)
    assert response.usage.completion_tokens >= 1
    assert _worker_images(vllm)["nixl"] == before["nixl"] + 1


def _refused_by_frontend(frontend: stack.Service, reference: str) -> None:
    calls = _upstream_calls(frontend)
    status, _, raw = _send(frontend, "/v1/chat/completions", _chat([reference]))
    error = _error(status, raw)
    assert "minted by the frontend" in error["message"], error
    assert _upstream_calls(frontend) == calls, "a client's reference must never reach vLLM"


def _resigned(reference: str, descriptor: dict[str, Any]) -> str:
    """``descriptor`` in a reference that carries ``reference``'s signature."""
    from pixelwire.signing import encode_reference

    return encode_reference(descriptor) + reference.rsplit(".", 1)[1]


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("forged", "does not match"),  # valid shape, signed with another secret
        ("unsigned", "unsigned"),  # the signature stripped
        ("altered-lease", "does not match"),  # expires_at pushed back, the genuine signature kept
        ("altered-cache-identity", "does not match"),  # another source_sha256, the genuine signature kept
        ("altered-address", "does not match"),  # another address in the same pool
        ("flipped-character", "does not match"),  # one character of the payload changed
    ],
)
def test_a_reference_not_signed_as_minted_is_refused_before_any_read(
    served: Served, publisher: Any, kind: str, words: str
) -> None:
    """A live, genuine image; the attacker's reference names its slot but is
    not the one the frontend signed: the frontend refuses it as
    client-supplied, vLLM refuses it before any NIXL call, and the genuine
    reference still reads afterwards (the slot was live all along)."""
    from pixelwire.signing import decode_reference, encode_reference

    decoded, genuine = _publish(publisher)
    descriptor = decode_reference(genuine, stack.SECRET.encode())
    own = descriptor["pixelwire"]
    if kind == "forged":
        attack = encode_reference(descriptor, b"not-the-secret")
    elif kind == "unsigned":
        attack = encode_reference(descriptor)
    elif kind == "altered-lease":
        attack = _resigned(genuine, {**descriptor, "pixelwire": {**own, "expires_at": time.time() + 3600}})
    elif kind == "altered-cache-identity":
        attack = _resigned(genuine, {**descriptor, "pixelwire": {**own, "source_sha256": "0" * 64}})
    elif kind == "altered-address":
        where = {**descriptor["nixl_descriptor"], "addr": descriptor["nixl_descriptor"]["addr"] + 4096}
        attack = _resigned(genuine, {**descriptor, "nixl_descriptor": where})
    else:
        head, payload, signature = genuine.rsplit(".", 2)
        middle = len(payload) // 2
        flipped = "A" if payload[middle] != "A" else "B"
        attack = f"{head}.{payload[:middle]}{flipped}{payload[middle + 1 :]}.{signature}"
    assert attack != genuine
    _refused_by_frontend(served.guarded, attack)
    _refused_by_frontend(served.open, attack)
    message = _refused_directly(served.vllm, attack)
    assert words in message, message
    _read_directly(served.vllm, genuine)  # the slot was live: the refusal is the signature's
    assert _wait_freed(publisher) == 0, "the genuine read frees the slot by notification"
    publisher.release(decoded)


def test_a_replayed_reference_gives_no_pixels(served: Served, publisher: Any) -> None:
    """A genuine reference, read once, sent again: its slot was freed by the
    first read's notification, so the replay is a 400, not another image."""
    _, genuine = _publish(publisher)
    _refused_by_frontend(served.guarded, genuine)  # a client cannot hand the frontend one either
    _read_directly(served.vllm, genuine)
    assert _wait_freed(publisher) == 0, "the read frees the slot by notification"
    _refused_directly(served.vllm, genuine)
    # Replayed after another image took the same slot: still no pixels (of either).
    decoded, fresh = _publish(publisher)
    _refused_directly(served.vllm, genuine)
    _read_directly(served.vllm, fresh)
    assert _wait_freed(publisher) == 0
    publisher.release(decoded)


def test_an_expired_reference_is_refused(served: Served) -> None:
    """A genuine reference whose lease has ended: vLLM refuses it (400)
    without reading, through the frontend it is refused as client-supplied."""
    import pixelwire

    short = pixelwire.Publisher(pool_bytes=16 << 20, region_bytes=16 << 20, lease_seconds=1)
    try:
        decoded, genuine = _publish(short)
        wait = decoded.expires_at - time.time() + 0.5
        time.sleep(max(0.0, wait))
        assert time.time() > decoded.expires_at
        _refused_by_frontend(served.guarded, genuine)
        message = _refused_directly(served.vllm, genuine)
        assert "expired" in message, message
        # The re-signed lease of an expired one is the altered-lease case above.
    finally:
        asyncio.run(short.close())


# -- every route and spelling --------------------------------------------------------------------


def _video_message(url: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"video_url": {"url": url}}, {"type": "text", "text": "hi"}]}


def _route_body(kind: str, url: str) -> dict[str, Any]:
    if kind == "responses":
        image = {"type": "input_image", "image_url": url, "detail": "auto"}
        content = [image, {"type": "input_text", "text": "hi"}]
        return {"model": "tiny", "input": [{"role": "user", "content": content}], "max_output_tokens": 2}
    if kind == "messages":
        image = {"type": "image", "source": {"type": "url", "url": url}}
        content = [image, {"type": "text", "text": "hi"}]
        return {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    if kind == "input_image":
        body = _chat([])
        part = {"type": "input_image", "image_url": url, "detail": "auto"}
        body["messages"][0]["content"].insert(0, part)
        return body
    if kind == "untyped":
        body = _chat([])
        body["messages"][0]["content"].insert(0, {"image_url": {"url": url}})
        return body
    if kind in ("video_url", "audio_url"):
        body = _chat([])
        body["messages"][0]["content"].insert(0, {"type": kind, kind: {"url": url}})
        return body
    if kind == "batch":
        return {"model": "tiny", "messages": [_chat([])["messages"] + [_video_message(url)]]}
    if kind == "uuid":
        body = _chat([])
        body["messages"][0]["content"].insert(0, {"type": "image_url", "image_url": url, "uuid": "u1"})
        return body
    return _chat([url])


# route id: (path as the client spells it, body kind, what an allowed image gets there):
# "read" (rewritten, and vLLM reads the pixels over NIXL), "unserved" (rewritten, but
# vLLM serves no such route for a generative model: 404), "refused" (400 at the frontend).
ROUTES: dict[str, tuple[str, str, str]] = {
    "chat": ("/v1/chat/completions", "chat", "read"),
    "chat-trailing-slash": ("/v1/chat/completions/", "chat", "read"),
    "chat-dot-segment": ("/v1/./chat/completions", "chat", "read"),
    "chat-dot-dot-segment": ("/v1/chat/../chat/completions", "chat", "read"),
    "chat-%2F": ("/v1/chat%2Fcompletions", "chat", "read"),
    "chat-%252F": ("/v1/chat%252Fcompletions", "chat", "read"),
    "chat-%63": ("/v1/chat/%63ompletions", "chat", "read"),
    "chat-double-slash": ("//v1//chat/completions", "chat", "read"),
    "chat-query": ("/v1/chat/completions?x=1", "chat", "read"),
    "chat-input_image-part": ("/v1/chat/completions", "input_image", "read"),
    "chat-untyped-part": ("/v1/chat/completions", "untyped", "read"),
    "chat-uuid-part": ("/v1/chat/completions", "uuid", "read"),
    "chat-video_url-part": ("/v1/chat/completions", "video_url", "bytes"),
    "chat-audio_url-part": ("/v1/chat/completions", "audio_url", "bytes"),
    "tokenize-video_url-part": ("/tokenize", "video_url", "bytes"),
    "chat-batch-video": ("/v1/chat/completions/batch", "batch", "refused"),
    "invocations-video": ("/invocations", "video_url", "refused"),
    "tokenize": ("/tokenize", "chat", "read"),
    "pooling": ("/pooling", "chat", "unserved"),
    "embeddings": ("/v1/embeddings", "chat", "unserved"),
    "classify": ("/classify", "chat", "unserved"),
    "responses": ("/v1/responses", "responses", "refused"),
    "messages": ("/v1/messages", "messages", "refused"),
    "messages-count-tokens": ("/v1/messages/count_tokens", "messages", "refused"),
}
TRAP_SPELLINGS = ["loopback", "localhost", "v4-mapped-v6", "decimal", "uppercase-scheme", "reference"]


@pytest.mark.parametrize("spelling", TRAP_SPELLINGS)
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_every_route_and_spelling_refuses_the_trap(served: Served, route: str, spelling: str) -> None:
    """Through the frontend with the default guard, an image pointing at the
    trap (in any spelling) or a descriptor reference, on every route vLLM
    loads images for: a 400, vLLM never asked, the trap never reached."""
    from pixelwire.signing import encode_reference

    path, kind, _ = ROUTES[route]
    if spelling == "reference":
        url = encode_reference({"pixelwire": {"slot": 0}}, stack.SECRET.encode())
    else:
        url = served.trap_urls()[spelling]
    frontend = served.guarded
    calls = _upstream_calls(frontend)
    worker = _worker_images(served.vllm)
    status, _, raw = _send(frontend, path, _route_body(kind, url))
    error = _error(status, raw)
    print(f"\n  {route} {spelling}: {error['message'][:200]}")
    assert _upstream_calls(frontend) == calls, "vLLM must never see this request"
    assert _worker_images(served.vllm) == worker


@pytest.mark.parametrize(
    "route", sorted(r for r, (_, _, outcome) in ROUTES.items() if outcome in ("read", "unserved"))
)
def test_rewritten_routes_hand_vllm_a_reference_never_the_url(served: Served, route: str) -> None:
    """An allowed image on each rewritten route and spelling: the frontend
    fetches it and vLLM gets a reference (or nothing), never the URL (its
    plug-in would fetch it past the frontend's guard)."""
    path, kind, outcome = ROUTES[route]
    frontend = served.open
    fetched = len(served.image_hits)
    front = _metrics(frontend)
    worker = _worker_images(served.vllm)
    status, _, raw = _send(frontend, path, _route_body(kind, f"{served.images}/{PNG}"))
    after = _worker_images(served.vllm)
    published = _delta(front, _metrics(frontend), "pixelwire_frontend_images_total", path="nixl")
    print(f"\n  {route}: {status} {raw[:160]!r}; worker images {worker} -> {after}")
    assert len(served.image_hits) == fetched + 1, "the frontend fetched the image, once"
    assert published == 1, "the frontend decoded and published it"
    assert after["url"] == worker["url"] and after["vllm"] == worker["vllm"], "vLLM never got the URL"
    if outcome == "read":
        assert status == 200, raw[:2000]
        assert after["nixl"] == worker["nixl"] + 1, "vLLM read the pixels over NIXL"
    else:
        assert status == 404, raw[:2000]
        assert after == worker
    assert _wait_pool_empty(frontend) == 0


# -- media_io_kwargs: refused by vLLM (default) and trusted, with the fallback modes --------------


@pytest.mark.parametrize("where", ["trap-loopback", "trap-localhost", "allowed-host-redirecting-to-trap"])
@pytest.mark.parametrize("mode", ["RGBA", "P", "CMYK"])
@pytest.mark.parametrize("vllm", ["media_io_kwargs-disabled", "media_io_kwargs-enabled"])
def test_media_io_kwargs_and_fallback_modes_never_reach_the_trap(
    served: Served, vllm: str, mode: str, where: str
) -> None:
    """Per-request ``media_io_kwargs`` asking for a mode: RGBA the frontend
    decodes itself; P and CMYK it leaves to the worker (vLLM's own loader,
    on bytes the plug-in fetches). Either way the trap must not be reached:
    a 400 from the frontend's guard, or, where vLLM would refuse the kwargs,
    from the frontend refusing them as vLLM does, before any fetch or
    forward."""
    trusting = vllm.endswith("enabled")
    if where.startswith("trap-"):
        frontend = served.guarded_trusting if trusting else served.guarded
        url = served.trap_urls()["loopback" if where == "trap-loopback" else "localhost"]
    else:
        # The allowed image server answers 302 to the trap by name (not an allowed domain).
        frontend = served.open_trusting if trusting else served.open
        url = f"{served.images}/to-trap.png"
    body = _chat([url], media_io_kwargs={"image": {"image_mode": mode}})
    calls = _upstream_calls(frontend)
    trap_before = len(served.trap_hits)
    status, _, raw = _send(frontend, "/v1/chat/completions", body)
    forwarded = _upstream_calls(frontend) - calls
    print(
        f"\n  {vllm} {mode} {where}: {status} {raw[:300]!r}; forwarded to vLLM: {forwarded:g}; "
        f"trap hits {served.trap_hits[trap_before:]}"
    )
    served.assert_trap_untouched(trap_before)
    error = _error(status, raw)
    if not trusting:
        assert error.get("param") == "media_io_kwargs" and forwarded == 0, error


def test_a_redirect_from_an_allowed_host_to_the_trap_is_refused(served: Served) -> None:
    """The frontend checks every hop: a redirect off the allowed domains is refused."""
    calls = _upstream_calls(served.open)
    status, _, raw = _send(served.open, "/v1/chat/completions", _chat([f"{served.images}/to-trap.png"]))
    error = _error(status, raw)
    assert "refused" in error["message"], error
    assert _upstream_calls(served.open) == calls


def test_decode_at_worker_never_lets_the_worker_reach_the_trap(served: Served) -> None:
    """``--decode-at worker`` passes URLs through after checking them; the
    worker fetches with its own guard, given the same allowed domains
    (vLLM's --allowed-media-domains): it must not reach the trap either,
    directly or by a redirect from an allowed host."""
    trap_before = len(served.trap_hits)
    outcomes = []
    for kind in ("image", "video_url", "audio_url"):
        for url in (served.trap_urls()["localhost"], f"{served.images}/to-trap.png"):
            body = _chat([url]) if kind == "image" else _route_body(kind, url)
            status, _, raw = _send(served.worker_mode, "/v1/chat/completions", body)
            outcomes.append((f"{kind} {url}", status, raw[:300]))
    print("\n" + "\n".join(f"  {url}: {status} {raw!r}" for url, status, raw in outcomes))
    served.assert_trap_untouched(trap_before)
    assert [status for _, status, _ in outcomes] == [400] * 6


@pytest.mark.parametrize("vllm", ["media_io_kwargs-disabled", "media_io_kwargs-enabled"])
def test_an_image_left_to_the_worker_is_not_fetched_again_past_the_guard(served: Served, vllm: str) -> None:
    """A format pixelwire does not decode (a CCITT TIFF) from an allowed
    host, no media_io_kwargs: the frontend fetched it through its guard,
    then leaves it to the worker. The worker must not get a URL it would
    fetch again past that guard: here the host answers the second fetch
    with a redirect to the trap."""
    frontend = served.open_trusting if vllm.endswith("enabled") else served.open
    url = f"{served.images}/changes-{frontend.port}.tif"
    trap_before = len(served.trap_hits)
    fetched = len(served.image_hits)
    status, _, raw = _send(frontend, "/v1/chat/completions", _chat([url]))
    fetches = [hit for hit in served.image_hits[fetched:] if "/changes-" in hit]
    print(
        f"\n  {frontend.name}: {status} {raw[:200]!r}; the image was fetched {len(fetches)} time(s); "
        f"trap hits {served.trap_hits[trap_before:]}"
    )
    served.assert_trap_untouched(trap_before)


# -- a redirecting upstream ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", "text"),
        ("POST", "/v1/chat/completions", "image"),
        ("POST", "/v1/chat/completions", "image-stream"),
        ("POST", "/tokenize", "image"),
        ("POST", "/v1/completions", "prompt"),
    ],
    ids=["models", "chat-text", "chat-image", "chat-image-sse", "tokenize-image", "completions"],
)
def test_a_redirecting_upstream_is_handed_back_never_followed(
    served: Served, method: str, path: str, body: str | None
) -> None:
    """An upstream that answers 307 to the trap: the client gets the 307
    back, the frontend never follows it, and the request's images are freed."""
    payload: dict[str, Any] | None = None
    if body == "text":
        payload = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    elif body == "prompt":
        payload = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    elif body is not None:
        payload = _chat([stack.data_url(PNG)], stream=body.endswith("stream"))
    front = _metrics(served.redirecting)
    trap_before = len(served.trap_hits)
    status, headers, _ = _send(served.redirecting, path, payload, method=method)
    assert status == 307
    assert headers.get("Location") == f"{served.trap}/upstream-redirect"
    if body is not None and body.startswith("image"):
        published = _delta(
            front, _metrics(served.redirecting), "pixelwire_frontend_images_total", path="nixl"
        )
        assert published == 1
    assert _wait_pool_empty(served.redirecting) == 0, "the redirected request's image is freed"
    served.assert_trap_untouched(trap_before)


# -- 500 images in one request -------------------------------------------------------------------


@pytest.mark.parametrize("target", ["allowed-image-server", "trap"])
def test_500_images_in_one_request_is_a_400_before_any_fetch(served: Served, target: str) -> None:
    if target == "trap":
        frontend, urls, limit = served.guarded, [served.trap_urls()["loopback"]] * 500, 32
    else:
        frontend, urls, limit = served.open, [f"{served.images}/{PNG}"] * 500, TRICKLE_URLS
    fetched = len(served.image_hits)
    calls = _upstream_calls(frontend)
    status, _, raw = _send(frontend, "/v1/chat/completions", _chat(urls))
    error = _error(status, raw)
    message = error["message"]
    assert "max_images_per_request" in message and "500" in message and str(limit) in message, message
    assert len(served.image_hits) == fetched, "no image fetched"
    assert _upstream_calls(frontend) == calls


# -- the slow-trickle client ---------------------------------------------------------------------


def test_a_slow_trickle_request_does_not_hold_up_another_client(served: Served) -> None:
    """One client's request brings 64 image URLs that trickle one byte every
    0.5 s; meanwhile a second client's request with one ordinary image
    completes, long before the trickling one ends (the fetcher's deadline
    ends it with a 400)."""
    import openai

    frontend = served.open
    trickled = len(served.trickle_hits)
    slow: dict[str, Any] = {}

    def trickling_client() -> None:
        urls = [f"{served.trickle}/slow-{i}.png" for i in range(TRICKLE_URLS)]
        try:
            slow["answer"] = _send(frontend, "/v1/chat/completions", _chat(urls), timeout=300)
        except (OSError, http.client.HTTPException) as e:  # reported by the assertions below
            slow["error"] = repr(e)
        slow["done"] = time.monotonic()

    started = time.monotonic()
    thread = threading.Thread(target=trickling_client, daemon=True)
    thread.start()
    # Wait until the trickling request holds its share of connections.
    deadline = time.monotonic() + 30
    while len(served.trickle_hits) - trickled < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    holding = len(served.trickle_hits) - trickled
    assert holding >= 1, "the trickling request never reached the trickle server"
    sent = time.monotonic()
    with openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        response = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": _parts([f"{served.images}/{PNG}"])}],  # type: ignore[misc,list-item]
            max_tokens=2,
            temperature=0,
        )
    other = time.monotonic() - sent
    trickle_at_that_time = len(served.trickle_hits) - trickled
    still_trickling = "done" not in slow
    thread.join(FETCH_TIMEOUT + 60)
    assert not thread.is_alive(), "the trickling request must end (the fetcher's deadline)"
    slow_took = slow["done"] - started
    print(
        f"\n  the other client's image: {other * 1000:.0f} ms, while the trickling request held "
        f"{holding} connection(s) ({trickle_at_that_time} trickle fetches started by then, "
        f"{len(served.trickle_hits) - trickled} in all); the trickling request ended after "
        f"{slow_took:.1f} s: "
        f"{slow.get('answer', slow.get('error'))!s:.300}"
    )
    assert response.usage is not None and response.usage.completion_tokens >= 1
    assert still_trickling, "the other client's request completed before the trickling one ended"
    assert trickle_at_that_time <= 8, "one request's URLs are fetched a few at a time"
    # The issue asks for 2 s; measured ~50 ms here. 10 s leaves room for a loaded box.
    assert other < 10.0, f"the other client's image took {other:.1f} s (the issue asks for 2 s)"
    assert "answer" in slow, slow
    status, _, raw = slow["answer"]
    error = _error(status, raw)
    assert "timed out" in error["message"], error
    assert _wait_pool_empty(frontend) == 0


# -- media that makes vLLM's own loaders open other resources ---------------------------------------


class _FifoMarker:
    """A named pipe on vLLM's host at a path relative to vLLM's working
    directory (a concat script names it so); ``opened`` is set the moment
    anything opens it for reading: a file read, seen as it happens."""

    def __init__(self, vllm: stack.Service) -> None:
        import os
        import pathlib

        self.directory = pathlib.Path.cwd() / "target" / f"fifo-marker-{os.getpid()}-{time.monotonic_ns()}"
        self.directory.mkdir(parents=True)
        self.path = self.directory / "marker.mp4"
        os.mkfifo(self.path)
        vllm_cwd = pathlib.Path(f"/proc/{vllm.process.pid}/cwd").resolve()
        self.relative = os.path.relpath(self.path, vllm_cwd)
        self.opened = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        import errno
        import os

        while not self.stop.wait(0.005):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as error:
                if error.errno == errno.ENXIO:  # no reader: nobody opened it
                    continue
                raise
            self.opened.set()
            os.close(fd)  # the reader sees the end of the file

    def close(self) -> None:
        import shutil

        self.stop.set()
        self.thread.join(5)
        shutil.rmtree(self.directory, ignore_errors=True)


def _udp_ports_bound() -> set[int]:
    """Every local UDP port bound on this host (IPv4 and IPv6)."""
    ports = set()
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                ports.add(int(line.split()[1].rsplit(":", 1)[1], 16))
    return ports


def _video_part(url: str) -> list[dict[str, Any]]:
    return [{"type": "video_url", "video_url": {"url": url}}, {"type": "text", "text": "Describe it."}]


def _video_request(url: str) -> dict[str, Any]:
    return {"model": "tiny", "messages": [{"role": "user", "content": _video_part(url)}], "max_tokens": 2}


def _paths(served: Served) -> dict[str, stack.Service]:
    """The ways a client reaches vLLM's video loader: through the frontend
    (it decodes), through a worker-mode frontend (the plug-in decodes), and
    straight to vLLM with the plug-in."""
    return {"frontend": served.open, "worker-mode": served.worker_mode, "vllm-direct": served.vllm}


@pytest.mark.parametrize("path", ["frontend", "worker-mode", "vllm-direct"])
@pytest.mark.parametrize("media_type", ["video/jpegx", "video/jpeg2000", "video/mp4", "application/x"])
def test_a_concat_script_never_reads_a_file_on_vllms_host(served: Served, path: str, media_type: str) -> None:
    """A concat script naming a file on vLLM's host, sent as a video in a
    data: URL whose type only starts like vLLM's JPEG-frame form (or any
    other type): a 400, and the file (a named pipe that tells when it is
    opened) is never opened by anyone."""
    marker = _FifoMarker(served.vllm if path != "worker-mode" else served.trusting_vllm)
    try:
        url = hostile_media.data_url(hostile_media.ffconcat(marker.relative), media_type)
        status, _, raw = _send(_paths(served)[path], "/v1/chat/completions", _video_request(url), timeout=60)
        time.sleep(0.2)  # an open after the answer would still be seen
        assert not marker.opened.is_set(), f"vLLM's host opened the marker ({status} {raw[:300]!r})"
        assert status == 400, raw[:2000]
    finally:
        marker.close()


@pytest.mark.parametrize("path", ["frontend", "worker-mode", "vllm-direct"])
def test_an_sdp_description_never_binds_a_udp_port(served: Served, path: str) -> None:
    """An SDP session naming a UDP port, sent as a video in a ``video/jpegx``
    data: URL: a 400, and no process binds that port while it is handled."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once the probe closes; even for RTP
    port -= port % 2
    url = hostile_media.data_url(hostile_media.sdp(port, "127.0.0.2"), "video/jpegx")
    answer: dict[str, Any] = {}

    def request() -> None:
        answer["sent"] = _send(_paths(served)[path], "/v1/chat/completions", _video_request(url), timeout=60)

    thread = threading.Thread(target=request)
    thread.start()
    bound = False
    while thread.is_alive():
        bound = bound or port in _udp_ports_bound()
        time.sleep(0.005)
    thread.join()
    status, _, raw = answer["sent"]
    assert not bound, f"UDP port {port} was bound while the request was handled ({status} {raw[:300]!r})"
    assert status == 400, raw[:2000]


@pytest.mark.parametrize("path", ["frontend", "worker-mode", "vllm-direct"])
def test_a_frame_list_of_huge_jpegs_is_refused_from_their_headers(served: Served, path: str) -> None:
    """32 JPEGs whose headers claim 13000x13000 each (vLLM's Pillow would
    take 507 MB a frame and stack them) in vLLM's JPEG-frame form: refused
    from the headers, by pixelwire, within a second, with under 100 MB more
    memory on the frontend's and vLLM's side."""
    url = hostile_media.frame_list([hostile_media.jpeg_claiming(13000, 13000)] * 32)
    vllm = served.vllm if path != "worker-mode" else served.trusting_vllm
    watched = [vllm] if path == "vllm-direct" else [vllm, _paths(served)[path]]
    peaks = [stack.peak_rss(service) for service in watched]
    started = time.monotonic()
    status, _, raw = _send(_paths(served)[path], "/v1/chat/completions", _video_request(url), timeout=60)
    elapsed = time.monotonic() - started
    error = _error(status, raw)
    assert "JPEG frame list" in error["message"], error
    assert elapsed < 1.0, elapsed
    for service, peak in zip(watched, peaks, strict=True):
        assert stack.peak_rss(service) - peak < 100 << 20, service.name


def _pillow_only(format: str) -> bytes:
    """A 16x16 image in a format only Pillow reads (pixelwire neither
    decodes nor vouches for it)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buffer, format=format)
    return buffer.getvalue()


@pytest.mark.parametrize("path", ["frontend", "worker-mode", "vllm-direct"])
@pytest.mark.parametrize("format", ["PCX", "SGI"])
def test_an_image_only_pillow_reads_never_reaches_vllms_loader(
    served: Served, path: str, format: str
) -> None:
    """An image whose format pixelwire does not decode goes on to vLLM's
    loader (Pillow, with every plug-in) only once it is identified
    natively as one image format: a PCX or an SGI image is a 400 naming
    that, from the frontend or the plug-in, while a CCITT TIFF (one such
    format) is still answered."""
    url = hostile_media.data_url(_pillow_only(format), "image/png")
    status, _, raw = _send(_paths(served)[path], "/v1/chat/completions", _chat([url]))
    error = _error(status, raw)
    assert "not one media container" in error["message"], error
    tiff = hostile_media.data_url(TIFF_BYTES, "image/tiff")
    status, _, raw = _send(_paths(served)[path], "/v1/chat/completions", _chat([tiff]))
    assert status == 200, raw[:2000]


def _varied(video: bytes, attempt: int) -> bytes:
    """``video`` (an MP4) with a ``free`` box of its own at its end: other
    bytes (another SHA-256) for the same frames."""
    filler = f"attempt {attempt}".encode()
    return video + struct.pack(">I4s", 8 + len(filler), b"free") + filler


@pytest.mark.parametrize("attacker", ["waits", "leaves", "varies"])
def test_video_bombs_in_worker_mode_do_not_queue_another_video(
    served: Served, video_bomb: dict[str, bytes], attacker: str
) -> None:
    """Worker mode: the plug-in decodes videos in vLLM's API server. While
    three bombs at a time (1,500 1080p frames each, claiming 1.5 ms, sampled
    by the opencv loader over all of them) decode there, another client's
    5 s 720p video takes turns among them rather than waiting behind them.
    When their client waits (its three senders a quiet bomb apart), each
    victim sent while some bomb had far more left to decode than the victim
    needs is answered before that bomb ends (:mod:`video_turns`); at least
    two of six are judged. When it hangs up after 0.5 s and sends the bomb
    again (the same bytes, or bytes varied on every attempt), the
    resent bomb resumes the decoding time its client had (it does not start
    level with the victim): the victim's request spans no more of the
    attacker's attempts (begun and given up within it) than fit in twice
    the slowest quiet answer, and one round more. Its p99 against a quiet
    run is printed."""
    import base64
    import statistics

    def body(data: bytes) -> dict[str, Any]:
        url = f"data:video/mp4;base64,{base64.b64encode(data).decode()}"
        return {
            **_video_request(url),
            "media_io_kwargs": {"video": {"video_backend": "opencv", "num_frames": 8}},
        }

    bomb_bytes = video_bomb["h264_1080p_million_fps_bomb.mp4"]
    victim = body(video_bomb["h264_720p_5s.mp4"])
    leave_after = 300.0 if attacker == "waits" else 0.5
    attempts = itertools.count()

    def victim_spans(rounds: int) -> list[tuple[float, float]]:
        spans = []
        for _ in range(rounds):
            started = time.monotonic()
            status, _, raw = _send(served.worker_mode, "/v1/chat/completions", victim, source=VICTIM_ADDRESS)
            assert status == 200, raw[:2000]
            spans.append((started, time.monotonic()))
        return spans

    victim_spans(1)
    quiet = victim_spans(4)
    stop = threading.Event()
    bombs: list[tuple[float, float]] = []
    stagger = 0.0
    if attacker == "waits":
        started = time.monotonic()
        status, _, raw = _send(served.worker_mode, "/v1/chat/completions", body(_varied(bomb_bytes, -1)))
        assert status == 200, raw[:2000]
        stagger = time.monotonic() - started

    def attack(index: int) -> None:
        same = body(bomb_bytes)
        # Senders that start together end together (they take turns): a
        # victim sent just before that end is rightly answered after it.
        if stop.wait(index * stagger):
            return
        while not stop.is_set():
            # A waiting attacker's bombs are each other bytes too: the same
            # bytes sent again are the worker's video cache's once decoded.
            varied = attacker in ("waits", "varies")
            bomb = body(_varied(bomb_bytes, next(attempts))) if varied else same
            started = time.monotonic()
            try:
                _send(served.worker_mode, "/v1/chat/completions", bomb, timeout=leave_after)
            except OSError:
                pass  # the attacker hung up
            bombs.append((started, time.monotonic()))

    attackers = [threading.Thread(target=attack, args=(index,)) for index in range(3)]
    for thread in attackers:
        thread.start()
    time.sleep(2.0 + 2 * stagger)
    loaded = victim_spans(6 if attacker == "waits" else 4)
    stop.set()
    for thread in attackers:
        thread.join(300)
    judged = video_turns.turns(quiet, loaded, bombs)
    if attacker == "waits":
        judged.check(2, bombs)
    else:
        # Counted against the attacker's own clock and the quiet run's: the
        # bombs it could resend while twice the slowest quiet answer took,
        # and one round more.
        allowed = len(attackers) * (2 * max(e - s for s, e in quiet) / leave_after + 1)
        resent = [sum(v_start <= s and e <= v_end for s, e in bombs) for v_start, v_end in loaded]
        assert max(resent) <= allowed, (
            "a victim's video waited out resent bombs",
            resent,
            allowed,
            quiet,
            loaded,
        )

    def p99(spans: list[tuple[float, float]]) -> float:
        return 1000 * statistics.quantiles([e - s for s, e in spans], n=100)[98]

    print(
        f"\n  worker mode, attacker {attacker}: victim video p99 quiet {p99(quiet):.0f} ms, "
        f"loaded {p99(loaded):.0f} ms ({p99(loaded) / p99(quiet):.2f}x); {len(bombs)} bombs sent; {judged}"
    )
