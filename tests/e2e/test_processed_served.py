"""Processed inputs served by vLLM for the tiny Qwen3-VL (``make
test-vllm``; tiny Qwen2-VL's are tests/e2e/test_vllm.py's, tiny
GLM-4.1V's default settings tests/e2e/test_resize_served.py's): behind
``pixelwire frontend --model`` (processed inputs, its default), vLLM 0.32
with the plug-in answers with its own loader's tokens and logprobs, with
each of its processor cache settings (``lru``, vLLM's default; ``shm``;
off) and tensor IPC (``direct_rpc``, the default; ``torch_shm``). One vLLM
per combination, two settings a server, each with its processed-inputs
frontend, and one vLLM with its own loader as the reference, all started
once for the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import pixelwire
from pixelwire.processed import PatchLayout, patch_layout
from pixelwire.resize import image_resize_policy

import stack

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

FAMILY = "qwen3-vl"
# vLLM's processor cache and tensor IPC, a pair a server.
SETTINGS: dict[str, tuple[str, ...]] = {
    "lru-direct_rpc": (),  # vLLM's defaults
    "shm-torch_shm": ("--mm-processor-cache-type", "shm", "--mm-tensor-ipc", "torch_shm"),
    "off-torch_shm": ("--mm-processor-cache-gb", "0", "--mm-tensor-ipc", "torch_shm"),
}
# Lossless, so logprobs compare exactly: two corpus PNGs, and the second
# one again in the third turn (a repeat, which vLLM's cache serves).
PNG, OTHER_PNG = "hopper.png", "bw_gradient.png"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("logs-processed-served")
    model = str(stack.model_dir(FAMILY))
    secret = {"PIXELWIRE_SECRET": stack.SECRET}
    services: list[stack.Service] = []
    try:
        reference = stack.start_vllm("vllm-reference-qwen3-vl", logs, connector="http", family=FAMILY)
        services.append(reference)
        pixelwire_vllms, frontends = {}, {}
        for name, flags in SETTINGS.items():
            vllm = stack.start_vllm(
                f"vllm-pixelwire-{name}",
                logs,
                connector="pixelwire",
                extra_env=secret,
                extra_args=flags,
                family=FAMILY,
            )
            services.append(vllm)
            pixelwire_vllms[name] = vllm
            frontends[name] = stack.start_frontend(
                f"frontend-processed-{name}", logs, vllm.url, "--model", model, env=secret
            )
            services.append(frontends[name])
        for service in services:
            service.wait_ready("/health", timeout=600)
        yield {"model": model, "reference": reference, "vllms": pixelwire_vllms, "frontends": frontends}
    finally:
        for service in reversed(services):
            service.stop()


def _layout(model: str) -> PatchLayout:
    layout = patch_layout(model, {}, image_resize_policy(model))
    assert layout is not None
    return layout


def test_each_plugin_takes_qwen3_vls_processed_inputs(served: dict[str, Any]) -> None:
    """Every pixelwire vLLM declares the rows of Qwen3-VL's grid (patch 16)."""
    layout = _layout(served["model"])
    assert layout.patch_size == 16
    for name, vllm in served["vllms"].items():
        log = vllm.log.read_text(errors="replace")
        assert f"pixelwire processed inputs: {layout.identity}" in log, (name, log[-2000:])


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_processed_turns_get_vllms_own_answer(served: dict[str, Any], setting: str) -> None:
    """A conversation resending its images (a repeat in the third turn),
    streamed and not, through the processed-inputs frontend: every turn is
    answered with vLLM's own loader's tokens and logprobs, and each image
    crossed NIXL as its processor's patch rows (3 bytes a pixel of the
    target size), which the plug-in read as processed images."""
    frontend, vllm = served["frontends"][setting], served["vllms"][setting]
    a, b = stack.data_url(PNG), stack.data_url(OTHER_PNG)
    layout = _layout(served["model"])
    targets = {}
    for url, name in ((a, PNG), (b, OTHER_PNG)):
        height, width = pixelwire.probe_image((stack.CORPUS / name).read_bytes())["oriented_size"]
        targets[url] = layout.target(height, width)
    for stream, turn in ((False, [a]), (True, [a, b]), (False, [a, b, a])):
        before, read_before = frontend.get("/metrics"), vllm.get("/metrics")
        got = stack.chat(frontend.url, turn, stream=stream)
        after, read_after = frontend.get("/metrics"), vllm.get("/metrics")
        shipped = stack.metric(after, "pixelwire_frontend_pixel_bytes_total", path="nixl") - stack.metric(
            before, "pixelwire_frontend_pixel_bytes_total", path="nixl"
        )
        assert shipped == sum(targets[url][0] * targets[url][1] * 3 for url in turn), (setting, len(turn))
        processed = {"medium": "processed_image", "path": "nixl"}
        read = stack.metric(read_after, "pixelwire_worker_media_total", **processed) - stack.metric(
            read_before, "pixelwire_worker_media_total", **processed
        )
        assert read == len(turn), (setting, len(turn))
        assert got == stack.chat(served["reference"].url, turn, stream=stream), (setting, stream, len(turn))
