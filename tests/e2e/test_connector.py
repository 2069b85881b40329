"""The plug-in's connector in-process, against vLLM's own MediaConnector on
the same inputs: same pixels, same modes, vLLM's settings respected."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import stack

pytestmark = pytest.mark.vllm

LOSSLESS = [
    "hopper.png",
    "transparent.png",
    "different_transparency.gif",
    "hopper.ppm",
    "hopper.bmp",
    "1_trns.png",
    "rgb_trns.png",
    "bw_gradient.png",
    "exif_imagemagick_orientation.png",
    "g4_orientation_6.tif",
]


@pytest.fixture(scope="module")
def connectors() -> tuple[Any, Any]:
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    import pixelwire.vllm

    pixelwire.vllm.register()
    return MEDIA_CONNECTOR_REGISTRY.name2class["pixelwire"], MEDIA_CONNECTOR_REGISTRY.name2class["http"]


def _pixels(image: Any) -> np.ndarray:
    return np.asarray(getattr(image, "media", image))


@pytest.mark.parametrize("name", LOSSLESS)
@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"image_mode": "RGBA"},
        {"image_mode": "L"},
        {"rgba_background_color": [0, 64, 128]},
        {"image_mode": "P"},
    ],
    ids=["default", "RGBA", "L", "background", "P-falls-back"],
)
def test_url_path_gives_vllms_pixels(connectors: tuple[Any, Any], name: str, kwargs: dict[str, Any]) -> None:
    ours, theirs = (cls(media_io_kwargs={"image": kwargs}) for cls in connectors)
    url = stack.data_url(name)
    got = asyncio.run(ours.fetch_image_async(url))
    expected = asyncio.run(theirs.fetch_image_async(url))
    assert got.mode == expected.mode and got.size == expected.size
    np.testing.assert_array_equal(_pixels(got), _pixels(expected))
    # The synchronous loader vLLM's offline path uses agrees.
    np.testing.assert_array_equal(_pixels(ours.fetch_image(url)), _pixels(expected))


class _Slow(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        time.sleep(3)
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/a.png"
    server.shutdown()
    server.server_close()


def test_vllms_allowed_domains_and_fetch_timeout_apply(
    connectors: tuple[Any, Any], slow_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours_cls, _ = connectors
    monkeypatch.setenv("PIXELWIRE_ALLOW_PRIVATE", "1")
    with pytest.raises(ValueError, match="allowed_domains"):
        asyncio.run(ours_cls(allowed_media_domains=["images.test"]).fetch_image_async(slow_server))
    monkeypatch.setenv("VLLM_IMAGE_FETCH_TIMEOUT", "1")

    async def fetch_on_a_loop_that_ends() -> None:
        from pixelwire.vllm import _connector

        try:
            await ours_cls().fetch_image_async(slow_server)
        finally:
            await _connector.close_fetchers()  # no session left behind with this loop

    start = time.monotonic()
    with pytest.raises(ValueError, match="timed out"):
        asyncio.run(fetch_on_a_loop_that_ends())
    assert time.monotonic() - start < 2.5


def test_private_addresses_are_refused_unless_allowed(connectors: tuple[Any, Any], slow_server: str) -> None:
    ours_cls, _ = connectors
    with pytest.raises(ValueError, match="refused"):
        asyncio.run(ours_cls().fetch_image_async(slow_server))


def test_a_descriptor_made_for_another_mode_is_refused(connectors: tuple[Any, Any]) -> None:
    from pixelwire.signing import encode_reference

    ours_cls, _ = connectors
    descriptor = {
        "metadata": {"color_type": "RGB", "format": "PNG", "layout": "RGBX"},
        "pixelwire": {"background": [255, 255, 255]},
    }
    reference = encode_reference(descriptor)
    with pytest.raises(ValueError, match="asks for RGBA"):
        asyncio.run(ours_cls(media_io_kwargs={"image": {"image_mode": "RGBA"}}).fetch_image_async(reference))
    with pytest.raises(ValueError, match="give the frontend the same --media-io-kwargs"):
        background = {"image": {"rgba_background_color": [0, 0, 0]}}
        asyncio.run(ours_cls(media_io_kwargs=background).fetch_image_async(reference))


def test_stack_metric_reader() -> None:
    text = '# HELP x\nx_total{a="1",b="2"} 3.0\nx_total{a="2"} 4\ny 5\n'
    assert stack.metric(text, "x_total", b="2", a="1") == 3.0
    assert stack.metric(text, "x_total", a="2") == 4.0
    assert stack.metric(text, "y") == 5.0
    assert stack.metric(text, "x_total", a="3") == 0.0
