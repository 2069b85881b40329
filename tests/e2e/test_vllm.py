"""End to end with a real vLLM server, the real pixelwire frontend and the
official openai client (``make test-vllm``; see the README).

Two vLLM servers run the same tiny, randomly initialised Qwen2-VL: one with
VLLM_MEDIA_CONNECTOR=pixelwire behind the frontend, one with vLLM's own
loader as the reference. Greedy completions with logprobs must match token
for token for lossless images, and a different image must change them.
"""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

import pixelwire

import stack

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PNG = "hopper.png"
JPEG = "flower2.jpg"
OTHER_PNG = "bw_gradient.png"
LEASE_SECONDS = 20
# Photos at 1080p and 4K for the model-aware resize (made from a corpus photo).
PHOTOS = {f"photo_{h}p.{ext}": (w, h) for (w, h) in ((1920, 1080), (3840, 2160)) for ext in ("png", "jpg")}
# vLLM's processor cache and tensor IPC settings other than its defaults
# (an LRU cache, tensors over its RPC), for one of the servers.
SHM_SETTINGS = ("--mm-processor-cache-type", "shm", "--mm-tensor-ipc", "torch_shm")
# The image server is on the loopback: the frontends' guard lets it through.
GUARD = ("--allowed-domains", "127.0.0.1", "--allow-private")
# A max_pixels other than the tiny model's (12544): a frontend set up with it
# disagrees with vLLM's processor.
OTHER_MAX_PIXELS = 50176


def _make_photos(folder: Any) -> None:
    from PIL import Image

    with Image.open(stack.CORPUS / JPEG) as photo:
        photo = photo.convert("RGB")
        for name, size in PHOTOS.items():
            big = photo.resize(size, Image.Resampling.BICUBIC)
            if name.endswith(".png"):
                big.save(folder / name, "PNG", compress_level=1)
            else:
                big.save(folder / name, "JPEG", quality=90)


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("logs")
    images = tmp_path_factory.mktemp("images")
    for name in (PNG, JPEG, OTHER_PNG):
        shutil.copy(stack.CORPUS / name, images / name)
    _make_photos(images)
    model = str(stack.model_dir())
    services: list[stack.Service] = []
    with stack.image_server(images) as image_base:
        try:
            # No PIXELWIRE_MODEL: the plug-in learns the model from vLLM's
            # --model, checks frontend-resized images against its processor
            # and resizes worker-mode URLs (the resize tests prove it).
            worker_env = {"PIXELWIRE_SECRET": stack.SECRET, "PIXELWIRE_ALLOW_PRIVATE": "1"}
            pixelwire_vllm = stack.start_vllm(
                "vllm-pixelwire", logs, connector="pixelwire", extra_env=worker_env
            )
            services.append(pixelwire_vllm)
            reference_vllm = stack.start_vllm("vllm-reference", logs, connector="http")
            services.append(reference_vllm)
            guard = GUARD
            secret = {"PIXELWIRE_SECRET": stack.SECRET}
            frontend = stack.start_frontend(
                "frontend",
                logs,
                pixelwire_vllm.url,
                *guard,
                "--lease-seconds",
                str(LEASE_SECONDS),
                env=secret,
            )
            services.append(frontend)
            worker_mode = stack.start_frontend(
                "frontend-worker-mode", logs, pixelwire_vllm.url, *guard, "--decode-at", "worker", env=secret
            )
            services.append(worker_mode)
            # Resized pixels (--no-processed-inputs), and the processor's
            # outputs (processed inputs, --model's default).
            resizing = stack.start_frontend(
                "frontend-resize",
                logs,
                pixelwire_vllm.url,
                *guard,
                "--model",
                model,
                "--no-processed-inputs",
                env=secret,
            )
            services.append(resizing)
            processed = stack.start_frontend(
                "frontend-processed", logs, pixelwire_vllm.url, *guard, "--model", model, env=secret
            )
            services.append(processed)
            cached_flags = ["--model", model, "--cache-bytes", "64MiB"]
            cached = stack.start_frontend(
                "frontend-cached", logs, pixelwire_vllm.url, *guard, *cached_flags, env=secret
            )
            services.append(cached)
            mismatched = stack.start_frontend(
                "frontend-resize-mismatch",
                logs,
                pixelwire_vllm.url,
                *guard,
                "--model",
                model,
                "--mm-processor-kwargs",
                json.dumps({"max_pixels": OTHER_MAX_PIXELS}),
                env=secret,
            )
            services.append(mismatched)
            # Frontend mode in front of a vLLM without the connector.
            misconfigured = stack.start_frontend("frontend-misconfigured", logs, reference_vllm.url, *guard)
            services.append(misconfigured)
            for service in services:
                service.wait_ready("/health", timeout=600)
            yield {
                "pixelwire_vllm": pixelwire_vllm,
                "reference_vllm": reference_vllm,
                "frontend": frontend,
                "worker_mode": worker_mode,
                "resizing": resizing,
                "processed": processed,
                "cached": cached,
                "mismatched": mismatched,
                "model": model,
                "misconfigured": misconfigured,
                "images": image_base,
            }
        finally:
            for service in reversed(services):
                service.stop()


def _client(service: stack.Service) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{service.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _messages(urls: list[str]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": "Describe the image."})
    return [{"role": "user", "content": parts}]


def _complete(service: stack.Service, urls: list[str], *, stream: bool = False) -> list[tuple[str, float]]:
    """(token, logprob) for a greedy completion of 8 tokens."""
    args: dict[str, Any] = {
        "model": "tiny",
        "messages": _messages(urls),
        "temperature": 0,
        "max_tokens": 8,
        "logprobs": True,
        "seed": 0,
    }
    # Closed after each completion: an open client's sockets would be
    # reported (as errors, with filterwarnings=error) when collected.
    with _client(service) as client:
        if not stream:
            response = client.chat.completions.create(**args)
            return [(t.token, t.logprob) for t in response.choices[0].logprobs.content]
        out: list[tuple[str, float]] = []
        for chunk in client.chat.completions.create(**args, stream=True):
            if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                out.extend((t.token, t.logprob) for t in chunk.choices[0].logprobs.content)
        return out


def _cases(images: str) -> dict[str, list[str]]:
    return {
        "png_base64": [stack.data_url(PNG)],
        "jpeg_base64": [stack.data_url(JPEG)],
        "http_url": [f"{images}/{PNG}"],
        "two_images": [stack.data_url(PNG), f"{images}/{JPEG}"],
    }


def _metrics(service: stack.Service) -> str:
    return service.get("/metrics")


def _wait_pool_empty(frontend: stack.Service, within: float) -> float:
    deadline = time.monotonic() + within
    while True:
        in_use = stack.metric(_metrics(frontend), "pixelwire_frontend_pool_bytes_in_use")
        if in_use == 0 or time.monotonic() > deadline:
            return in_use
        time.sleep(0.2)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("case", ["png_base64", "jpeg_base64", "http_url", "two_images"])
def test_frontend_decoded_path_matches_vllms_own_loader(
    served: dict[str, Any], case: str, stream: bool
) -> None:
    urls = _cases(served["images"])[case]
    before = _metrics(served["pixelwire_vllm"])
    through_pixelwire = _complete(served["frontend"], urls, stream=stream)
    reference = _complete(served["reference_vllm"], urls)
    after = _metrics(served["pixelwire_vllm"])
    read = stack.metric(after, "pixelwire_worker_images_total", path="nixl") - stack.metric(
        before, "pixelwire_worker_images_total", path="nixl"
    )
    assert read == len(urls), "every image must reach vLLM over NIXL"
    assert len(through_pixelwire) == 8
    if case == "jpeg_base64":
        # Lossy: pixelwire's libjpeg-turbo and Pillow's may differ in the last bit.
        assert [t for t, _ in through_pixelwire] == [t for t, _ in reference]
    else:
        assert through_pixelwire == reference
    assert _wait_pool_empty(served["frontend"], 5.0) == 0


def _complete_video(service: stack.Service, data: bytes, **extra: Any) -> list[tuple[str, float]]:
    """(token, logprob) for a greedy completion of 8 tokens about one video (a data: URL)."""
    url = "data:video/mp4;base64," + base64.b64encode(data).decode()
    parts = [
        {"type": "video_url", "video_url": {"url": url}},
        {"type": "text", "text": "Describe the video."},
    ]
    with _client(service) as client:
        response = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": parts}],
            temperature=0,
            max_tokens=8,
            logprobs=True,
            seed=0,
            **extra,
        )
        return [(t.token, t.logprob) for t in response.choices[0].logprobs.content]


def _videos_read(service: stack.Service, path: str, before: str) -> float:
    return stack.metric(_metrics(service), "pixelwire_worker_videos_total", path=path) - stack.metric(
        before, "pixelwire_worker_videos_total", path=path
    )


def _videos_laid_out(service: stack.Service, path: str, before: str) -> float:
    """Videos whose rows the plug-in laid out for vLLM's processor (processed videos)."""
    labels = {"medium": "processed_video", "path": path}
    after = stack.metric(_metrics(service), "pixelwire_worker_media_total", **labels)
    return after - stack.metric(before, "pixelwire_worker_media_total", **labels)


@pytest.mark.parametrize("clip", ["h264_high_bframes.mp4", "vp9_odd_853x480.webm", "hevc_10bit.mkv"])
def test_a_video_through_the_frontend_gets_vllms_tokens(
    served: dict[str, Any], video_clips: dict[str, bytes], clip: str
) -> None:
    """A frontend started with the model (so it knows vLLM samples its
    videos with the qwen2_vl loader and how its video processor resizes
    them) samples, decodes and resizes the video, vLLM reads the frames
    over NIXL at the processor's size, the plug-in hands vLLM's engine its
    video processor's rows of them (a processed video: the processor is
    not called), and the answer is vLLM's own, token for token and logprob
    for logprob; the slot is freed by the read."""
    before = _metrics(served["pixelwire_vllm"])
    shipped_before = stack.metric(
        _metrics(served["resizing"]), "pixelwire_frontend_video_frame_bytes_total", path="nixl"
    )
    through_pixelwire = _complete_video(served["resizing"], video_clips[clip])
    assert _videos_read(served["pixelwire_vllm"], "nixl", before) == 1, "the frames came over NIXL"
    assert _videos_laid_out(served["pixelwire_vllm"], "nixl", before) == 1, "vLLM got the processor's rows"
    shipped = (
        stack.metric(_metrics(served["resizing"]), "pixelwire_frontend_video_frame_bytes_total", path="nixl")
        - shipped_before
    )
    full, _ = pixelwire.decode_video(video_clips[clip], loader="qwen2_vl")
    assert 0 < shipped < full.nbytes / 4, "the frames travel at the processor's size"
    assert through_pixelwire == _complete_video(served["reference_vllm"], video_clips[clip])
    assert _wait_pool_empty(served["resizing"], 5.0) == 0


def test_a_frontend_that_cannot_tell_the_loader_hands_the_video_on(
    served: dict[str, Any], video_clips: dict[str, bytes]
) -> None:
    """A frontend started without --model (nor a video_backend) cannot tell
    how vLLM samples the model's videos: it hands the bytes on, vLLM's
    plug-in decodes them natively, and the answer is vLLM's own."""
    data = video_clips["h264_open_gop.mkv"]
    before = _metrics(served["pixelwire_vllm"])
    through_pixelwire = _complete_video(served["frontend"], data)
    assert _videos_read(served["pixelwire_vllm"], "url", before) == 1
    assert _videos_read(served["pixelwire_vllm"], "nixl", before) == 0
    assert through_pixelwire == _complete_video(served["reference_vllm"], data)


def test_worker_mode_decodes_videos_natively_with_vllms_tokens(
    served: dict[str, Any], video_clips: dict[str, bytes]
) -> None:
    """In worker mode the plug-in decodes the video inside vLLM's API server
    with pixelwire's decoder, each frame resized for the served model's
    video processor, hands its engine the processor's rows of them, and
    vLLM answers with its own loader's tokens and logprobs; a codec
    pixelwire does not decode goes to vLLM's own loader with the bytes
    already fetched."""
    from pixelwire.resize import video_resize_policy

    data = video_clips["h264_scene.mp4"]
    before = _metrics(served["pixelwire_vllm"])
    worker_decoded = _complete_video(served["worker_mode"], data)
    assert _videos_read(served["pixelwire_vllm"], "url", before) == 1
    assert _videos_laid_out(served["pixelwire_vllm"], "url", before) == 1
    assert worker_decoded == _complete_video(served["reference_vllm"], data)
    # The frames were resized on the way: the bytes decoded are the resized frames'.
    policy = video_resize_policy(str(stack.model_dir()))
    full, _ = pixelwire.decode_video(data, loader="qwen2_vl")
    resized, _ = pixelwire.decode_video(data, loader="qwen2_vl", resize=policy)
    decoded = stack.metric(
        _metrics(served["pixelwire_vllm"]), "pixelwire_worker_video_frame_bytes_total", path="url"
    ) - stack.metric(before, "pixelwire_worker_video_frame_bytes_total", path="url")
    assert decoded == resized.nbytes < full.nbytes


def test_a_different_image_changes_the_logprobs(served: dict[str, Any]) -> None:
    one = _complete(served["frontend"], [stack.data_url(PNG)])
    other = _complete(served["frontend"], [stack.data_url(OTHER_PNG)])
    assert one != other
    assert [lp for _, lp in one] != [lp for _, lp in other]
    # And the reference agrees for the other image too.
    assert other == _complete(served["reference_vllm"], [stack.data_url(OTHER_PNG)])


def test_a_client_chosen_uuid_never_serves_another_clients_image(served: dict[str, Any]) -> None:
    """vLLM keys its multimodal caches on a part's uuid as given: a client
    that sent image A under a uuid would have a later client who sends B
    under the same uuid answered on A, and a part naming the uuid with no
    image answered on A too. Through the frontend the second client is
    answered on its own image, and the uuid-only part is refused."""
    import openai

    key = f"shared-{time.time_ns()}"

    def under_key(name: str) -> list[dict[str, Any]]:
        part = {"type": "image_url", "image_url": {"url": stack.data_url(name)}, "uuid": key}
        return [{"role": "user", "content": [part, {"type": "text", "text": "Describe the image."}]}]

    def complete(messages: list[dict[str, Any]]) -> list[tuple[str, float]]:
        with _client(served["frontend"]) as client:
            response = client.chat.completions.create(
                model="tiny", messages=messages, temperature=0, max_tokens=8, logprobs=True, seed=0
            )
            return [(t.token, t.logprob) for t in response.choices[0].logprobs.content]

    first = complete(under_key(PNG))
    second = complete(under_key(OTHER_PNG))
    assert second != first, "the second client was answered on the first client's image"
    assert second == _complete(served["frontend"], [stack.data_url(OTHER_PNG)])
    theft = [{"type": "image_url", "image_url": None, "uuid": key}, {"type": "text", "text": "hi"}]
    with _client(served["frontend"]) as client, pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": theft}], max_tokens=2
        )
    assert _wait_pool_empty(served["frontend"], 5.0) == 0


@pytest.mark.parametrize("case", ["png_base64", "jpeg_base64", "http_url", "two_images"])
def test_decode_at_worker_gives_the_same_texts(served: dict[str, Any], case: str) -> None:
    urls = _cases(served["images"])[case]
    before = _metrics(served["pixelwire_vllm"])
    worker_decoded = _complete(served["worker_mode"], urls)
    after = _metrics(served["pixelwire_vllm"])
    native = stack.metric(after, "pixelwire_worker_images_total", path="url") - stack.metric(
        before, "pixelwire_worker_images_total", path="url"
    )
    assert native == len(urls), "the worker's plug-in decodes URL images natively"
    frontend_decoded = _complete(served["frontend"], urls)
    assert "".join(t for t, _ in worker_decoded) == "".join(t for t, _ in frontend_decoded)
    if case != "jpeg_base64":
        assert worker_decoded == _complete(served["reference_vllm"], urls)


def test_metrics_show_nixl_and_an_empty_pool(served: dict[str, Any]) -> None:
    _complete(served["frontend"], [stack.data_url(PNG), f"{served['images']}/{JPEG}"])
    front = _metrics(served["frontend"])
    worker = _metrics(served["pixelwire_vllm"])
    assert stack.metric(front, "pixelwire_frontend_images_total", path="nixl") >= 2
    assert stack.metric(front, "pixelwire_frontend_pixel_bytes_total", path="nixl") > 0
    assert stack.metric(front, "pixelwire_frontend_decode_seconds_count", path="nixl") >= 2
    assert stack.metric(worker, "pixelwire_worker_images_total", path="nixl") >= 2
    assert stack.metric(worker, "pixelwire_worker_publish_to_read_seconds_count") >= 2
    info = [line for line in worker.splitlines() if line.startswith("pixelwire_worker_info{")]
    assert len(info) == 1 and float(info[0].rpartition(" ")[2]) == 1, info
    assert f'version="{pixelwire.__version__}"' in info[0] and 'connector="pixelwire"' in info[0], info
    assert _wait_pool_empty(served["frontend"], 5.0) == 0
    assert stack.metric(worker, "pixelwire_worker_pool_bytes_in_use") == 0


def _assert_openai_error(status: int, body: dict[str, Any], want_status: int, words: str) -> None:
    assert status == want_status, body
    error = body["error"]
    assert set(error) >= {"message", "type", "code"}
    assert words in error["message"], error["message"]


def _upstream_calls(frontend: stack.Service) -> float:
    return stack.metric(_metrics(frontend), "pixelwire_frontend_upstream_requests_total")


def _minted_reference(served: dict[str, Any]) -> str:
    """A genuine signed descriptor reference: what the frontend sends to vLLM."""
    from pixelwire.signing import decode_reference, encode_reference

    descriptor = {
        "nixl_metadata": "b64:eJwDAAAAAAE=",
        "nixl_descriptor": {"addr": 4096, "size": 12, "mem_type": "Dram", "device_id": 0},
        "shape": [2, 2, 3],
        "dtype": "UINT8",
        "metadata": {"format": "PNG", "color_type": "RGB", "layout": "HWC"},
        "content_hash": "xxh3-256k:0123456789abcdef",
        "pixelwire": {"agent": "x", "slot": 0, "generation": 1, "expires_at": time.time() + 60,
                      "notification": "pw1:0:1", "background": [255, 255, 255], "published_at": time.time()},
    }  # fmt: skip
    reference = encode_reference(descriptor, stack.SECRET.encode())
    assert decode_reference(reference, stack.SECRET.encode()) == descriptor
    return reference


def test_the_plugin_logs_its_signing_policy_at_start_up(served: dict[str, Any]) -> None:
    log = served["pixelwire_vllm"].log.read_text(errors="replace")
    assert "pixelwire descriptor references: signatures required (PIXELWIRE_SECRET set)" in log


def test_the_plugin_learns_the_served_model_from_vllms_command_line(served: dict[str, Any]) -> None:
    """Started without PIXELWIRE_MODEL, the plug-in takes the model from
    vLLM's --model and says so (the resize tests then prove it checks by it)."""
    log = served["pixelwire_vllm"].log.read_text(errors="replace")
    assert "pixelwire model-aware resize: smart:factor=28:" in log, log[-2000:]
    assert f"({served['model']}, from vLLM's command line)" in log
    assert "pixelwire processed inputs: qwen2_vl_patches:uint8:patch=14:temporal=2:merge=2:smart:" in log


def test_client_supplied_descriptor_is_refused_before_vllm(served: dict[str, Any]) -> None:
    frontend = served["frontend"]
    calls = _upstream_calls(frontend)
    status, body = stack.post_chat(
        frontend, {"model": "tiny", "messages": _messages([_minted_reference(served)])}
    )
    _assert_openai_error(status, body, 400, "minted by the frontend")
    assert body["error"]["param"] == "messages[0].content[0]"
    assert _upstream_calls(frontend) == calls


def test_forged_or_unsigned_descriptors_are_refused_before_nixl(served: dict[str, Any]) -> None:
    from pixelwire.signing import decode_reference, encode_reference

    genuine = _minted_reference(served)
    descriptor = decode_reference(genuine, stack.SECRET.encode())
    forged = encode_reference(descriptor, b"not-the-secret")
    unsigned = encode_reference(descriptor)
    head, payload, signature = genuine.rsplit(".", 2)
    altered = f"{head}.{payload[:-2]}{'A' if payload[-2] != 'A' else 'B'}{payload[-1]}.{signature}"
    vllm = served["pixelwire_vllm"]
    before = _metrics(vllm)
    # Through the frontend: refused as client-supplied, vLLM never asked.
    calls = _upstream_calls(served["frontend"])
    for reference in (forged, unsigned, altered):
        status, body = stack.post_chat(
            served["frontend"], {"model": "tiny", "messages": _messages([reference])}
        )
        _assert_openai_error(status, body, 400, "minted by the frontend")
    assert _upstream_calls(served["frontend"]) == calls
    # Straight to vLLM: the plug-in refuses them before any NIXL call.
    for reference, words in ((forged, "does not match"), (unsigned, "unsigned"), (altered, "does not match")):
        status, body = stack.post_chat(vllm, {"model": "tiny", "messages": _messages([reference])})
        _assert_openai_error(status, body, 400, words)
    after = _metrics(vllm)
    refused = stack.metric(after, "pixelwire_worker_errors_total", type="SignatureError") - stack.metric(
        before, "pixelwire_worker_errors_total", type="SignatureError"
    )
    assert refused == 3
    for name in ("pixelwire_worker_images_total", "pixelwire_worker_decode_seconds_count"):
        assert stack.metric(after, name, path="nixl") == stack.metric(before, name, path="nixl")


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data/", "file:///etc/passwd", "http://example.invalid/a.png"]
)
def test_blocked_url_is_a_400_and_vllm_is_never_asked(served: dict[str, Any], url: str) -> None:
    for name in ("frontend", "worker_mode"):
        frontend = served[name]
        calls = _upstream_calls(frontend)
        status, body = stack.post_chat(
            frontend, {"model": "tiny", "messages": _messages([stack.data_url(PNG), url])}
        )
        _assert_openai_error(status, body, 400, "refused")
        assert body["error"]["param"] == "messages[0].content[1]"
        assert _upstream_calls(frontend) == calls
    assert _wait_pool_empty(served["frontend"], 5.0) == 0


def test_frontend_in_front_of_a_vllm_without_the_connector_says_so(served: dict[str, Any]) -> None:
    body = {"model": "tiny", "messages": _messages([stack.data_url(PNG)])}
    status, body = stack.post_chat(served["misconfigured"], body)
    _assert_openai_error(status, body, 502, "VLLM_MEDIA_CONNECTOR=pixelwire")
    # Text-only requests still pass through.
    status, body = stack.post_chat(
        served["misconfigured"],
        {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 200, body


def test_other_routes_pass_through(served: dict[str, Any]) -> None:
    models = json.loads(served["frontend"].get("/v1/models"))
    assert [m["id"] for m in models["data"]] == ["tiny"]
    status, body = stack.post_chat(
        served["frontend"], {"model": "no-such-model", "messages": _messages([stack.data_url(PNG)])}
    )
    assert status == 404, body  # vLLM's own status, preserved
    assert _wait_pool_empty(served["frontend"], 5.0) == 0


@pytest.mark.parametrize("name", sorted(PHOTOS))
def test_model_aware_resize_gives_vllms_own_answer(served: dict[str, Any], name: str) -> None:
    """Through `pixelwire frontend --model`, and with the plug-in resizing
    URLs in worker mode, a 1080p or 4K photo gives vLLM's own loader's
    tokens (and logprobs for PNG), while only the target size's pixels cross
    NIXL."""
    from pixelwire.resize import image_resize_policy

    url = f"{served['images']}/{name}"
    width, height = PHOTOS[name]
    target = image_resize_policy(served["model"]).target(height, width)
    reference = _complete(served["reference_vllm"], [url])
    before = served["resizing"].get("/metrics")
    resized = _complete(served["resizing"], [url])
    after = served["resizing"].get("/metrics")
    in_worker_mode = _complete(served["worker_mode"], [url])

    shipped = stack.metric(after, "pixelwire_frontend_pixel_bytes_total", path="nixl") - stack.metric(
        before, "pixelwire_frontend_pixel_bytes_total", path="nixl"
    )
    source = stack.metric(after, "pixelwire_frontend_source_pixel_bytes_total", path="nixl") - stack.metric(
        before, "pixelwire_frontend_source_pixel_bytes_total", path="nixl"
    )
    print(
        f"\n{name}: {width}x{height} -> {target[1]}x{target[0]}; NIXL bytes {shipped:g} (source {source:g})"
    )
    # Counted at 3 bytes a pixel (height x width x channels), though RGBX moves 4.
    assert shipped == target[0] * target[1] * 3, "the pixels of the target size, and nothing more"
    assert source == height * width * 3
    for got in (resized, in_worker_mode):
        if name.endswith(".png"):
            assert got == reference
        else:
            assert [t for t, _ in got] == [t for t, _ in reference]


def _nixl_bytes(before: str, after: str) -> tuple[float, float]:
    """Pixel bytes a frontend shipped over NIXL between two /metrics texts,
    and the bytes of their sources at 3 a pixel."""

    def grew(name: str) -> float:
        return stack.metric(after, name, path="nixl") - stack.metric(before, name, path="nixl")

    return grew("pixelwire_frontend_pixel_bytes_total"), grew("pixelwire_frontend_source_pixel_bytes_total")


@pytest.mark.parametrize("name", sorted(PHOTOS))
def test_processed_inputs_give_vllms_own_answer(served: dict[str, Any], name: str) -> None:
    """Through `pixelwire frontend --model` (processed inputs, its default), a
    1080p or 4K photo crosses NIXL as its processor's patch rows (uint8,
    each patch once: 3 bytes a pixel of the target size, the worker makes
    the temporal copies) and vLLM answers as on its own loader's full
    image: the same tokens, and the same logprobs for PNG."""
    from pixelwire.processed import patch_layout
    from pixelwire.resize import image_resize_policy

    url = f"{served['images']}/{name}"
    width, height = PHOTOS[name]
    layout = patch_layout(served["model"], {}, image_resize_policy(served["model"]))
    assert layout is not None
    target = layout.target(height, width)
    reference = _complete(served["reference_vllm"], [url])
    before = served["processed"].get("/metrics")
    got = _complete(served["processed"], [url])
    shipped, source = _nixl_bytes(before, served["processed"].get("/metrics"))
    assert shipped == target[0] * target[1] * 3, "the target size's patch rows, and nothing more"
    assert source == height * width * 3
    if name.endswith(".png"):
        assert got == reference
    else:
        assert [t for t, _ in got] == [t for t, _ in reference]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_processed_inputs_of_several_images_stream_vllms_answer(served: dict[str, Any], stream: bool) -> None:
    """Several images in one request, processed at the frontend, streamed or
    not: vLLM's own loader's tokens and logprobs (PNG: lossless), and the
    pool empties once the worker has read them."""
    urls = [stack.data_url(PNG), f"{served['images']}/{OTHER_PNG}", stack.data_url(PNG)]
    got = _complete(served["processed"], urls, stream=stream)
    assert got == _complete(served["reference_vllm"], urls, stream=stream)
    assert _wait_pool_empty(served["processed"], 5.0) == 0


def test_a_frontend_with_another_max_pixels_is_refused(served: dict[str, Any]) -> None:
    """A frontend that resizes for another max_pixels than vLLM's processor
    learns it from the handshake and refuses image requests (502) naming the
    setting, before any decode; never different tokens."""
    import openai

    url = f"{served['images']}/{sorted(PHOTOS)[0]}"
    with pytest.raises(openai.APIStatusError) as refused:
        _complete(served["mismatched"], [url])
    assert refused.value.status_code == 502
    message = str(refused.value)
    assert f"max={OTHER_MAX_PIXELS}" in message and "--mm-processor-kwargs" in message, message


def test_a_conversation_resending_its_images_gets_vllms_tokens_each_turn(served: dict[str, Any]) -> None:
    """Through a frontend with its cache on, turn k resends the earlier
    turns' images: each turn gets vLLM's own loader's tokens and logprobs,
    every image still reaches vLLM over NIXL (a hit is a new hand-out of the
    same slot, with its own notification), and each image is decoded once."""
    a, b = stack.data_url(PNG), stack.data_url(OTHER_PNG)
    before = _metrics(served["pixelwire_vllm"])
    for turn in ([a], [a, b], [a, b, a]):
        assert _complete(served["cached"], turn) == _complete(served["reference_vllm"], turn)
    after = _metrics(served["pixelwire_vllm"])
    read = stack.metric(after, "pixelwire_worker_images_total", path="nixl") - stack.metric(
        before, "pixelwire_worker_images_total", path="nixl"
    )
    assert read == 6
    text = _metrics(served["cached"])
    hits = stack.metric(text, "pixelwire_frontend_cache_hits_total")
    misses = stack.metric(text, "pixelwire_frontend_cache_misses_total")
    assert (hits, misses) == (4, 2)


@pytest.fixture(scope="module")
def resending(served: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A vLLM whose plug-in keeps the images and data: URLs it decoded
    (PIXELWIRE_WORKER_CACHE_BYTES), started with vLLM's shared-memory
    processor cache and tensor IPC (its defaults are the session's vLLM's),
    behind a worker-mode frontend that remembers what it sent
    (--cache-bytes) and a frontend shipping processed inputs."""
    logs = tmp_path_factory.mktemp("resending")
    worker_env = {"PIXELWIRE_SECRET": stack.SECRET, "PIXELWIRE_WORKER_CACHE_BYTES": "64MiB"}
    vllm = stack.start_vllm(
        "vllm-worker-cache", logs, connector="pixelwire", extra_env=worker_env, extra_args=SHM_SETTINGS
    )
    services = [vllm]
    try:
        frontend = stack.start_frontend(
            "frontend-worker-resent", logs, vllm.url, "--decode-at", "worker", "--cache-bytes", "64MiB",
            env={"PIXELWIRE_SECRET": stack.SECRET},
        )  # fmt: skip
        services.append(frontend)
        processed = stack.start_frontend(
            "frontend-processed-shm", logs, vllm.url, *GUARD, "--model", served["model"],
            env={"PIXELWIRE_SECRET": stack.SECRET},
        )  # fmt: skip
        services.append(processed)
        for service in services:
            service.wait_ready("/health", timeout=600)
        yield {"vllm": vllm, "frontend": frontend, "processed": processed}
    finally:
        for service in reversed(services):
            service.stop()


def test_resent_images_go_to_the_worker_as_references_and_get_vllms_tokens(
    served: dict[str, Any], resending: dict[str, Any]
) -> None:
    """Worker mode, both caches on: turn k resends the earlier turns' images
    as data: URLs; the frontend sends each one the worker was sent before
    as a reference to the bytes it holds, and every turn gets vLLM's own
    loader's tokens and logprobs, and the worker decodes each image once."""
    # Both large enough to go as references (a few KiB of base64 at least).
    a, b = stack.data_url(PNG), stack.data_url("flower_thumbnail.png")
    front, vllm = resending["frontend"], resending["vllm"]
    before = _metrics(vllm)
    for turn in ([a], [a, b], [a, b, a]):
        assert _complete(front, turn) == _complete(served["reference_vllm"], turn)
    after = _metrics(vllm)

    def grew(name: str) -> float:
        return stack.metric(after, name, path="url") - stack.metric(before, name, path="url")

    assert grew("pixelwire_worker_images_total") == 6
    assert grew("pixelwire_worker_decode_seconds_count") == 2, "each image decoded once"
    text = _metrics(front)
    assert stack.metric(text, "pixelwire_frontend_resent_references_total") == 4
    assert stack.metric(text, "pixelwire_frontend_resent_not_held_total") == 0


def test_processed_inputs_hold_with_vllms_shared_memory_cache_and_ipc(
    served: dict[str, Any], resending: dict[str, Any]
) -> None:
    """With vLLM's shared-memory processor cache and tensor IPC (and the
    plug-in's own cache on): a conversation resending its images (repeats,
    which the caches serve) through a processed-inputs frontend, streamed
    and not, gets vLLM's own loader's tokens and logprobs every turn. (No
    processor cache at all: the session's bench test serves processed
    inputs with it off, and test_processed_inputs.py compares the outputs.)"""
    a, b = stack.data_url(PNG), f"{served['images']}/photo_1080p.png"
    for stream, turn in ((False, [a]), (True, [a, b]), (False, [a, b, a])):
        expected = _complete(served["reference_vllm"], turn, stream=stream)
        assert _complete(resending["processed"], turn, stream=stream) == expected, (stream, len(turn))
