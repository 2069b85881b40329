"""One request's media (``pixelwire.frontend.pipeline``), seen through a
real frontend: images read over NIXL with vLLM's pixels, decoded in batches
of those whose bytes have arrived, formats pixelwire does not decode handed
on as bytes, video and audio fetched through the guard, and every cap and
budget checked before the work it bounds."""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hostile_media
import pytest

import pixelwire
from pixelwire.loader_input import data_url_parts
from pixelwire.resent_reference import MIN_URL_CHARS
from pixelwire.resize import image_resize_policy, video_resize_policy
from pixelwire.video_client import PARAMETER, signed_client, tagged_url

import stack
from frontend_client import (
    SECRET,
    chat,
    expected,
    in_use,
    post,
    post_from,
    send,
    send_chunked,
    started_frontend,
    user,
    wait_empty,
)
from loopback_servers import INFO, Counting, Upstream, worker_info
from reference import CORPUS


@pytest.fixture(scope="module")
def images() -> Iterator[Counting]:
    server = Counting()
    yield server
    server.close()


@pytest.fixture(scope="module")
def open_frontend(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.Service]:
    """A frontend that may fetch from the loopback (the counting image server), default caps."""
    service = stack.start_frontend(
        "open", tmp_path_factory.mktemp("open"), upstream.url, "--allow-private",
        env={"PIXELWIRE_SECRET": SECRET.decode()},
    )  # fmt: skip
    service.wait_ready("/metrics", timeout=60)
    yield service
    service.stop()


def test_images_travel_over_nixl_with_vllms_pixels(frontend: stack.Service) -> None:
    names = ["hopper.png", "transparent.png", "flower2.jpg"]
    status, raw = post(frontend, chat(*(stack.data_url(n) for n in names)))
    assert status == 201  # the upstream's own status
    got = json.loads(raw)["images"]
    assert got[0] == expected("hopper.png")
    assert got[1] == expected("transparent.png")  # RGBA composited on white, as vLLM does
    assert got[2]["shape"] == expected("flower2.jpg")["shape"]
    assert wait_empty(frontend, 5) == 0
    text = frontend.get("/metrics")
    assert stack.metric(text, "pixelwire_frontend_images_total", path="nixl") >= 3


def test_a_chunked_body_is_read_whole_across_its_http_chunks(frontend: stack.Service) -> None:
    """A body sent in HTTP chunks (no Content-Length) is the same body: each
    chunk's end is not the body's."""
    body = json.dumps(chat(stack.data_url("hopper.png"), stack.data_url("flower2.jpg"))).encode()
    status, raw = send_chunked(frontend, "/v1/chat/completions", body, 1000)
    assert status == 201
    got = json.loads(raw)["images"]
    assert got[0] == expected("hopper.png")
    assert got[1]["shape"] == expected("flower2.jpg")["shape"]


def test_pil_reads_match_vllm_too(frontend: stack.Service) -> None:
    urls = (stack.data_url("hopper.png"), stack.data_url("flower2.jpg"))
    status, raw = post(frontend, chat(*urls, model="pil"))
    assert status == 201
    got = json.loads(raw)["images"]
    assert got[0] == expected("hopper.png")
    assert got[1]["shape"] == expected("flower2.jpg")["shape"]


_TRUNCATED_PNG = base64.b64encode((CORPUS / "hopper.png").read_bytes()[:200]).decode()


@pytest.mark.parametrize(
    ("url", "status", "words"),
    [
        ("http://10.0.0.1/a.png", 400, "refused"),
        ("file:///etc/passwd", 400, "refused"),
        (f"data:image/png;base64,{_TRUNCATED_PNG}", 400, "could not decode"),
        ("data:image/png;base64,@@@", 400, ""),
    ],
)
def test_bad_images_are_400s_naming_the_part(
    frontend: stack.Service, upstream: Upstream, url: str, status: int, words: str
) -> None:
    calls = upstream.calls
    code, body = post(frontend, chat(stack.data_url("hopper.png"), url))
    assert code == status, body
    assert body["error"]["param"] == "messages[0].content[1]"
    assert (
        body["error"]["message"].startswith("messages[0].content[1]: ") and words in body["error"]["message"]
    )
    assert body["error"]["type"] == "BadRequestError" and body["error"]["code"] == 400
    assert upstream.calls == calls
    # The image that did decode is freed at once, not at lease end.
    assert wait_empty(frontend, 2) == 0


def test_formats_pixelwire_does_not_decode_pass_through_to_the_worker(frontend: stack.Service) -> None:
    # A rotated CCITT TIFF: vLLM's loader takes it, so the frontend hands its
    # bytes (as fetched, never the URL to fetch again) to the worker's
    # plug-in, which gives them to vLLM's loader, instead of refusing what
    # stock vLLM would accept.
    url = stack.data_url("g4_orientation_6.tif")
    status, raw = post(frontend, chat(url, stack.data_url("hopper.png")))
    assert status == 201
    images = json.loads(raw)["images"]
    assert images[0] == {"url": "data:application/octet-stream;base64," + url.split(",", 1)[1][:3]}
    assert images[1] == expected("hopper.png")
    assert stack.metric(frontend.get("/metrics"), "pixelwire_frontend_images_total", path="passthrough") >= 1


def test_a_format_pixelwire_cannot_vouch_for_is_refused_not_passed_on(
    frontend: stack.Service, upstream: Upstream
) -> None:
    """A PCX image (Pillow reads it, pixelwire neither decodes it nor tells
    it by a signature) is a 400 naming the formats accepted, and nothing is
    forwarded: vLLM's loader would try every Pillow plug-in on it."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buffer, format="PCX")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    calls = upstream.calls
    status, body = post(frontend, chat(url))
    assert status == 400, body
    assert "not one media container" in body["error"]["message"], body
    assert upstream.calls == calls


def _counts(service: stack.Service) -> dict[str, float]:
    text = service.get("/metrics")
    return {
        "nixl": stack.metric(text, "pixelwire_frontend_images_total", path="nixl"),
        "passthrough": stack.metric(text, "pixelwire_frontend_images_total", path="passthrough"),
        "timed": stack.metric(text, "pixelwire_frontend_decode_seconds_count", path="nixl"),
        "released": stack.metric(text, "pixelwire_frontend_released_at_request_end_total"),
        "decode_errors": stack.metric(text, "pixelwire_frontend_errors_total", type="DecodeError"),
    }


def test_a_requests_images_are_decoded_as_one_batch(frontend: stack.Service, upstream: Upstream) -> None:
    """A request's images are decoded side by side, in one batch: each
    arrives with vLLM's pixels, in its place; a format pixelwire does not
    decode among them goes on as its bytes; one that cannot be decoded fails
    the request, naming it, and every image the batch did publish is freed
    at once (not at lease end)."""
    names = ["hopper.png", "flower2.jpg", "g4_orientation_6.tif", "transparent.png", "hopper.png"]
    urls = [stack.data_url(name) for name in names]
    before = _counts(frontend)
    status, raw = post(frontend, chat(*urls))
    assert status == 201, raw
    images = json.loads(raw)["images"]
    assert images[0] == images[4] == expected("hopper.png")
    assert images[1]["shape"] == expected("flower2.jpg")["shape"]
    assert images[2] == {"url": "data:application/octet-stream;base64," + urls[2].split(",", 1)[1][:3]}
    assert images[3] == expected("transparent.png")
    assert wait_empty(frontend, 5) == 0
    after = _counts(frontend)
    assert after["nixl"] - before["nixl"] == 4 and after["timed"] - before["timed"] == 4
    assert after["passthrough"] - before["passthrough"] == 1

    calls = upstream.calls
    corrupt = f"data:image/png;base64,{_TRUNCATED_PNG}"
    code, body = post(frontend, chat(urls[0], urls[1], corrupt, urls[3]))
    assert code == 400, body
    assert body["error"]["param"] == "messages[0].content[2]"
    assert body["error"]["message"].startswith("messages[0].content[2]: could not decode the image: ")
    assert upstream.calls == calls
    assert wait_empty(frontend, 2) == 0
    failed = _counts(frontend)
    assert failed["released"] - after["released"] == 3, (
        "the three published images, freed by the request's end"
    )
    assert failed["decode_errors"] - after["decode_errors"] == 1


def test_decode_at_worker_passes_urls_through_but_checks_them(upstream: Upstream, tmp_path: Path) -> None:
    service = started_frontend(tmp_path, upstream.url, "--decode-at", "worker", "--cache-bytes", "64MiB")
    try:
        url = stack.data_url("hopper.png")
        for _ in range(2):
            # The worker does not show that it keeps what it decoded (no memo
            # label): a resent URL goes in full too.
            code, raw = post(service, chat(url, "https://images.test/a.png"))
            assert code == 201
            assert json.loads(raw)["images"] == [{"url": url[:40]}, {"url": "https://images.test/a.png"}]
        code, body = post(service, chat("https://elsewhere.test/a.png"))
        assert code == 400 and "not in allowed_domains" in body["error"]["message"]
    finally:
        service.stop()


def test_decode_at_worker_signs_a_videos_client_into_its_url(upstream: Upstream, tmp_path: Path) -> None:
    """Worker mode: a video data: URL goes on with its header written anew,
    naming the client that sent it (its address) under the frontend's secret,
    so the plug-in's decode turns know whose it is whatever its bytes; a tag
    the client wrote itself is dropped, and vLLM reads the same media type
    and payload."""
    service = started_frontend(tmp_path, upstream.url, "--decode-at", "worker")
    payload = base64.b64encode(b"\x00\x00\x00\x18ftypisom" + bytes(64)).decode()
    forged = f"data:video/mp4;{PARAMETER}=MTI3LjAuMC45.forged;base64,{payload}"
    try:
        for source in ("127.0.0.2", "127.0.0.3"):
            before = len(upstream.bodies)
            part = {"type": "video_url", "video_url": {"url": forged}}
            post_from(service, {"model": "m", "messages": user(part)}, source, 30)
            sent = upstream.bodies[before]["messages"][0]["content"][0]["video_url"]["url"]
            assert data_url_parts(sent) == data_url_parts(forged)
            assert signed_client(sent, SECRET) == source
    finally:
        service.stop()


def test_images_in_hand_are_decoded_while_others_are_still_fetched(open_frontend: stack.Service) -> None:
    """A request's images are decoded in batches of those whose bytes have
    arrived: its data: images are decoded and published while an http image
    of the same request is still being fetched, and the request completes,
    with every image in its place, once that one arrives."""
    images = Counting()
    before = _counts(open_frontend)["nixl"]
    outcome: list[tuple[int, Any]] = []
    held = f"{images.url}/held/flower2.jpg"
    body = chat(stack.data_url("hopper.png"), held, stack.data_url("transparent.png"))
    request = threading.Thread(target=lambda: outcome.append(post(open_frontend, body)))
    images.release.clear()
    try:
        request.start()
        deadline = time.monotonic() + 20
        while _counts(open_frontend)["nixl"] - before < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # Both data: images decoded before the held fetch ended.
        assert _counts(open_frontend)["nixl"] - before == 2
        assert request.is_alive() and not outcome
    finally:
        images.release.set()
        request.join(30)
        images.close()
    status, raw = outcome[0]
    assert status == 201, raw
    got = json.loads(raw)["images"]
    assert got[0] == expected("hopper.png") and got[2] == expected("transparent.png")
    assert got[1]["shape"] == expected("flower2.jpg")["shape"]
    assert _counts(open_frontend)["nixl"] - before == 3


def test_too_many_images_is_a_400_before_any_fetch(
    open_frontend: stack.Service, upstream: Upstream, images: Counting
) -> None:
    calls = upstream.calls
    status, body = post(open_frontend, chat(*[f"{images.url}/hopper.png"] * 500))
    assert status == 400, body
    message = body["error"]["message"]
    assert "max_images_per_request" in message and "500" in message and "32" in message
    assert images.hits == 0 and upstream.calls == calls
    # Within the cap, the same images are fetched and shipped.
    status, raw = post(open_frontend, chat(*[f"{images.url}/hopper.png"] * 2))
    assert status == 201 and json.loads(raw)["images"] == [expected("hopper.png")] * 2
    assert images.hits == 2


def test_caps_name_their_limit_and_come_before_the_work(
    upstream: Upstream, images: Counting, tmp_path: Path
) -> None:
    size = (CORPUS / "hopper.png").stat().st_size
    service = stack.start_frontend(
        "capped", tmp_path, upstream.url, "--allow-private", "--max-request-bytes", str(1 << 20),
        "--max-images-per-request", "4", "--max-image-bytes-per-request", str(2 * size + 100),
        env={"PIXELWIRE_SECRET": SECRET.decode()},
    )  # fmt: skip
    service.wait_ready("/metrics", timeout=60)
    try:
        calls, hits = upstream.calls, images.hits
        status, _, raw = send(service, "/v1/chat/completions", b" " * (2 << 20))
        assert status == 413 and "max_request_bytes" in json.loads(raw)["error"]["message"]
        assert "1048576" in json.loads(raw)["error"]["message"]
        status, _, raw = send(service, "/v1/models", b" " * (2 << 20), method="GET")
        assert status == 413  # every route
        # Without a Content-Length, counted as it arrives.
        status, raw = send_chunked(service, "/v1/chat/completions", b" " * (2 << 20), 64 << 10)
        assert status == 413 and "max_request_bytes" in json.loads(raw)["error"]["message"]
        status, body = post(service, chat(*[stack.data_url("hopper.png")] * 5))
        assert status == 400 and "max_images_per_request" in body["error"]["message"]
        status, body = post(service, chat(*[stack.data_url("hopper.png")] * 3))
        assert status == 400 and "max_image_bytes_per_request" in body["error"]["message"], body
        assert str(2 * size + 100) in body["error"]["message"]
        assert in_use(service) == 0  # refused before any decode
        # Fetched bodies count as they arrive.
        status, body = post(service, chat(*[f"{images.url}/hopper.png"] * 3))
        assert status == 400 and "max_image_bytes_per_request" in body["error"]["message"], body
        assert upstream.calls == calls and images.hits - hits <= 3
        assert wait_empty(service, 5) == 0
        status, raw = post(service, chat(*[stack.data_url("hopper.png")] * 2))
        assert status == 201 and json.loads(raw)["images"] == [expected("hopper.png")] * 2
    finally:
        service.stop()


def _media_part(kind: str, url: str, spelling: str) -> dict[str, Any]:
    key = f"{kind}_url"
    if spelling == "typed":
        return {"type": key, key: {"url": url}}
    if spelling == "untyped":
        return {key: url}
    return {"type": key, key: {"url": url}, "uuid": "chosen-by-client"}  # uuid: vLLM's untyped branch


@pytest.mark.parametrize("spelling", ["typed", "untyped", "uuid"])
@pytest.mark.parametrize("kind", ["video", "audio"])
def test_video_and_audio_urls_to_private_addresses_are_refused(
    frontend: stack.Service, upstream: Upstream, trap: Counting, kind: str, spelling: str
) -> None:
    """vLLM fetches video_url and audio_url parts itself, with no address
    guard: the frontend's guard refuses them as it refuses images (400
    naming the part), and vLLM never sees the request."""
    calls, hits = upstream.calls, trap.hits
    body = {"model": "m", "messages": user(_media_part(kind, f"{trap.url}/x.mp4", spelling))}
    status, answer = post(frontend, body)
    assert status == 400, answer
    assert answer["error"]["param"] == "messages[0].content[0]", answer
    assert f"{kind} URL refused" in answer["error"]["message"], answer
    assert upstream.calls == calls and trap.hits == hits


def _real_media(kind: str, video_clips: dict[str, bytes]) -> bytes:
    return video_clips["h264_high_bframes.mp4"] if kind == "video" else hostile_media.wav()


@pytest.mark.parametrize("kind", ["video", "audio"])
def test_video_and_audio_are_fetched_through_the_guard_and_handed_on_as_bytes(
    open_frontend: stack.Service,
    upstream: Upstream,
    images: Counting,
    video_clips: dict[str, bytes],
    kind: str,
) -> None:
    """An allowed video or audio URL is fetched once, by the frontend, and
    vLLM gets its bytes as a data: URL (never the URL, which it would fetch
    again past the guard); a data: URL goes on as exactly the bytes it
    holds, however the client spelt it."""
    hits = images.hits
    media = _real_media(kind, video_clips)
    images.made[f"media.{kind}"] = media
    key = f"{kind}_url"
    inline = hostile_media.data_url(media, f"{kind}/Whatever;x=y")
    content = [{"type": key, key: {"url": f"{images.url}/media.{kind}"}}, {"type": key, key: {"url": inline}}]
    status, raw = post(open_frontend, {"model": "m", "messages": user(*content)})
    assert status == 201, raw
    sent = upstream.bodies[-1]["messages"][0]["content"]
    for part in sent:
        assert part[key]["url"].startswith("data:application/octet-stream;base64,")
        assert base64.b64decode(part[key]["url"].split(",", 1)[1]) == media
    assert images.hits == hits + 1


def test_inline_audio_is_checked_and_handed_on_as_the_audio_url_vllm_makes_of_it(
    open_frontend: stack.Service, upstream: Upstream
) -> None:
    """vLLM loads an ``input_audio`` part as the data: URL it makes of it:
    the frontend checks those bytes as any audio's and hands them on as an
    audio_url part."""
    audio = hostile_media.wav()
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"}}
    status, raw = post(open_frontend, {"model": "m", "messages": user(part)})
    assert status == 201, raw
    (sent,) = upstream.bodies[-1]["messages"][0]["content"]
    assert set(sent) == {"type", "audio_url"} and sent["type"] == "audio_url"
    assert base64.b64decode(sent["audio_url"]["url"].split(",", 1)[1]) == audio


# Ways a client hands vLLM's video or audio loader (FFmpeg, every demuxer)
# bytes that are no real container.
_DELIVERIES = {
    "video": ["video/jpegx", "video/mp4", "fetched"],
    "audio": ["audio/wav", "input_audio", "fetched"],
}


@pytest.mark.parametrize("name", ["ffconcat", "sdp", "hls", "dash"])
@pytest.mark.parametrize(
    ("kind", "delivery"), [(kind, how) for kind, ways in _DELIVERIES.items() for how in ways]
)
def test_descriptions_for_vllms_loaders_are_400s_and_never_reach_vllm(
    open_frontend: stack.Service,
    video_frontend: stack.Service,
    upstream: Upstream,
    images: Counting,
    kind: str,
    delivery: str,
    name: str,
) -> None:
    """A concat script, SDP session, HLS playlist or DASH manifest makes
    FFmpeg open other resources (files on vLLM's host, UDP ports): sent as
    a video (in a data: URL whose type only starts like vLLM's JPEG-frame
    form, as MP4, or fetched) or as audio (a data: URL, inline audio, or
    fetched), to a frontend that passes such media on or one that decodes
    videos itself, it is a 400 naming the part, and vLLM never sees it."""
    description = hostile_media.descriptions()[name]
    images.made[f"{name}.bin"] = description
    if delivery == "fetched":
        url = f"{images.url}/{name}.bin"
    else:
        url = hostile_media.data_url(description, delivery if "/" in delivery else "audio/wav")
    if delivery == "input_audio":
        data = base64.b64encode(description).decode()
        part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    else:
        part = {"type": f"{kind}_url", f"{kind}_url": {"url": url}}
    calls = upstream.calls
    for service in (open_frontend, video_frontend):
        status, answer = post(service, {"model": "m", "messages": user(part)})
        assert status == 400, answer
        assert answer["error"]["param"] == "messages[0].content[0]", answer
    assert upstream.calls == calls


@pytest.mark.parametrize(
    ("frames", "words"),
    [
        ([hostile_media.jpeg_claiming(13000, 13000)] * 8, "frame 0 .*169000000 pixels, over the limit"),
        ([hostile_media.jpeg(), hostile_media.jpeg(256, 128)], "not the 128x128 of frame 0"),
        ([hostile_media.jpeg(), hostile_media.ffconcat("x.mp4")], "frame 1 .*unrecognised image format"),
    ],
    ids=["13000x13000-bombs", "two-sizes", "not-a-jpeg"],
)
def test_jpeg_frame_lists_are_checked_from_their_headers_before_vllm_sees_them(
    video_frontend: stack.Service, upstream: Upstream, frames: list[bytes], words: str
) -> None:
    """vLLM decodes a JPEG-frame list with Pillow at any size and stacks the
    frames: the frontend checks each frame's header against the limits
    (naming the setting), refuses in well under a second, takes no memory
    for the frames' pixels, and vLLM never sees the request."""
    part = {"type": "video_url", "video_url": {"url": hostile_media.frame_list(frames)}}
    calls, peak = upstream.calls, stack.peak_rss(video_frontend)
    started = time.monotonic()
    status, answer = post(video_frontend, {"model": "m", "messages": user(part)})
    elapsed = time.monotonic() - started
    assert status == 400, answer
    assert re.search(words, answer["error"]["message"]), answer
    assert upstream.calls == calls
    assert elapsed < 1.0, elapsed
    assert stack.peak_rss(video_frontend) - peak < 100 << 20


def test_a_jpeg_frame_list_goes_on_as_exactly_the_frames_checked(
    video_frontend: stack.Service, upstream: Upstream
) -> None:
    """Spelt as vLLM still reads the frame form (the type in any case, with
    parameters), a list of good frames goes on in the one spelling, each
    frame the bytes the frontend checked."""
    frames = [hostile_media.jpeg(), hostile_media.jpeg()]
    url = hostile_media.frame_list(frames, "VIDEO/JPEG;charset=x")
    status, raw = post(
        video_frontend, {"model": "m", "messages": user({"type": "video_url", "video_url": {"url": url}})}
    )
    assert status == 201, raw
    sent = upstream.bodies[-1]["messages"][0]["content"][0]["video_url"]["url"]
    assert sent == hostile_media.frame_list(frames)


def _flat_png(width: int, height: int) -> str:
    """A data: URL of a one-colour PNG: small bytes, many pixels."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buffer, "PNG", optimize=False)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_pixel_and_pool_budgets_refuse_a_request_before_decoding(upstream: Upstream, tmp_path: Path) -> None:
    """A request's decoded pixels (from the headers) and its images' size in
    the pool are checked before they are decoded: over the pixel cap, or
    more than the whole pool at once (it could never be served), is a 400
    at once, not a decode and a wait for slots that never come."""
    service = started_frontend(
        tmp_path, upstream.url, "--pool-bytes", str(32 << 20), "--region-bytes", str(32 << 20),
        "--max-pixels-per-request", str(9_500_000),
    )  # fmt: skip
    try:
        calls = upstream.calls
        status, answer = post(service, chat(_flat_png(3100, 3100)))  # 9.6 MP
        assert status == 400 and "max_pixels_per_request" in answer["error"]["message"], answer
        # 8.8 MP, 35 MB in the pool (RGBX)
        status, answer = post(service, chat(_flat_png(1000, 1000), _flat_png(2800, 2800)))
        assert status == 400 and "pool_bytes" in answer["error"]["message"], answer
        assert answer["error"]["param"] == "messages[0].content[1]"
        assert upstream.calls == calls
        published = stack.metric(service.get("/metrics"), "pixelwire_frontend_images_total", path="nixl")
        assert published == 0, "nothing was decoded for a refused request"
        # Within both budgets the same images are served.
        status, raw = post(service, chat(_flat_png(2000, 1000), _flat_png(2000, 2000)))
        assert status == 201, raw
        assert wait_empty(service, 5) == 0
    finally:
        service.stop()


def _bomb() -> str:
    """A data: URL of a lossless WebP of 38 bytes that decodes to 16383 x 3051
    (50 MP, inside the default limits)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16383, 3051), (9, 9, 9)).save(buffer, "WEBP", lossless=True, quality=0, method=0)
    return "data:image/webp;base64," + base64.b64encode(buffer.getvalue()).decode()


def _victim_latencies(service: stack.Service, body: dict[str, Any], count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        status, raw = post(service, body)
        latencies.append(time.perf_counter() - started)
        assert status == 201, raw
        time.sleep(0.02)
    return sorted(latencies)


def test_abandoned_pixel_bomb_batches_do_not_stall_another_client(upstream: Upstream, tmp_path: Path) -> None:
    """Seven clients send requests of 8 pixel bombs each (50 MP apiece; with
    the model's resize they pass the pixel and pool budgets) and hang up
    after 3 s, again and again, while another client sends a small image.
    Abandoned batches are cancelled, the decode threads take turns, yield to
    the victim's inline decode and leave it a core: every victim request is
    answered, none is stalled (p99 within 2x its unloaded p99 plus 250 ms,
    a margin for a loaded 2-core CI machine; on the previous main it was
    4.5 s). The tight ratio is measured by benches/abandoned_bombs.py
    (1.4x on an idle 2-core VM)."""
    model = tmp_path / "model"
    model.mkdir()
    config = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 1003520}
    (model / "preprocessor_config.json").write_text(json.dumps(config | {"patch_size": 14, "merge_size": 2}))
    policy = image_resize_policy(model)
    assert policy is not None
    upstream.metrics_text = worker_info(resize=policy.identity)  # a worker resizing alike
    service = started_frontend(tmp_path, upstream.url, "--model", str(model))
    bomb = _bomb()
    victim = chat(_flat_png(640, 480))
    try:
        calm = _victim_latencies(service, victim, 100)
        stop = time.monotonic() + 8
        outcomes: list[str] = []

        def attacker() -> None:
            data = json.dumps(chat(*[bomb] * 8)).encode()
            while time.monotonic() < stop:
                connection = http.client.HTTPConnection("127.0.0.1", service.port, timeout=3)
                try:
                    connection.request("POST", "/v1/chat/completions", body=data)
                    outcomes.append(str(connection.getresponse().status))
                except TimeoutError:
                    outcomes.append("hung up")
                finally:
                    connection.close()

        attackers = [threading.Thread(target=attacker) for _ in range(7)]
        for thread in attackers:
            thread.start()
        time.sleep(1)
        hot = _victim_latencies(service, victim, 100)
        for thread in attackers:
            thread.join()
        p99_calm, p99_hot = calm[98], hot[98]
        print(
            f"\n  victim p50/p99 unloaded {calm[50] * 1e3:.1f}/{p99_calm * 1e3:.1f} ms, under attack "
            f"{hot[50] * 1e3:.1f}/{p99_hot * 1e3:.1f} ms ({p99_hot / p99_calm:.2f}x); attack requests: "
            f"{sorted(outcomes)[:3]}... {len(outcomes)}"
        )
        assert "hung up" in outcomes, "the attackers must have abandoned batches"
        assert p99_hot <= 2 * p99_calm + 0.25
        assert wait_empty(service, 20) == 0
    finally:
        service.stop()
        upstream.metrics_text = INFO


@pytest.fixture(scope="module")
def video_frontend(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.Service]:
    """A frontend told vLLM's video loader (``video_backend``) and its frame
    count, that honours a request's own media_io_kwargs (as a vLLM started
    with --trust-request-mm-kwargs)."""
    video_kwargs = json.dumps({"video": {"video_backend": "opencv", "num_frames": 4}})
    service = started_frontend(
        tmp_path_factory.mktemp("video"),
        upstream.url,
        "--media-io-kwargs",
        video_kwargs,
        "--max-video-frames",
        "8",
        "--trust-request-mm-kwargs",
    )
    yield service
    service.stop()


def _video_part(data: bytes) -> dict[str, Any]:
    url = "data:video/mp4;base64," + base64.b64encode(data).decode()
    return {"type": "video_url", "video_url": {"url": url}}


def _frames_seen(frames: Any) -> dict[str, Any]:
    """What the upstream reports for frames read over NIXL."""
    return {"shape": list(frames.shape), "sha": hashlib.sha256(frames).hexdigest()}


def test_videos_are_sampled_here_and_read_over_nixl_as_vllms_loader_would(
    video_frontend: stack.Service, upstream: Upstream, video_clips: dict[str, bytes]
) -> None:
    """With the loader known, a video_url part is fetched, sampled and
    decoded at the frontend, and the worker reads exactly the frames vLLM's
    loader would have returned, at the server's frame count or the
    request's (``media_io_kwargs``, merged as vLLM merges it); the slots are
    freed by the reads."""
    clips = [video_clips["h264_high_bframes.mp4"], video_clips["vp9_odd_853x480.webm"]]
    status, answer = post(video_frontend, {"model": "m", "messages": user(*map(_video_part, clips))})
    assert status == 201, answer
    sent = upstream.bodies[-1]["messages"][0]["content"]
    assert all(part["video_url"]["url"].startswith("pixelwire:") for part in sent)
    assert json.loads(answer)["images"] == [
        _frames_seen(pixelwire.decode_video(data, num_frames=4)[0]) for data in clips
    ]
    body = {
        "model": "m",
        "messages": user(_video_part(clips[0])),
        "media_io_kwargs": {"video": {"num_frames": 2}},
    }
    status, answer = post(video_frontend, body)
    assert status == 201, answer
    assert json.loads(answer)["images"] == [_frames_seen(pixelwire.decode_video(clips[0], num_frames=2)[0])]
    assert wait_empty(video_frontend, 10) == 0


def test_a_qwen3_vl_models_videos_ship_at_its_video_processors_size(
    upstream: Upstream, video_clips: dict[str, bytes], tmp_path: Path
) -> None:
    """With ``--model`` of a Qwen3-VL model (``Qwen3VLVideoProcessor``), the
    frontend samples as vLLM's ``qwen3_vl`` loader and ships each frame at
    the size that processor makes the video (its budget over the sampled
    frames): the frames ``decode_video(resize=)`` gives with the model's
    policy."""
    model = tmp_path / "qwen3"
    model.mkdir()
    image = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 16, "merge_size": 2}
    image |= {"min_pixels": 3136, "max_pixels": 50176}
    (model / "preprocessor_config.json").write_text(json.dumps(image))
    video = {"video_processor_type": "Qwen3VLVideoProcessor"}
    video |= {"size": {"shortest_edge": 4096, "longest_edge": 200000}}
    (model / "video_preprocessor_config.json").write_text(json.dumps(video))
    image_policy, video_policy = image_resize_policy(model), video_resize_policy(model)
    assert image_policy is not None and video_policy is not None and video_policy.video_frames
    upstream.metrics_text = worker_info(resize=image_policy.identity)  # a worker resizing alike
    service = started_frontend(tmp_path, upstream.url, "--model", str(model))
    clip = video_clips["h264_high_bframes.mp4"]
    try:
        status, answer = post(service, {"model": "m", "messages": user(_video_part(clip))})
        assert status == 201, answer
        frames, _ = pixelwire.decode_video(clip, loader="qwen3_vl", resize=video_policy)
        assert frames.shape[1:3] == video_policy.video_target(240, 320, 4, 24) != (240, 320)
        assert json.loads(answer)["images"] == [_frames_seen(frames)]
        assert wait_empty(service, 10) == 0
    finally:
        service.stop()
        upstream.metrics_text = INFO


def test_bad_videos_are_400s_naming_the_part_and_the_setting(
    video_frontend: stack.Service, upstream: Upstream, video_clips: dict[str, bytes]
) -> None:
    """A video over a frontend limit (checked before any frame is decoded)
    or with no decodable frame is a 400 naming the part, and the limit's
    setting; vLLM never sees the request."""
    good = video_clips["h264_baseline.mkv"]
    calls = upstream.calls
    over = {
        "model": "m",
        "messages": user(_video_part(good)),
        "media_io_kwargs": {"video": {"num_frames": 10}},
    }
    status, answer = post(video_frontend, over)
    assert status == 400, answer
    assert answer["error"]["param"] == "messages[0].content[0]"
    assert "--max-video-frames" in answer["error"]["message"], answer
    zeroed = good[:600] + bytes(len(good) - 600)
    status, answer = post(video_frontend, {"model": "m", "messages": user(_video_part(zeroed))})
    assert status == 400, answer
    assert "could not decode the video" in answer["error"]["message"], answer
    assert upstream.calls == calls
    assert wait_empty(video_frontend, 10) == 0


def test_videos_pixelwire_does_not_decode_go_on_as_their_bytes(
    video_frontend: stack.Service, upstream: Upstream, bad_videos: dict[str, bytes]
) -> None:
    """A codec pixelwire does not decode (FFV1) goes on as its bytes, for
    vLLM's own loader; so does a request whose video settings pixelwire does
    not reproduce (another decoding backend)."""
    for clip, extra in [
        (bad_videos["ffv1.mkv"], {}),
        (bad_videos["h264_moov_last.mp4"], {"media_io_kwargs": {"video": {"backend": "torchcodec"}}}),
    ]:
        status, answer = post(video_frontend, {"model": "m", "messages": user(_video_part(clip)), **extra})
        assert status == 201, answer
        sent = upstream.bodies[-1]["messages"][0]["content"][0]["video_url"]["url"]
        assert sent.startswith("data:application/octet-stream;base64,")
        assert base64.b64decode(sent.split(",", 1)[1]) == clip


def test_repeated_images_are_decoded_once_per_salt(upstream: Upstream, tmp_path: Path) -> None:
    """A conversation resending its earlier images (``--cache-bytes`` on):
    each image is decoded once, every turn still gets vLLM's pixels, a
    request with another ``cache_salt`` decodes for itself, and a
    ``cache_salt`` that is not a string is refused. Once every image is
    read, the pool holds what the cache keeps, nothing more."""
    service = started_frontend(tmp_path, upstream.url, "--cache-bytes", "64MiB")
    try:
        a, b = stack.data_url("hopper.png"), stack.data_url("flower2.jpg")
        for turn in ([a], [a, b], [a, b, a]):
            status, raw = post(service, chat(*turn, cache_salt="tenant-1"))
            assert status == 201, raw
            want = {a: expected("hopper.png"), b: expected("flower2.jpg")}
            assert json.loads(raw)["images"] == [want[url] for url in turn]
        status, raw = post(service, chat(a, cache_salt="tenant-2"))
        assert status == 201 and json.loads(raw)["images"] == [expected("hopper.png")]
        code, body = post(service, chat(a, cache_salt=7))
        assert code == 400 and body["error"]["param"] == "cache_salt", body
        text = service.get("/metrics")
        hits = stack.metric(text, "pixelwire_frontend_cache_hits_total")
        misses = stack.metric(text, "pixelwire_frontend_cache_misses_total")
        assert (hits, misses) == (4, 3)
        # A resent data: URL is neither decoded nor hashed again, per salt:
        # tenant-1's five resends (tenant-2's first send is its own).
        assert stack.metric(text, "pixelwire_frontend_data_url_hits_total") == 4
        assert stack.metric(text, "pixelwire_frontend_data_url_bytes") > 0
        deadline = time.monotonic() + 5
        while in_use(service) != stack.metric(service.get("/metrics"), "pixelwire_frontend_cache_bytes"):
            assert time.monotonic() < deadline, "the pool holds more than the cache keeps"
            time.sleep(0.1)
    finally:
        service.stop()


def test_a_resent_video_is_sampled_and_decoded_once_per_salt(
    upstream: Upstream, video_clips: dict[str, bytes], tmp_path: Path
) -> None:
    """A conversation resending its video (``--cache-bytes`` on): turn 2
    is a hand-out of turn 1's frames, not decoded again, and reads the
    same frames; another frame count or ``cache_salt`` decodes for itself.
    Once every video is read, the pool holds what the cache keeps."""
    video_kwargs = json.dumps({"video": {"video_backend": "opencv", "num_frames": 4}})
    service = started_frontend(
        tmp_path, upstream.url, "--cache-bytes", "64MiB", "--media-io-kwargs", video_kwargs,
        "--trust-request-mm-kwargs",
    )  # fmt: skip
    clip = video_clips["h264_high_bframes.mp4"]
    four = _frames_seen(pixelwire.decode_video(clip, num_frames=4)[0])
    two = _frames_seen(pixelwire.decode_video(clip, num_frames=2)[0])
    try:
        bodies = [
            {"model": "m", "messages": user(_video_part(clip)), "cache_salt": "tenant-1"},
            {"model": "m", "messages": user(_video_part(clip)), "cache_salt": "tenant-1"},
            {"model": "m", "messages": user(_video_part(clip)), "cache_salt": "tenant-2"},
            {
                "model": "m",
                "messages": user(_video_part(clip)),
                "cache_salt": "tenant-1",
                "media_io_kwargs": {"video": {"num_frames": 2}},
            },
        ]
        for body, frames in zip(bodies, [four, four, four, two], strict=True):
            status, answer = post(service, body)
            assert status == 201, answer
            assert json.loads(answer)["images"] == [frames]
        text = service.get("/metrics")
        hits = stack.metric(text, "pixelwire_frontend_cache_hits_total")
        misses = stack.metric(text, "pixelwire_frontend_cache_misses_total")
        assert (hits, misses) == (1, 3)
        deadline = time.monotonic() + 5
        while in_use(service) != stack.metric(service.get("/metrics"), "pixelwire_frontend_cache_bytes"):
            assert time.monotonic() < deadline, "the pool holds more than the cache keeps"
            time.sleep(0.1)
    finally:
        service.stop()


def test_a_resent_data_url_goes_to_the_worker_as_a_reference_to_the_bytes_it_holds(tmp_path: Path) -> None:
    """Worker mode, the worker's handshake showing this frontend's secret
    and its memo: a data: URL sent in full in a request the worker answered
    goes on, when the same text comes again under the same salt, as a
    signed reference naming the SHA-256 and size of its bytes; a URL seen
    for the first time, or under another salt, goes in full. When the
    worker answers that it no longer holds one, the request goes once more
    with its URLs in full, and its answer is the client's."""
    upstream = Upstream()
    upstream.metrics_text = worker_info(memo="1")
    service = started_frontend(tmp_path, upstream.url, "--decode-at", "worker", "--cache-bytes", "64MiB")
    try:
        hopper, flower = stack.data_url("hopper.png"), stack.data_url("flower2.jpg")
        data = (CORPUS / "hopper.png").read_bytes()
        named = {"resent": hashlib.sha256(data).hexdigest(), "bytes": len(data)}

        def images(*urls: str, **extra: Any) -> list[dict[str, Any]]:
            code, raw = post(service, chat(*urls, **extra))
            assert code == 201, raw
            return list(json.loads(raw)["images"])

        assert images(hopper) == [{"url": hopper[:40]}]
        assert images(hopper, flower) == [named, {"url": flower[:40]}]
        sent = json.dumps(upstream.bodies[-1])
        assert len(sent) < len(flower) + 2000, "the resent image went as a reference, not its bytes"
        assert images(hopper, cache_salt="another-tenant") == [{"url": hopper[:40]}]
        assert images(hopper, cache_salt="another-tenant") == [named]
        metrics = service.get("/metrics")
        assert stack.metric(metrics, "pixelwire_frontend_resent_references_total") == 2

        upstream.not_held = 1
        calls = upstream.calls
        assert images(hopper, flower) == [{"url": hopper[:40]}, {"url": flower[:40]}]
        assert upstream.calls == calls + 2, "sent once more, in full"
        assert stack.metric(service.get("/metrics"), "pixelwire_frontend_resent_not_held_total") == 1
        # Noted again from the request that went in full.
        assert images(hopper) == [named]
    finally:
        service.stop()
        upstream.close()


def test_a_resent_video_data_url_goes_to_the_worker_as_a_reference_to_the_bytes_it_holds(
    tmp_path: Path, video_clips: dict[str, bytes]
) -> None:
    """Worker mode: a video's data: URL resent with a chat's later turn goes,
    as an image's does, as a signed reference naming its bytes' SHA-256
    and size (a few hundred bytes upstream instead of the video's base64);
    a JPEG-frame list goes as it came. The worker no longer holding the
    bytes sends the request once more in full."""
    upstream = Upstream()
    upstream.metrics_text = worker_info(memo="1")
    service = started_frontend(tmp_path, upstream.url, "--decode-at", "worker", "--cache-bytes", "64MiB")
    try:
        clip = video_clips["h264_high_bframes.mp4"]
        video = _video_part(clip)
        url = video["video_url"]["url"]
        named = {"resent": hashlib.sha256(clip).hexdigest(), "bytes": len(clip)}
        frames_url = hostile_media.frame_list([hostile_media.jpeg()] * 8)
        frames = {"type": "video_url", "video_url": {"url": frames_url}}
        assert len(frames_url) > MIN_URL_CHARS, "long enough to go as a reference, were it not a frame list"

        def sent(*content: dict[str, Any]) -> list[dict[str, Any]]:
            code, raw = post(service, {"model": "m", "messages": user(*content)})
            assert code == 201, raw
            return list(json.loads(raw)["images"])

        # Sent in full, a video's data: URL carries the client's signed tag.
        in_full = {"url": tagged_url(url, "127.0.0.1", SECRET)[:40]}
        assert sent(video, frames) == [in_full, {"url": frames_url[:40]}]
        assert sent(video, frames) == [named, {"url": frames_url[:40]}]
        assert len(json.dumps(upstream.bodies[-1])) < len(frames_url) + 2000, "the video went as a reference"
        assert stack.metric(service.get("/metrics"), "pixelwire_frontend_resent_references_total") == 1
        upstream.not_held = 1
        calls = upstream.calls
        assert sent(video) == [in_full]
        assert upstream.calls == calls + 2, "sent once more, in full"
    finally:
        service.stop()
        upstream.close()
