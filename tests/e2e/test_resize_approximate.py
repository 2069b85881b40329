"""The approximate resize (``--resize-approximate``) served by vLLM: a tiny,
randomly initialised LLaVA-OneVision (``tiny_model.py``; 56-pixel tiles on
a grid of 1 to 6 a side) served by vLLM 0.32 three times: with the plug-in
and PIXELWIRE_RESIZE_APPROXIMATE=1 behind ``pixelwire frontend --model
--resize-approximate``, with the plug-in without that variable, and with
vLLM's own loader as the reference.

LLaVA-OneVision's processor resizes the original twice (to its grid
resolution and to its base tile), so no single image gives its outputs
exactly. The approximate resize ships the grid-size image: the prompt is
vLLM's own, token for token; the answer may move, and the test prints how
far. A vLLM that has not opted in refuses it.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import pytest

from pixelwire.resize import ResizePolicy, image_resize_policy

import stack

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

FAMILY = "llava-onevision"
PHOTO = "exif_gps_typeerror.jpg"


def _png_data_url(width: int, height: int) -> str:
    """The corpus photo at (width, height), as a PNG data: URL."""
    from PIL import Image

    with Image.open(stack.CORPUS / PHOTO) as photo:
        image = photo.convert("RGB").resize((width, height), Image.Resampling.BICUBIC)
    out = io.BytesIO()
    image.save(out, "PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("logs-approximate")
    model = str(stack.model_dir(FAMILY))
    secret = {"PIXELWIRE_SECRET": stack.SECRET}
    services: list[stack.Service] = []
    try:
        approximate_vllm = stack.start_vllm(
            "vllm-approximate",
            logs,
            connector="pixelwire",
            extra_env={**secret, "PIXELWIRE_RESIZE_APPROXIMATE": "1"},
            family=FAMILY,
        )
        services.append(approximate_vllm)
        strict_vllm = stack.start_vllm(
            "vllm-strict", logs, connector="pixelwire", extra_env=secret, family=FAMILY
        )
        services.append(strict_vllm)
        reference_vllm = stack.start_vllm("vllm-reference", logs, connector="http", family=FAMILY)
        services.append(reference_vllm)
        flags = ("--model", model, "--resize-approximate")
        frontend = stack.start_frontend(
            "frontend-approximate", logs, approximate_vllm.url, *flags, env=secret
        )
        services.append(frontend)
        refused = stack.start_frontend("frontend-refused", logs, strict_vllm.url, *flags, env=secret)
        services.append(refused)
        for service in services:
            service.wait_ready("/health", timeout=600)
        yield {
            "model": model,
            "approximate_vllm": approximate_vllm,
            "strict_vllm": strict_vllm,
            "reference_vllm": reference_vllm,
            "frontend": frontend,
            "refused": refused,
        }
    finally:
        for service in reversed(services):
            service.stop()


def _policy(served: dict[str, Any]) -> ResizePolicy:
    policy = image_resize_policy(served["model"], approximate=True)
    assert policy is not None and policy.approximate
    return policy


def test_the_plugin_resizes_approximately_only_when_allowed(served: dict[str, Any]) -> None:
    """With PIXELWIRE_RESIZE_APPROXIMATE=1 the plug-in learns the
    approximate policy from vLLM's --model; without it, none."""
    identity = _policy(served).identity
    log = served["approximate_vllm"].log.read_text(errors="replace")
    assert f"pixelwire model-aware resize: {identity} ({served['model']}, from vLLM's command line)" in log
    strict = served["strict_vllm"].log.read_text(errors="replace")
    assert "pixelwire model-aware resize: off" in strict and identity not in strict


def test_an_image_ships_at_its_grid_size_with_vllms_prompt(served: dict[str, Any]) -> None:
    """A 1080p photo crosses NIXL at its grid size (336x189 on the tiny
    model's 56-pixel tiles), and vLLM counts the same prompt tokens as its
    own loader's; the answer's tokens and logprobs against the reference
    are printed (the base tile is not the processor's own)."""
    url = _png_data_url(1920, 1080)
    target = _policy(served).target(1080, 1920)
    assert target == (189, 336)
    before = served["frontend"].get("/metrics")
    approximate = stack.completion(served["frontend"].url, [url])
    after = served["frontend"].get("/metrics")
    shipped = stack.metric(after, "pixelwire_frontend_pixel_bytes_total", path="nixl") - stack.metric(
        before, "pixelwire_frontend_pixel_bytes_total", path="nixl"
    )
    assert shipped == target[0] * target[1] * 3
    reference = stack.completion(served["reference_vllm"].url, [url])
    assert approximate.usage.prompt_tokens == reference.usage.prompt_tokens
    ours = [(t.token, t.logprob) for t in approximate.choices[0].logprobs.content]
    theirs = [(t.token, t.logprob) for t in reference.choices[0].logprobs.content]
    moved = max(abs(a - b) for (_, a), (_, b) in zip(ours, theirs, strict=True))
    same = [t for t, _ in ours] == [t for t, _ in theirs]
    print(
        f"\n1920x1080 -> {target[1]}x{target[0]}: {approximate.usage.prompt_tokens} prompt tokens (as vLLM's "
        f"loader), answer tokens {'the same' if same else 'different'}, logprobs max |d| {moved:.4f}"
    )


def test_an_image_not_shipped_smaller_gives_vllms_own_answer(served: dict[str, Any]) -> None:
    """An image whose grid size is not smaller ships as it is: vLLM's own
    answer, logprob for logprob."""
    assert _policy(served).target(100, 100) == (100, 100)
    url = _png_data_url(100, 100)
    assert stack.chat(served["frontend"].url, [url]) == stack.chat(served["reference_vllm"].url, [url])


def test_a_vllm_that_has_not_opted_in_refuses_the_approximate_resize(served: dict[str, Any]) -> None:
    """A frontend resizing approximately for a vLLM without
    PIXELWIRE_RESIZE_APPROXIMATE learns it from the handshake and refuses
    the image (502, naming the variable), never answering on those pixels."""
    import openai

    with pytest.raises(openai.APIStatusError) as refused:
        stack.chat(served["refused"].url, [_png_data_url(1920, 1080)])
    assert refused.value.status_code == 502
    assert "PIXELWIRE_RESIZE_APPROXIMATE=1" in str(refused.value), str(refused.value)
