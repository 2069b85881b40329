"""The plug-in as a drop-in for vLLM's MediaConnector, side by side with it:
vLLM's media settings (retries, download size, timeouts) mean what they
mean, every fault gives the HTTP status vLLM's server gives for it, ``data:``
URLs are as strict as vLLM's, ``image.info`` and ``io_config`` are as vLLM's
loader leaves them, and what pixelwire cannot decode but Pillow can goes to
vLLM's loader. The deliberate differences are docs/architecture.md's
"Differences from vLLM" and are tested where they are made (test_connector.py, test_attacks.py).
"""

from __future__ import annotations

import asyncio
import base64
import http.server
import io
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stack

pytestmark = pytest.mark.vllm

HOPPER = (stack.CORPUS / "hopper.png").read_bytes()


@pytest.fixture(scope="module")
def connectors() -> tuple[Any, Any]:
    """(pixelwire's connector class, a maker of vLLM's): vLLM's with an HTTP
    client of its own (``fetch`` closes it), as each ``asyncio.run`` ends the
    loop vLLM's shared client would belong to."""
    from vllm.connections import HTTPConnection
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    import pixelwire.vllm

    pixelwire.vllm.register()
    vllms = MEDIA_CONNECTOR_REGISTRY.name2class["http"]

    def vllm_connector(**kwargs: Any) -> Any:
        return vllms(connection=HTTPConnection(), **kwargs)

    return MEDIA_CONNECTOR_REGISTRY.name2class["pixelwire"], vllm_connector


@pytest.fixture(autouse=True)
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about vLLM's behaviour, not the address guard: the
    plug-in may reach the loopback servers."""
    monkeypatch.setenv("PIXELWIRE_ALLOW_PRIVATE", "1")


def fetch(connector: Any, url: str) -> Any:
    """``connector.fetch_image_async(url)`` on a loop of its own, the HTTP
    sessions made on it closed when it ends."""
    from vllm.connections import global_http_connection

    from pixelwire.vllm.fetching import close_fetchers

    async def fetch_and_close() -> Any:
        try:
            return await connector.fetch_image_async(url)
        finally:
            await close_fetchers()
            if connector.connection is not global_http_connection:
                await (await connector.connection.get_async_client()).close()

    return asyncio.run(fetch_and_close())


def status_of(connector: Any, url: str) -> int:
    """The HTTP status vLLM's server answers a request for ``url`` with
    (vLLM's own mapping of the exception), 200 when it loads."""
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    try:
        fetch(connector, url)
    except Exception as exc:  # noqa: BLE001 - vLLM's server maps every exception to a status
        return int(create_error_response(exc).error.code)
    return 200


def answering(*replies: tuple[int, bytes]) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    """A recording_server responder: the n-th request gets ``replies[n]``
    (the last one again once they run out)."""
    served = [0]

    def respond(handler: http.server.BaseHTTPRequestHandler) -> None:
        code, body = replies[min(served[0], len(replies) - 1)]
        served[0] += 1
        handler.send_response(code)
        handler.send_header("Content-Type", "image/png")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return respond


def slow(handler: http.server.BaseHTTPRequestHandler) -> None:
    time.sleep(2.5)
    answering((200, HOPPER))(handler)


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on: the connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/a.png"


# -- vLLM's settings -------------------------------------------------------------


def test_a_host_that_fails_once_is_retried_as_vllm_retries(connectors: tuple[Any, Any]) -> None:
    """VLLM_MEDIA_FETCH_MAX_RETRIES (3 by default): a 503 then the image
    loads, with either connector; with 1, neither retries."""
    ours, theirs = connectors
    for cls in (ours, theirs):
        with stack.recording_server(answering((503, b"busy"), (200, HOPPER))) as (base, requests):
            assert status_of(cls(), f"{base}/a.png") == 200
            assert requests == ["GET /a.png"] * 2


def test_one_attempt_when_vllm_is_told_so(
    connectors: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "1")
    ours, theirs = connectors
    for cls in (ours, theirs):
        with stack.recording_server(answering((503, b"busy"), (200, HOPPER))) as (base, requests):
            assert status_of(cls(), f"{base}/a.png") == 500
            assert requests == ["GET /a.png"]


def test_the_download_size_limit_is_vllms(
    connectors: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB: 256 MB by default (a 53 MB image
    loads), a smaller one refuses a larger body with vLLM's 422."""
    from PIL import Image

    ours, theirs = connectors
    big = io.BytesIO()
    Image.new("RGB", (4200, 4200), (10, 20, 30)).save(big, "BMP")
    assert len(big.getvalue()) > 50 * 1024 * 1024  # over the fixed cap pixelwire had
    with stack.recording_server(answering((200, big.getvalue()))) as (base, _):
        image = fetch(ours(), f"{base}/big.bmp")
        assert image.media.size == (4200, 4200)
    monkeypatch.setenv("VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB", "1")
    noise = np.random.default_rng(0).integers(0, 256, (800, 800, 3), dtype=np.uint8)
    png = io.BytesIO()
    Image.fromarray(noise).save(png, "PNG")
    assert len(png.getvalue()) > 1024 * 1024
    with stack.recording_server(answering((200, png.getvalue()))) as (base, _):
        assert status_of(ours(), f"{base}/a.png") == status_of(theirs(), f"{base}/a.png") == 422


def test_the_image_fetch_timeout_is_vllms(
    connectors: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_IMAGE_FETCH_TIMEOUT", "1")
    monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "1")
    ours, _ = connectors
    with stack.recording_server(slow) as (base, _):
        start = time.monotonic()
        assert status_of(ours(), f"{base}/a.png") == 500
        assert time.monotonic() - start < 2.0


def test_the_video_fetch_timeout_is_vllms(
    connectors: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """VLLM_VIDEO_FETCH_TIMEOUT bounds a video URL's fetch (not the image timeout)."""
    import pixelwire

    monkeypatch.setenv("VLLM_VIDEO_FETCH_TIMEOUT", "1")
    monkeypatch.setenv("VLLM_IMAGE_FETCH_TIMEOUT", "30")
    monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "1")
    ours, _ = connectors

    async def fetch_video(url: str) -> Any:
        from pixelwire.vllm.fetching import close_fetchers

        try:
            return await ours().fetch_video_async(url)
        finally:
            await close_fetchers()

    with stack.recording_server(slow) as (base, _):
        start = time.monotonic()
        with pytest.raises(pixelwire.FetchError, match="timed out"):
            asyncio.run(fetch_video(f"{base}/a.mp4"))
        assert time.monotonic() - start < 2.0


def test_vllms_settings_are_read_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """VllmMediaSettings reads vLLM's variables as vllm.envs does."""
    import vllm.envs as envs

    from pixelwire.vllm.media_settings import VllmMediaSettings

    for name, value in [
        ("VLLM_MEDIA_FETCH_MAX_RETRIES", "5"),
        ("VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB", "7"),
        ("VLLM_IMAGE_FETCH_TIMEOUT", "3"),
        ("VLLM_VIDEO_FETCH_TIMEOUT", "40"),
        ("VLLM_MEDIA_URL_ALLOW_REDIRECTS", "0"),
    ]:
        monkeypatch.setenv(name, value)
    settings = VllmMediaSettings.from_env()
    assert settings.attempts == envs.VLLM_MEDIA_FETCH_MAX_RETRIES == 5
    assert settings.max_bytes == envs.VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB * 1024 * 1024
    assert settings.image_timeout == envs.VLLM_IMAGE_FETCH_TIMEOUT
    assert settings.video_timeout == envs.VLLM_VIDEO_FETCH_TIMEOUT
    assert settings.allow_redirects is envs.VLLM_MEDIA_URL_ALLOW_REDIRECTS is False
    for name in ("VLLM_MEDIA_FETCH_MAX_RETRIES", "VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB", "VLLM_MAX_IMAGE_PIXELS"):
        monkeypatch.delenv(name, raising=False)
    defaults = VllmMediaSettings.from_env()
    assert defaults.attempts == envs.VLLM_MEDIA_FETCH_MAX_RETRIES
    assert defaults.max_bytes == envs.VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB * 1024 * 1024
    assert defaults.max_image_pixels == envs.VLLM_MAX_IMAGE_PIXELS
    monkeypatch.setenv("VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB", "0")
    assert VllmMediaSettings.from_env().max_bytes is None


# -- the same status for the same fault ----------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


DATA_FAULTS = {
    "not-base64": "data:text/plain,hello",
    "upper-case-BASE64": "data:image/png;BASE64," + _b64(HOPPER),
    "space-before-base64": "data:image/png; base64," + _b64(HOPPER),
    "base64-as-media-type": "data:base64," + _b64(HOPPER),
    "no-comma": "data:image/png;base64",
    "line-wrapped": "data:image/png;base64,"
    + "\n".join(_b64(HOPPER)[i : i + 76] for i in range(0, len(_b64(HOPPER)), 76)),
    # hopper.png is 3n + 2 bytes long: its base64 ends in one "=".
    "unpadded": "data:image/png;base64," + _b64(HOPPER).rstrip("="),
    "not-an-image": "data:image/png;base64," + _b64(b"hello_vllm_community"),
    "params-before-base64": "data:image/png;charset=utf-8;base64," + _b64(HOPPER),
}


@pytest.mark.parametrize("fault", DATA_FAULTS)
def test_data_urls_are_as_strict_as_vllms(connectors: tuple[Any, Any], fault: str) -> None:
    """501 for what is not base64 (or not spelled ``;base64``), 400 for a
    payload vLLM's decoder refuses, 200 for what it accepts."""
    ours, theirs = connectors
    url = DATA_FAULTS[fault]
    assert status_of(ours(), url) == status_of(theirs(), url)


@pytest.mark.parametrize("code", [400, 403, 404, 410, 500, 502])
def test_an_http_error_gives_vllms_status(
    connectors: tuple[Any, Any], code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """422 for a 4xx from the image host, 500 for a 5xx."""
    monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "1")
    ours, theirs = connectors
    with stack.recording_server(answering((code, b"no"))) as (base, _):
        expected = status_of(theirs(), f"{base}/a.png")
        assert status_of(ours(), f"{base}/a.png") == expected == (422 if code < 500 else 500)


def test_a_refused_connection_and_a_timeout_give_vllms_status(
    connectors: tuple[Any, Any], closed_port_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "1")
    monkeypatch.setenv("VLLM_IMAGE_FETCH_TIMEOUT", "1")
    ours, theirs = connectors
    assert status_of(ours(), closed_port_url) == status_of(theirs(), closed_port_url) == 500
    with stack.recording_server(slow) as (base, _):
        assert status_of(ours(), f"{base}/a.png") == status_of(theirs(), f"{base}/a.png") == 500


def test_local_files_give_vllms_errors(connectors: tuple[Any, Any], tmp_path: Path) -> None:
    """RuntimeError (500) without --allowed-local-media-path, ValueError
    (400) outside it, 500 for a missing file."""
    ours, theirs = connectors
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "hopper.png").write_bytes(HOPPER)
    (tmp_path / "outside.png").write_bytes(HOPPER)
    inside = (tmp_path / "media" / "hopper.png").as_uri()
    outside = f"file://{tmp_path}/media/../outside.png"
    missing = (tmp_path / "media" / "missing.png").as_uri()
    with pytest.raises(RuntimeError, match="Cannot load local files"):
        fetch(ours(), inside)
    with pytest.raises(ValueError, match="must be a subpath"):
        fetch(ours(allowed_local_media_path=str(tmp_path / "media")), outside)
    for url, status in [(inside, 200), (outside, 400), (missing, 500)]:
        local = str(tmp_path / "media")
        assert status_of(ours(allowed_local_media_path=local), url) == status
        assert status_of(theirs(allowed_local_media_path=local), url) == status
    assert status_of(ours(), inside) == status_of(theirs(), inside) == 500


# -- what vLLM's loader leaves on the image ---------------------------------------------

INFO_FILES = [
    "flower2.jpg",
    "rgb.jpg",
    "flower2.webp",
    "tiff_adobe_deflate.tif",
    "xmp_tags_orientation.png",
    "hopper.png",
    "transparent.png",
    "1_trns.png",
    "bw_gradient.png",
    "hopper.bmp",
]


@pytest.mark.parametrize("name", INFO_FILES)
@pytest.mark.parametrize(
    "kwargs", [{}, {"image_mode": "RGBA"}, {"image_mode": "L"}], ids=["default", "RGBA", "L"]
)
def test_icc_profile_and_io_config_are_vllms(
    connectors: tuple[Any, Any], name: str, kwargs: dict[str, Any]
) -> None:
    ours, theirs = (cls(media_io_kwargs={"image": kwargs}) for cls in connectors)
    url = stack.data_url(name)
    got = fetch(ours, url)
    expected = fetch(theirs, url)
    assert got.media.info.get("icc_profile") == expected.media.info.get("icc_profile")
    assert got.io_config == expected.io_config


# -- what Pillow reads and pixelwire does not ---------------------------------------------


@pytest.mark.parametrize(
    "name", ["old-style-jpeg-compression-no-samplesperpixel.tif", "multipage_single_frame_loop.tiff"]
)
def test_an_image_pixelwire_cannot_decode_but_pillow_can_is_vllms(
    connectors: tuple[Any, Any], name: str
) -> None:
    """A DecodeError from pixelwire's decoder, where Pillow's is more lenient:
    the bytes go to vLLM's loader (a limit or a refused URL never does)."""
    ours, theirs = connectors
    url = stack.data_url(name)
    got = fetch(ours(), url)
    expected = fetch(theirs(), url)
    assert got.media.mode == expected.media.mode and got.media.size == expected.media.size
    np.testing.assert_array_equal(np.asarray(got.media), np.asarray(expected.media))


def test_a_pixel_limit_is_not_handed_to_vllms_loader(
    connectors: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_MAX_IMAGE_PIXELS", "100")
    ours, _ = connectors
    with pytest.raises(ValueError, match="pixelwire"):
        fetch(ours(), stack.data_url("hopper.png"))
