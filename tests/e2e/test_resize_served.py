"""Model-aware resize served by vLLM, for the families beyond Qwen2-VL
(``make test-vllm``): a tiny, randomly initialised model per family
(``tiny_model.py``: Gemma 3, GLM-4.1V, Mistral 3, Idefics3) served by vLLM 0.32 twice, once with
VLLM_MEDIA_CONNECTOR=pixelwire behind ``pixelwire frontend --model`` and
once with vLLM's own loader as the reference. Each image reaches vLLM at
the size the family's processor resizes it to (GLM-4.1V's RGB images as
its processor's patch rows: processed inputs, the frontend's default for
it), and the answer is vLLM's own: token for token, and logprob for
logprob for lossless images.

The images are made from a corpus photo: 1080p, an odd size, EXIF-rotated
(a JPEG), grey and RGBA. One family's servers run at a time (module-scoped,
parametrised), each started once.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import pytest

from pixelwire.processed import patch_layout
from pixelwire.resize import image_resize_policy

import stack

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

FAMILIES = ["gemma3", "glm4v", "mistral3", "idefics3"]
# A processor setting the family's served model does not have: a frontend
# resizing for it must be refused, never answered on other pixels.
OTHER_SETTING: dict[str, dict[str, Any]] = {
    "gemma3": {"size": {"height": 224, "width": 224}},
    "glm4v": {"size": {"shortest_edge": 28 * 28 * 2 * 8, "longest_edge": 28 * 28 * 2 * 64}},
    "mistral3": {"size": {"longest_edge": 224}},
    "idefics3": {"size": {"longest_edge": 168}},
}
PHOTO = "exif_gps_typeerror.jpg"
IMAGES = ["1080p.png", "odd_853x479.png", "1080p_exif6.jpg", "grey.png", "rgba.png"]


@pytest.fixture(scope="module")
def images() -> dict[str, bytes]:
    """The test images, encoded, by name (see the module docstring)."""
    from PIL import Image

    def encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
        out = io.BytesIO()
        image.save(out, fmt, **options)
        return out.getvalue()

    with Image.open(stack.CORPUS / PHOTO) as photo:
        photo = photo.convert("RGB")
    full = photo.resize((1920, 1080), Image.Resampling.BICUBIC)
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise: portrait
    rgba = photo.resize((1200, 800), Image.Resampling.BICUBIC).convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize(rgba.size))
    return {
        "1080p.png": encode(full, "PNG", compress_level=1),
        "odd_853x479.png": encode(photo.resize((853, 479), Image.Resampling.BICUBIC), "PNG"),
        "1080p_exif6.jpg": encode(full, "JPEG", quality=90, exif=exif),
        "grey.png": encode(photo.convert("L").resize((1000, 664), Image.Resampling.BICUBIC), "PNG"),
        "rgba.png": encode(rgba, "PNG"),
    }


def _data_url(name: str, data: bytes) -> str:
    kind = "jpeg" if name.endswith(".jpg") else "png"
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


@pytest.fixture(scope="module", params=FAMILIES)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    family: str = request.param
    logs = tmp_path_factory.mktemp(f"logs-{family}")
    model = str(stack.model_dir(family))
    services: list[stack.Service] = []
    try:
        # No PIXELWIRE_MODEL: the plug-in learns the model from vLLM's --model.
        pixelwire_vllm = stack.start_vllm(
            f"vllm-pixelwire-{family}",
            logs,
            connector="pixelwire",
            extra_env={"PIXELWIRE_SECRET": stack.SECRET},
            family=family,
        )
        services.append(pixelwire_vllm)
        reference_vllm = stack.start_vllm(f"vllm-reference-{family}", logs, connector="http", family=family)
        services.append(reference_vllm)
        secret = {"PIXELWIRE_SECRET": stack.SECRET}
        resizing = stack.start_frontend(
            f"frontend-resize-{family}", logs, pixelwire_vllm.url, "--model", model, env=secret
        )
        services.append(resizing)
        mismatched = stack.start_frontend(
            f"frontend-resize-mismatch-{family}",
            logs,
            pixelwire_vllm.url,
            "--model",
            model,
            "--mm-processor-kwargs",
            json.dumps(OTHER_SETTING[family]),
            env=secret,
        )
        services.append(mismatched)
        for service in services:
            service.wait_ready("/health", timeout=600)
        yield {
            "family": family,
            "model": model,
            "pixelwire_vllm": pixelwire_vllm,
            "reference_vllm": reference_vllm,
            "resizing": resizing,
            "mismatched": mismatched,
        }
    finally:
        for service in reversed(services):
            service.stop()


def test_the_plugin_resizes_for_the_served_family(served: dict[str, Any]) -> None:
    """Started without PIXELWIRE_MODEL, the plug-in reads the family's
    policy from vLLM's --model, and takes processed inputs for GLM-4.1V
    alone of these families."""
    policy = image_resize_policy(served["model"])
    assert policy is not None
    log = served["pixelwire_vllm"].log.read_text(errors="replace")
    learnt = f"{policy.identity} ({served['model']}, from vLLM's command line)"
    assert f"pixelwire model-aware resize: {learnt}" in log, log[-2000:]
    layout = patch_layout(served["model"], {}, policy)
    assert (layout is not None) == (served["family"] == "glm4v")
    processed = f"{layout.identity}\n" if layout is not None else "off ("
    assert f"pixelwire processed inputs: {processed}" in log, log[-2000:]


@pytest.mark.parametrize("name", IMAGES)
def test_a_resized_image_gives_vllms_own_answer(
    served: dict[str, Any], images: dict[str, bytes], name: str
) -> None:
    """Through `pixelwire frontend --model`, the image crosses NIXL at the
    processor's target size (and no more), and vLLM answers as it does on
    its own loader's full image: the same tokens, and for lossless images
    the same logprobs."""
    import pixelwire

    policy = image_resize_policy(served["model"])
    assert policy is not None
    height, width = pixelwire.probe_image(images[name])["oriented_size"]
    target = policy.target(height, width)
    assert target != (height, width), "the image must be resized"
    url = _data_url(name, images[name])
    before = served["resizing"].get("/metrics")
    resized = stack.chat(served["resizing"].url, [url])
    after = served["resizing"].get("/metrics")
    shipped = stack.metric(after, "pixelwire_frontend_pixel_bytes_total", path="nixl") - stack.metric(
        before, "pixelwire_frontend_pixel_bytes_total", path="nixl"
    )
    print(f"\n{served['family']} {name}: {width}x{height} -> {target[1]}x{target[0]}, NIXL bytes {shipped:g}")
    assert shipped == target[0] * target[1] * 3, "the pixels of the target size, and nothing more"
    reference = stack.chat(served["reference_vllm"].url, [url])
    if name.endswith(".jpg"):
        # Lossy: pixelwire's libjpeg-turbo and Pillow's may differ in the last bit.
        assert [t for t, _ in resized] == [t for t, _ in reference]
    else:
        assert resized == reference


def test_another_image_changes_the_answer(served: dict[str, Any], images: dict[str, bytes]) -> None:
    """The tiny model looks at the image: equal answers above are not a
    model that ignores its input."""
    one = stack.chat(served["resizing"].url, [_data_url("1080p.png", images["1080p.png"])])
    other = stack.chat(served["resizing"].url, [_data_url("grey.png", images["grey.png"])])
    assert [lp for _, lp in one] != [lp for _, lp in other]


def test_a_frontend_resizing_for_another_setting_is_refused(
    served: dict[str, Any], images: dict[str, bytes]
) -> None:
    """A frontend whose --mm-processor-kwargs give another size than vLLM's
    processor learns it from the handshake and refuses the image (502,
    naming the flags), never answering on other pixels."""
    import openai

    with pytest.raises(openai.APIStatusError) as refused:
        stack.chat(served["mismatched"].url, [_data_url("1080p.png", images["1080p.png"])])
    assert refused.value.status_code == 502
    assert "--mm-processor-kwargs" in str(refused.value), str(refused.value)
