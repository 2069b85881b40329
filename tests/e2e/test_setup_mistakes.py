"""Set-up mistakes against a real vLLM 0.32 (the tiny Qwen2-VL, vLLM's own
loader, ``--api-key``), each said at the frontend's start, once in its log
and in each image request's 502, with the fix, before any image work: a
worker-mode frontend in front of a vLLM without the pixelwire connector
(its loader would fetch the URLs), and a frontend without vLLM's API key,
or with another one. vLLM's /metrics is read as vLLM's (with the plug-in's
info, connector ``http``), and vLLM answers the handshake's GET /v1/models
401 without its key. One vLLM for the module."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import stack

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

KEY = "e2e-vllm-key"
IMAGE = "hopper.png"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, stack.Service]]:
    logs = tmp_path_factory.mktemp("logs-setup-mistakes")
    services: list[stack.Service] = []
    try:
        vllm = stack.start_vllm("vllm-keyed", logs, connector="http", extra_args=("--api-key", KEY))
        services.append(vllm)
        secret = {"PIXELWIRE_SECRET": stack.SECRET}
        worker_mode = ("--decode-at", "worker")
        fronts = {
            name: stack.start_frontend(f"frontend-{name}", logs, vllm.url, *worker_mode, *keys, env=secret)
            for name, keys in (
                ("keyed", ("--api-key", KEY)),
                ("keyless", ()),
                ("other-key", ("--api-key", "x")),
            )
        }
        services += fronts.values()
        for service in services:
            service.wait_ready("/health", timeout=600)
        yield {"vllm": vllm, **fronts}
    finally:
        for service in reversed(services):
            service.stop()


def _image_chat() -> dict[str, Any]:
    parts = [
        {"type": "image_url", "image_url": {"url": stack.data_url(IMAGE)}},
        {"type": "text", "text": "hi"},
    ]
    return {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": parts}]}


TEXT = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def _mismatch(service: stack.Service, setting: str) -> float:
    return stack.metric(service.get("/metrics"), "pixelwire_frontend_upstream_mismatch", setting=setting)


def _logged(service: stack.Service, words: str) -> list[str]:
    return [line for line in service.tail(400).splitlines() if words in line]


def _until_checked(service: stack.Service) -> None:
    deadline = time.monotonic() + 60
    while not _logged(service, "disagrees with this frontend"):
        assert time.monotonic() < deadline, service.tail(40)
        time.sleep(0.2)


def test_worker_mode_in_front_of_vllms_own_loader_refuses_images(served: dict[str, stack.Service]) -> None:
    keyed = served["keyed"]
    _until_checked(keyed)
    status, body = stack.post_chat(keyed, _image_chat(), KEY)
    assert status == 502, body
    message = body["error"]["message"]
    assert "VLLM_MEDIA_CONNECTOR=pixelwire" in message and "--no-check-upstream" in message
    assert "--api-key" not in message, "vLLM takes this frontend's key"
    assert (_mismatch(keyed, "connector"), _mismatch(keyed, "api_key")) == (1, 0)
    assert len(_logged(keyed, "disagrees with this frontend")) == 1
    status, body = stack.post_chat(keyed, TEXT, KEY)
    assert status == 200, body


@pytest.mark.parametrize(
    ("name", "words"), [("keyless", "has none"), ("other-key", "refuses this frontend's")]
)
def test_an_api_key_vllm_refuses_is_said_before_any_image_work(
    served: dict[str, stack.Service], name: str, words: str
) -> None:
    front = served[name]
    _until_checked(front)
    client_key = KEY if name == "keyless" else "x"
    status, body = stack.post_chat(front, _image_chat(), client_key)
    assert status == 502 and "--api-key" in body["error"]["message"] and words in body["error"]["message"], (
        body
    )
    assert _mismatch(front, "api_key") == 1
    (line,) = _logged(front, "disagrees with this frontend")
    assert "--api-key" in line
    if name == "other-key":
        assert stack.post_chat(front, TEXT, client_key)[0] == 401, "vLLM's own answer"
