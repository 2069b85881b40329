"""A client of `pixelwire frontend` (the aiohttp proxy) under test: starting
one, the chat bodies sent to it, its answers and the metrics it reports."""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

import stack
from reference import CORPUS, vllm_load

# Signs what the frontends under test mint; the upstream checks it.
SECRET = b"frontend-test-secret"


def started_frontend(log_dir: Path, upstream_url: str, *args: str) -> stack.Service:
    """A frontend in front of ``upstream_url``, signing with :data:`SECRET`,
    fetching only from images.test unless ``args`` say otherwise, ready."""
    env = {"PIXELWIRE_SECRET": SECRET.decode()}
    service = stack.start_frontend(
        "frontend", log_dir, upstream_url, "--allowed-domains", "images.test", *args, env=env
    )
    service.wait_ready("/metrics", timeout=60)
    return service


def post(
    service: stack.Service, body: dict[str, Any], timeout: float = 30, api_key: str | None = None
) -> tuple[int, Any]:
    """A chat completion (with ``api_key`` as its Bearer token): the status
    and the raw answer, or an error's JSON."""
    return stack.post_chat_raw(service, body, timeout=timeout, api_key=api_key)


def send(
    service: stack.Service, path: str, body: bytes | dict[str, Any] | None = None, method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    """One request with the path exactly as spelt (urllib would not touch it
    either, but http.client does not follow redirects)."""
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=60)
    try:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def send_chunked(service: stack.Service, path: str, data: bytes, piece: int) -> tuple[int, bytes]:
    """A POST whose body goes in HTTP chunks of ``piece`` bytes (chunked
    transfer encoding, no Content-Length): the status and the raw answer."""
    connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=60)
    try:
        pieces = (data[i : i + piece] for i in range(0, len(data), piece))
        connection.request(
            "POST", path, body=pieces, headers={"Content-Type": "application/json"}, encode_chunked=True
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def chat(*urls: str, model: str = "m", **extra: Any) -> dict[str, Any]:
    """A chat body of one user turn: an image_url part for each URL, then text."""
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {
        "model": model,
        "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "hi"}]}],
        **extra,
    }


def user(*content: dict[str, Any]) -> list[dict[str, Any]]:
    """``messages`` of one user turn holding ``content``."""
    return [{"role": "user", "content": list(content)}]


def video_chat(data: bytes) -> dict[str, Any]:
    """A chat body of one ``video_url`` part: ``data`` as an MP4 ``data:`` URL."""
    url = f"data:video/mp4;base64,{base64.b64encode(data).decode()}"
    return {"model": "m", "messages": user({"type": "video_url", "video_url": {"url": url}})}


def photo_chat() -> dict[str, Any]:
    """A chat body of one 640x480 JPEG of noise (a photo's decoding cost)."""
    pixels = np.random.default_rng(2).integers(0, 256, (480, 640, 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    url = f"data:image/jpeg;base64,{base64.b64encode(out.getvalue()).decode()}"
    return {"model": "m", "messages": user({"type": "image_url", "image_url": {"url": url}})}


def post_from(service: stack.Service, body: dict[str, Any], source: str, timeout: float) -> int:
    """A chat completion sent from the loopback address ``source`` (another
    client, to the frontend): its status."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", service.port, timeout=timeout, source_address=(source, 0)
    )
    try:
        connection.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def victim_rounds(
    service: stack.Service, clip: bytes, source: str, rounds: int
) -> dict[str, list[tuple[float, float]]]:
    """A victim's video (``clip``) and 640x480 photo, alternately, ``rounds``
    each, sent from ``source``: every request's (start, end) by kind; each
    must be answered."""
    bodies: dict[str, Callable[[], dict[str, Any]]] = {"video": lambda: video_chat(clip), "image": photo_chat}
    spans: dict[str, list[tuple[float, float]]] = {"video": [], "image": []}
    for _ in range(rounds):
        for kind, body in bodies.items():
            started = time.monotonic()
            assert post_from(service, body(), source, 120) == 201, kind
            spans[kind].append((started, time.monotonic()))
    return spans


def p99_ms(spans: list[tuple[float, float]]) -> float:
    """The 99th percentile of the spans' lengths, in ms."""
    times = [end - start for start, end in spans]
    return 1000 * (statistics.quantiles(times, n=100)[98] if len(times) > 1 else times[0])


def expected(name: str, **kwargs: Any) -> dict[str, Any]:
    """What the upstream reports for a corpus image read over NIXL, had
    vLLM's own loader decoded it."""
    _, pixels = vllm_load((CORPUS / name).read_bytes(), **kwargs)
    return {"shape": list(pixels.shape), "sha": hashlib.sha256(np.ascontiguousarray(pixels)).hexdigest()}


def in_use(service: stack.Service) -> float:
    """Bytes of the frontend's pool held now."""
    return stack.metric(service.get("/metrics"), "pixelwire_frontend_pool_bytes_in_use")


def wait_empty(service: stack.Service, within: float) -> float:
    """Bytes of the pool still held once it emptied or ``within`` seconds passed."""
    deadline = time.monotonic() + within
    while (held := in_use(service)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return held
