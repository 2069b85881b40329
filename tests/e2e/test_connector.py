"""The plug-in's connector in-process, against vLLM's own MediaConnector on
the same inputs: same pixels, same modes, vLLM's settings respected."""

from __future__ import annotations

import asyncio
import http.server
import json
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import pixelwire

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
    monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "1")

    async def fetch_on_a_loop_that_ends() -> None:
        from pixelwire.vllm import fetching

        try:
            await ours_cls().fetch_image_async(slow_server)
        finally:
            await fetching.close_fetchers()  # no session left behind with this loop

    start = time.monotonic()
    # vLLM's server answers a timeout with 500, as it answers its own loader's.
    with pytest.raises(pixelwire.FetchError, match="timed out"):
        asyncio.run(fetch_on_a_loop_that_ends())
    assert time.monotonic() - start < 2.5


def test_private_addresses_are_refused_unless_allowed(connectors: tuple[Any, Any], slow_server: str) -> None:
    ours_cls, _ = connectors
    with pytest.raises(ValueError, match="refused"):
        asyncio.run(ours_cls().fetch_image_async(slow_server))


class _Counting(http.server.BaseHTTPRequestHandler):
    hits = 0

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", "4")
        self.end_headers()
        self.wfile.write(b"trap")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("medium", ["video", "audio"])
def test_every_medium_vllm_fetches_goes_through_the_guard(
    connectors: tuple[Any, Any], medium: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's own loaders fetch video and audio URLs with no address guard;
    with the plug-in, every URL vLLM fetches passes pixelwire's guard (async
    and sync), and a data: URL stays vLLM's (no fetch)."""
    ours_cls, _ = connectors
    monkeypatch.delenv("PIXELWIRE_ALLOW_PRIVATE", raising=False)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/a.mp4"
    try:
        connector = ours_cls()
        fetch_async = getattr(connector, f"fetch_{medium}_async")
        with pytest.raises(ValueError, match="refused"):
            asyncio.run(fetch_async(url))
        with pytest.raises(ValueError, match="refused"):
            getattr(connector, f"fetch_{medium}")(url.replace("127.0.0.1", "localhost"))
        with pytest.raises(ValueError, match="allowed_domains"):
            asyncio.run(
                getattr(ours_cls(allowed_media_domains=["images.test"]), f"fetch_{medium}_async")(url)
            )
        assert _Counting.hits == 0, "the guard let a fetch through"
        # Allowed, the bytes reach vLLM's own loader (which finds no medium in them).
        monkeypatch.setenv("PIXELWIRE_ALLOW_PRIVATE", "1")
        with pytest.raises(Exception) as failed:
            asyncio.run(fetch_async(url))
        assert "refused" not in str(failed.value)
        assert _Counting.hits == 1
    finally:
        server.shutdown()
        server.server_close()
        _Counting.hits = 0


def test_a_read_image_is_keyed_by_its_signed_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM keys its caches on what its hasher reads from an item. For an
    image the plug-in read over NIXL that is the signed identity (source
    digest, mode, background, resize policy) keyed with PIXELWIRE_SECRET:
    not the pixels, which anyone who has the image can hash as vLLM does."""
    from PIL import Image
    from vllm.multimodal.hasher import MultiModalHasher
    from vllm.multimodal.media import MediaWithBytes

    from pixelwire.vllm.identity import cache_identity

    image = Image.new("RGB", (8, 8), (1, 2, 3))

    def key(item: Any) -> str:
        return str(MultiModalHasher.hash_kwargs("sha256", model_id="m", image=item))

    monkeypatch.setenv("PIXELWIRE_SECRET", "one")
    one = cache_identity("ab" * 32, "RGB", (255, 255, 255), "")
    assert key(MediaWithBytes(image, one)) == key(MediaWithBytes(image.copy(), one))
    assert key(MediaWithBytes(image, one)) != key(image), "not the pixels' hash"
    assert key(MediaWithBytes(image, one)) == key(MediaWithBytes(Image.new("RGB", (2, 2)), one))
    for other in (
        cache_identity("cd" * 32, "RGB", (255, 255, 255), ""),
        cache_identity("ab" * 32, "RGB", (0, 0, 0), ""),
        cache_identity("ab" * 32, "RGB", (255, 255, 255), "qwen2_vl:smart"),
    ):
        assert other != one
    monkeypatch.setenv("PIXELWIRE_SECRET", "two")
    assert cache_identity("ab" * 32, "RGB", (255, 255, 255), "") != one, "keyed with the secret"


@pytest.fixture
def unsigned_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests hand the connector unsigned references on purpose."""
    monkeypatch.delenv("PIXELWIRE_SECRET", raising=False)
    monkeypatch.setenv("PIXELWIRE_ALLOW_UNSIGNED", "1")


OTHER_MODE = {
    "metadata": {"color_type": "RGB", "format": "PNG", "layout": "RGBX"},
    "pixelwire": {"background": [255, 255, 255]},
}


def test_a_descriptor_made_for_another_mode_is_refused(
    connectors: tuple[Any, Any], unsigned_allowed: None
) -> None:
    from pixelwire.signing import encode_reference

    ours_cls, _ = connectors
    reference = encode_reference(OTHER_MODE)
    with pytest.raises(ValueError, match="asks for RGBA"):
        asyncio.run(ours_cls(media_io_kwargs={"image": {"image_mode": "RGBA"}}).fetch_image_async(reference))
    with pytest.raises(ValueError, match="give the frontend the same --media-io-kwargs"):
        background = {"image": {"rgba_background_color": [0, 0, 0]}}
        asyncio.run(ours_cls(media_io_kwargs=background).fetch_image_async(reference))


def test_an_unsigned_reference_is_refused_by_default(
    connectors: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pixelwire.signing import encode_reference

    ours_cls, _ = connectors
    monkeypatch.delenv("PIXELWIRE_SECRET", raising=False)
    monkeypatch.delenv("PIXELWIRE_ALLOW_UNSIGNED", raising=False)
    secret = b"connector-test-secret"
    # With neither setting even a signed reference is refused: nothing to check it with.
    for reference in (encode_reference(OTHER_MODE), encode_reference(OTHER_MODE, secret)):
        for flag in (None, "on", "1 "):  # typos are the default: refused
            if flag is not None:
                monkeypatch.setenv("PIXELWIRE_ALLOW_UNSIGNED", flag)
            with pytest.raises(ValueError, match=r"PIXELWIRE_SECRET.*PIXELWIRE_ALLOW_UNSIGNED=1"):
                asyncio.run(ours_cls().fetch_image_async(reference))
        monkeypatch.delenv("PIXELWIRE_ALLOW_UNSIGNED")
    # With a secret, PIXELWIRE_ALLOW_UNSIGNED=1 lets nothing unsigned through.
    monkeypatch.setenv("PIXELWIRE_SECRET", secret.decode())
    monkeypatch.setenv("PIXELWIRE_ALLOW_UNSIGNED", "1")
    with pytest.raises(ValueError, match="unsigned"):
        asyncio.run(ours_cls().fetch_image_async(encode_reference(OTHER_MODE)))
    # The signed one gets past the signature (to the mode check).
    rgba = ours_cls(media_io_kwargs={"image": {"image_mode": "RGBA"}})
    with pytest.raises(ValueError, match="asks for RGBA"):
        asyncio.run(rgba.fetch_image_async(encode_reference(OTHER_MODE, secret)))


@pytest.mark.parametrize(
    "own",
    [
        {"background": 5},
        {"background": [0, 0, 256]},
        {"background": "abc"},
        {"resize": {"policy": "p", "source": [2**64, 1]}},
        {"resize": {"policy": "p", "source": [True, True]}},
    ],
    ids=["background-int", "background-256", "background-str", "source-2^64", "source-bool"],
)
def test_malformed_pixelwire_fields_are_400s(
    connectors: tuple[Any, Any], unsigned_allowed: None, own: dict[str, Any]
) -> None:
    from pixelwire.signing import encode_reference

    ours_cls, _ = connectors
    descriptor = {
        "metadata": {"color_type": "RGB", "format": "PNG", "layout": "HWC"},
        "shape": [1, 1, 3],
        "pixelwire": {"background": [255, 255, 255]} | own,
    }
    key = next(iter(own))
    with pytest.raises(ValueError, match=f"pixelwire.{key}"):
        asyncio.run(ours_cls().fetch_image_async(encode_reference(descriptor)))


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({}, "every reference refused"),
        ({"PIXELWIRE_ALLOW_UNSIGNED": "1"}, "unsigned accepted"),
        ({"PIXELWIRE_SECRET": "s"}, "signatures required"),
    ],
    ids=["neither", "allow-unsigned", "secret"],
)
def test_start_up_logs_the_signing_policy(
    connectors: tuple[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    env: dict[str, str],
    words: str,
) -> None:
    import pixelwire.vllm

    monkeypatch.delenv("PIXELWIRE_SECRET", raising=False)
    monkeypatch.delenv("PIXELWIRE_ALLOW_UNSIGNED", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("VLLM_MEDIA_CONNECTOR", "pixelwire")
    with caplog.at_level("INFO", logger="pixelwire.vllm"):
        pixelwire.vllm.register()
    logged = [r for r in caplog.records if "descriptor references" in r.getMessage()]
    assert len(logged) == 1 and words in logged[0].getMessage()
    assert logged[0].levelname == ("ERROR" if not env else "WARNING" if "1" in env.values() else "INFO")


@pytest.fixture
def local_images(tmp_path: Any) -> Iterator[str]:
    import shutil

    shutil.copy(stack.CORPUS / "hopper.png", tmp_path / "hopper.png")
    with stack.image_server(tmp_path) as base:
        yield f"{base}/hopper.png"


def test_modes_left_to_vllm_are_still_fetched_through_the_guard(
    connectors: tuple[Any, Any], local_images: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """image_mode P (and None: keep the file's mode) are decoded by vLLM's
    loader, but fetched by pixelwire's Fetcher: a private address is refused
    as for every other URL, where vLLM's own loader would fetch it."""
    ours_cls, theirs_cls = connectors
    monkeypatch.delenv("PIXELWIRE_ALLOW_PRIVATE", raising=False)
    for kwargs, mode in (({"image": {"image_mode": "P"}}, "RGB"), ({}, "P"), ({}, None)):
        # (vLLM's synchronous loader: its async one keeps a session per process, not per loop.)
        assert theirs_cls(media_io_kwargs=kwargs).fetch_image(local_images, image_mode=mode)
        ours = ours_cls(media_io_kwargs=kwargs)
        with pytest.raises(ValueError, match="refused"):
            ours.fetch_image(local_images, image_mode=mode)
        with pytest.raises(ValueError, match="refused"):
            asyncio.run(ours.fetch_image_async(local_images, image_mode=mode))
        with pytest.raises(ValueError, match="allowed_domains"):
            allowed = ours_cls(media_io_kwargs=kwargs, allowed_media_domains=["images.test"])
            asyncio.run(allowed.fetch_image_async(local_images, image_mode=mode))


def test_an_allowed_url_in_a_mode_left_to_vllm_gives_vllms_result(
    connectors: tuple[Any, Any], local_images: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours_cls, theirs_cls = connectors
    monkeypatch.setenv("PIXELWIRE_ALLOW_PRIVATE", "1")
    for kwargs, mode in (({"image": {"image_mode": "P"}}, "RGB"), ({}, "P"), ({}, None)):
        ours, theirs = ours_cls(media_io_kwargs=kwargs), theirs_cls(media_io_kwargs=kwargs)
        expected = theirs.fetch_image(local_images, image_mode=mode)
        for got in (
            ours.fetch_image(local_images, image_mode=mode),
            asyncio.run(ours.fetch_image_async(local_images, image_mode=mode)),
        ):
            assert type(got) is type(expected)
            assert got.mode == expected.mode and got.size == expected.size
            np.testing.assert_array_equal(_pixels(got), _pixels(expected))
            assert getattr(got, "original_bytes", None) == getattr(expected, "original_bytes", None)
            assert getattr(got, "io_config", None) == getattr(expected, "io_config", None)


def test_a_reference_is_parsed_once_per_read(
    connectors: tuple[Any, Any], unsigned_allowed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connector parses a reference's descriptor once, checks it, and
    hands the parsed image to the reader (`Reader.read_remote`): the
    descriptor is not parsed a second time on its way to NIXL, and the
    pixels are the image's."""
    import pixelwire
    from pixelwire import descriptor, reader
    from pixelwire.signing import encode_reference
    from pixelwire.vllm import connector

    parses: list[object] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        parses.append(args[0])
        return descriptor.parse_descriptor(*args, **kwargs)

    monkeypatch.setattr(connector, "parse_descriptor", counted)
    monkeypatch.setattr(reader, "parse_descriptor", counted)
    data = (stack.CORPUS / "hopper.png").read_bytes()
    ours_cls, _ = connectors

    async def main() -> Any:
        async with pixelwire.Publisher() as publisher:
            decoded = await publisher.decode_and_publish(data)
            return await ours_cls().fetch_image_async(encode_reference(decoded.to_dict()))

    image = asyncio.run(main())
    assert len(parses) == 1
    np.testing.assert_array_equal(_pixels(image), pixelwire.decode_image(data))


def test_stack_metric_reader() -> None:
    text = '# HELP x\nx_total{a="1",b="2"} 3.0\nx_total{a="2"} 4\ny 5\n'
    assert stack.metric(text, "x_total", b="2", a="1") == 3.0
    assert stack.metric(text, "x_total", a="2") == 4.0
    assert stack.metric(text, "y") == 5.0
    assert stack.metric(text, "x_total", a="3") == 0.0


def test_the_worker_declares_its_settings_for_the_handshake(
    connectors: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """pixelwire_worker_info, on vLLM's /metrics, carries the settings a
    frontend compares with its own: version, connector, the secret's
    fingerprint (never the secret), the unsigned and private policies, the
    resize policy of PIXELWIRE_MODEL/PIXELWIRE_MM_PROCESSOR_KWARGS, or
    without them of vLLM's --model and --mm-processor-kwargs, whether it
    keeps the data: URLs it decoded (PIXELWIRE_WORKER_CACHE_BYTES), and the
    processed inputs it takes."""
    import json

    from prometheus_client import REGISTRY, generate_latest

    import pixelwire
    from pixelwire.handshake import worker_settings_in
    from pixelwire.resize import image_resize_policy
    from pixelwire.signing import secret_fingerprint
    from pixelwire.vllm import worker_settings

    declared = worker_settings_in(generate_latest(REGISTRY).decode())
    assert declared is not None and declared.version == pixelwire.__version__
    assert "connector" in declared.labels() and declared.secret != "unknown"
    qwen = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 1 << 20}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(qwen))
    monkeypatch.setenv("PIXELWIRE_SECRET", "worker-secret")
    monkeypatch.setenv("PIXELWIRE_ALLOW_PRIVATE", "1")
    monkeypatch.delenv("PIXELWIRE_ALLOW_UNSIGNED", raising=False)
    monkeypatch.setenv("PIXELWIRE_MODEL", str(tmp_path))
    monkeypatch.setenv("PIXELWIRE_MM_PROCESSOR_KWARGS", json.dumps({"max_pixels": 1 << 18}))
    monkeypatch.setenv("PIXELWIRE_WORKER_CACHE_BYTES", "64MiB")
    worker_settings.worker_resize_policy.cache_clear()
    try:
        labels = worker_settings.declared_settings("pixelwire").labels()
    finally:
        worker_settings.worker_resize_policy.cache_clear()
    policy = image_resize_policy(tmp_path, {"max_pixels": 1 << 18})
    assert policy is not None
    assert labels == {
        "version": pixelwire.__version__,
        "connector": "pixelwire",
        "secret": secret_fingerprint(b"worker-secret"),
        "unsigned": "0",
        "private": "1",
        "resize": policy.identity,
        "memo": "1",
        # Not a Qwen2-VL checkpoint (no config.json): no processed inputs.
        "processed": "none",
    }
    assert "worker-secret" not in json.dumps(labels)
    # Without the variables, from vLLM's command line: the same label.
    monkeypatch.delenv("PIXELWIRE_MODEL")
    monkeypatch.delenv("PIXELWIRE_MM_PROCESSOR_KWARGS")
    kwargs = json.dumps({"max_pixels": 1 << 18})
    monkeypatch.setattr(
        sys, "argv", ["api_server.py", "--model", str(tmp_path), "--mm-processor-kwargs", kwargs]
    )
    try:
        assert worker_settings.declared_settings("pixelwire").resize == policy.identity
    finally:
        worker_settings.worker_resize_policy.cache_clear()
    # A model vLLM was started with but without a processor config (a text
    # model): no resize, and no reason to stop vLLM.
    monkeypatch.setattr(sys, "argv", ["api_server.py", "--model", str(tmp_path / "missing")])
    try:
        assert worker_settings.declared_settings("pixelwire").resize == "none"
    finally:
        worker_settings.worker_resize_policy.cache_clear()
    # Not the connector, an unreadable PIXELWIRE_MODEL does not stop vLLM.
    monkeypatch.setenv("PIXELWIRE_MODEL", str(tmp_path / "missing"))
    try:
        assert worker_settings.declared_settings("http").resize == "unreadable"
    finally:
        worker_settings.worker_resize_policy.cache_clear()


@pytest.fixture
def served_qwen2_vl(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """vLLM's command line for a Qwen2-VL-style model folder (image and
    video processor configs, a small pixel budget); the plug-in's cached
    policies are dropped before and after."""
    from pixelwire.vllm import video, worker_settings

    image = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 8192}
    frames = {"video_processor_type": "Qwen2VLVideoProcessor", "min_pixels": 3136, "max_pixels": 8192}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(image))
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(frames))
    monkeypatch.delenv("PIXELWIRE_MODEL", raising=False)
    monkeypatch.delenv("PIXELWIRE_MM_PROCESSOR_KWARGS", raising=False)

    def clear() -> None:
        worker_settings.worker_resize_policy.cache_clear()
        video.worker_video_resize_policy.cache_clear()

    clear()
    yield ["api_server.py", "--model", str(tmp_path)]
    clear()


@pytest.mark.parametrize("allowed", [False, True])
def test_worker_mode_resizes_approximately_only_when_allowed(
    connectors: tuple[Any, Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch, allowed: bool
) -> None:
    """In worker mode an image URL for a LLaVA-OneVision (whose processor
    resizes the original twice) is decoded at its grid size only with
    PIXELWIRE_RESIZE_APPROXIMATE=1; without it, at vLLM's loader's full
    size, its pixels."""
    import base64
    import io

    from pixelwire.resize import image_resize_policy
    from pixelwire.vllm import worker_settings

    grid = [[56 * rows, 56 * columns] for rows in range(1, 7) for columns in range(1, 7)]
    processor = {
        "image_processor_type": "LlavaOnevisionImageProcessor",
        "size": {"height": 56, "width": 56},
        "image_grid_pinpoints": grid,
    }
    model = {"vision_config": {"image_size": 56, "patch_size": 14}, "image_grid_pinpoints": grid}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    (tmp_path / "config.json").write_text(json.dumps(model))
    monkeypatch.delenv("PIXELWIRE_MODEL", raising=False)
    monkeypatch.delenv("PIXELWIRE_MM_PROCESSOR_KWARGS", raising=False)
    monkeypatch.setenv("PIXELWIRE_RESIZE_APPROXIMATE", "1" if allowed else "0")
    monkeypatch.setattr(sys, "argv", ["api_server.py", "--model", str(tmp_path)])
    from PIL import Image

    with Image.open(stack.CORPUS / "exif_gps_typeerror.jpg") as photo:
        out = io.BytesIO()
        photo.convert("RGB").resize((640, 480)).save(out, "PNG")
    data = out.getvalue()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    ours_cls, theirs_cls = connectors
    worker_settings.worker_resize_policy.cache_clear()
    try:
        ours = asyncio.run(ours_cls().fetch_image_async(url))
    finally:
        worker_settings.worker_resize_policy.cache_clear()
    full = _pixels(asyncio.run(theirs_cls().fetch_image_async(url)))
    if allowed:
        policy = image_resize_policy(tmp_path, approximate=True)
        assert policy is not None and policy.target(480, 640) == (252, 336)  # the 5x6 tile grid's size
        np.testing.assert_array_equal(_pixels(ours), pixelwire.decode_image(data, resize=(252, 336)))
    else:
        np.testing.assert_array_equal(_pixels(ours), full)


@pytest.mark.parametrize(
    ("flags", "resized"),
    [
        ([], True),
        (["--trust-request-mm-kwargs"], False),
        (["--trust-request-mm-kwargs", "--no-trust-request-mm-kwargs"], True),
    ],
)
def test_worker_mode_resizes_urls_unless_requests_may_bring_their_own_kwargs(
    connectors: tuple[Any, Any],
    served_qwen2_vl: list[str],
    video_clips: dict[str, bytes],
    monkeypatch: pytest.MonkeyPatch,
    flags: list[str],
    resized: bool,
) -> None:
    """In worker mode an image or video URL is decoded at the size the
    served model's processor makes it (each frame, for a video), as the
    frontend ships it. Not where vLLM trusts a request's own
    mm_processor_kwargs: they never reach the plug-in, so a resize for the
    served settings could differ from what vLLM's processor makes with the
    request's; the URL then gives vLLM's loader's own full-size pixels."""
    import base64

    from pixelwire.resize import image_resize_policy, video_resize_policy

    model = served_qwen2_vl[-1]
    monkeypatch.setattr(sys, "argv", [*served_qwen2_vl, *flags])
    ours_cls, theirs_cls = connectors
    data = (stack.CORPUS / "hopper.png").read_bytes()
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    ours, theirs = (asyncio.run(cls().fetch_image_async(url)) for cls in (ours_cls, theirs_cls))
    full = _pixels(theirs)
    policy = image_resize_policy(model)
    assert policy is not None and policy.target(*full.shape[:2]) < full.shape[:2]  # 128x128 -> 84x84
    if resized:
        want = pixelwire.decode_image(data, resize=policy.target(*full.shape[:2]))
        np.testing.assert_array_equal(_pixels(ours), want)
    else:
        np.testing.assert_array_equal(_pixels(ours), full)
    clip = video_clips["h264_high_bframes.mp4"]
    video_url = "data:video/mp4;base64," + base64.b64encode(clip).decode()
    kwargs = {"media_io_kwargs": {"video": {"num_frames": 4}}}
    processor = "Qwen2VLVideoProcessor"
    ours_video = asyncio.run(ours_cls(**kwargs).fetch_video_async(video_url, video_processor=processor))
    theirs_video = asyncio.run(theirs_cls(**kwargs).fetch_video_async(video_url, video_processor=processor))
    (frames, metadata), (vllm_frames, vllm_metadata) = ours_video.media, theirs_video.media
    assert metadata == vllm_metadata
    frame_policy = video_resize_policy(model)
    assert frame_policy is not None
    if resized:
        want, _ = pixelwire.decode_video(clip, loader="qwen2_vl", num_frames=4, resize=frame_policy)
        assert want.shape[1:3] != vllm_frames.shape[1:3]
        np.testing.assert_array_equal(frames, want)
    else:
        np.testing.assert_array_equal(frames, vllm_frames)


@pytest.mark.parametrize("processor", [None, "Qwen2VLVideoProcessor", "Qwen3VLVideoProcessor"])
@pytest.mark.parametrize("clip", ["h264_high_bframes.mp4", "hevc_10bit.mkv", "av1.mkv"])
def test_a_video_url_gives_vllms_frames_and_metadata(
    connectors: tuple[Any, Any], video_clips: dict[str, bytes], clip: str, processor: str | None
) -> None:
    """In worker mode the plug-in decodes a video URL natively, sampled by
    the loader vLLM picks for the model's video processor: the frames and
    the metadata are those vLLM's own connector returns."""
    import base64

    ours_cls, theirs_cls = connectors
    url = "data:video/mp4;base64," + base64.b64encode(video_clips[clip]).decode()
    kwargs = {"media_io_kwargs": {"video": {"num_frames": 6}}}
    ours = asyncio.run(ours_cls(**kwargs).fetch_video_async(url, video_processor=processor))
    theirs = asyncio.run(theirs_cls(**kwargs).fetch_video_async(url, video_processor=processor))
    (frames, metadata), (vllm_frames, vllm_metadata) = ours.media, theirs.media
    np.testing.assert_array_equal(frames, vllm_frames)
    assert metadata == vllm_metadata
    assert ours.original_bytes == theirs.original_bytes


def test_a_video_reference_must_be_sampled_as_this_vllm_samples(
    connectors: tuple[Any, Any], unsigned_allowed: None
) -> None:
    """Frames sampled with another loader or frame count than this vLLM's
    are refused before any READ, naming the settings to align; an image
    reference sent as a video (or the other way round) is refused too."""
    from pixelwire.descriptor import DecodedVideo
    from pixelwire.signing import encode_reference

    ours_cls, _ = connectors
    video = DecodedVideo(
        nixl_metadata="b64:AAAA",
        addr=1 << 20,
        size=2 * 4 * 6 * 3,
        shape=(2, 4, 6, 3),
        content_hash="xxh3-256k:0123456789abcdef",
        agent="front",
        slot=1,
        generation=1,
        expires_at=time.time() + 60,
        notification="pw1:1:1",
        loader_metadata={
            "total_num_frames": 10,
            "fps": 5.0,
            "duration": 2.0,
            "video_backend": "opencv",
            "frames_indices": [0, 9],
            "do_sample_frames": False,
        },
        sampling={"loader": "opencv", "num_frames": 2, "fps": -1.0},
    )
    reference = encode_reference(video.to_dict())
    with pytest.raises(ValueError, match=r"samples as .*'loader': 'qwen2_vl'.*--media-io-kwargs"):
        asyncio.run(ours_cls().fetch_video_async(reference, video_processor="Qwen2VLVideoProcessor"))
    with pytest.raises(ValueError, match=r"samples as .*'num_frames': 32"):
        asyncio.run(ours_cls().fetch_video_async(reference))
    with pytest.raises(ValueError, match="names a video, sent as an image"):
        asyncio.run(ours_cls().fetch_image_async(reference))
    resized = encode_reference({**video.to_dict(), "pixelwire": {**video.to_dict()["pixelwire"], "resize": {
        "policy": "smart:factor=28:min=3136:max=12544:torchvision:bicubic", "source": [8, 12]}}})  # fmt: skip
    with pytest.raises(ValueError, match="resizes no frames for its model"):
        asyncio.run(ours_cls(media_io_kwargs={"video": {"num_frames": 2}}).fetch_video_async(resized))
    with pytest.raises(ValueError, match="names an image, sent as a video"):
        asyncio.run(ours_cls().fetch_video_async(encode_reference(OTHER_MODE)))


def test_frames_resized_per_video_are_checked_for_their_count(
    connectors: tuple[Any, Any], unsigned_allowed: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """For a Qwen3-VL model (PIXELWIRE_MODEL) the plug-in checks a
    frontend-resized video against the size its video processor makes a
    video of that many frames: frames sized per frame (Qwen2-VL's rule) are
    refused before any READ; frames at the per-video size pass the check
    (and go on to their READ)."""
    import json

    from pixelwire.descriptor import DecodedVideo
    from pixelwire.resize import video_resize_policy
    from pixelwire.resize.families.smart import SmartPolicy
    from pixelwire.signing import encode_reference
    from pixelwire.vllm.video import worker_video_resize_policy

    image = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 1 << 20}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(image))
    video = {"video_processor_type": "Qwen3VLVideoProcessor"}
    video |= {"size": {"shortest_edge": 4096, "longest_edge": 200000}}
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(video))
    policy = video_resize_policy(tmp_path)
    assert policy is not None and policy.video_frames
    monkeypatch.setenv("PIXELWIRE_MODEL", str(tmp_path))
    worker_video_resize_policy.cache_clear()
    ours_cls, _ = connectors
    indices = [0, 8, 15, 23]

    def reference(height: int, width: int) -> str:
        frames = DecodedVideo(
            nixl_metadata="b64:AAAA",
            addr=1 << 20,
            size=4 * height * width * 3,
            shape=(4, height, width, 3),
            content_hash="xxh3-256k:0123456789abcdef",
            agent="front",
            slot=1,
            generation=1,
            expires_at=time.time() + 60,
            notification="pw1:1:1",
            loader_metadata={
                "total_num_frames": 24,
                "fps": 25.0,
                "duration": 0.96,
                "video_backend": "opencv",
                "frames_indices": indices,
                "do_sample_frames": False,
            },
            sampling={"loader": "qwen3_vl", "num_frames": 32, "fps": 2.0},
            resize={"policy": policy.identity, "source": [240, 320]},
        )
        return encode_reference(frames.to_dict())

    per_video = policy.video_target(240, 320, 4, 24)
    # The same budget counted per frame (Qwen2-VL's rule).
    per_frame = SmartPolicy(factor=policy.factor, min_pixels=policy.min_pixels, max_pixels=policy.max_pixels)
    wrong = per_frame.target(240, 320)
    assert per_video != wrong
    try:
        with pytest.raises(ValueError, match="video processor resizes for"):
            asyncio.run(
                ours_cls().fetch_video_async(reference(*wrong), video_processor="Qwen3VLVideoProcessor")
            )
        # Past the check, the READ of this made-up descriptor fails on its agent metadata.
        with pytest.raises(ValueError, match="nixl_metadata"):
            asyncio.run(
                ours_cls().fetch_video_async(reference(*per_video), video_processor="Qwen3VLVideoProcessor")
            )
    finally:
        worker_video_resize_policy.cache_clear()


@pytest.fixture
def worker_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The plug-in's image cache on (PIXELWIRE_WORKER_CACHE_BYTES), fresh for the test."""
    from pixelwire.caches.worker_images import reset_worker_image_cache

    monkeypatch.setenv("PIXELWIRE_WORKER_CACHE_BYTES", "16MiB")
    reset_worker_image_cache()
    yield
    reset_worker_image_cache()


async def _stats_with_one_handout_left(publisher: Any, kept: Any) -> dict[str, int]:
    """The publisher's stats once every hand-out but ``kept``'s has been
    released by its READ (10 s at most); then ``kept``'s is released, which
    only an unread hand-out can be."""
    deadline = time.monotonic() + 10
    while publisher.stats()["outstanding_handouts"] > 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    stats = publisher.stats()
    assert publisher.release(kept), "never READ: its hand-out was still outstanding"
    return stats


def test_a_repeated_reference_is_checked_and_served_without_a_read(
    connectors: tuple[Any, Any], unsigned_allowed: None, worker_cache: None
) -> None:
    """With the worker's cache on, a second reference to the same image (a
    frontend cache hit: the same slot, another hand-out) gives the same
    pixels and the same vLLM cache key without a READ (its hand-out stays
    outstanding until the frontend's request ends); an expired one is still
    refused."""
    import copy

    from pixelwire.signing import encode_reference

    data = (stack.CORPUS / "hopper.png").read_bytes()
    ours_cls, _ = connectors

    async def main() -> tuple[Any, Any, dict[str, int]]:
        async with pixelwire.Publisher(cache_bytes=16 * 1024 * 1024) as publisher:
            first = await publisher.decode_and_publish(data)
            again = await publisher.decode_and_publish(data)
            assert isinstance(first, pixelwire.Decoded) and isinstance(again, pixelwire.Decoded)
            read = await ours_cls().fetch_image_async(encode_reference(first.to_dict()))
            kept = await ours_cls().fetch_image_async(encode_reference(again.to_dict()))
            expired = copy.deepcopy(again.to_dict())
            expired["pixelwire"]["expires_at"] = time.time() - 1
            with pytest.raises(Exception, match="lease has expired"):
                await ours_cls().fetch_image_async(encode_reference(expired))
            return read, kept, await _stats_with_one_handout_left(publisher, again)

    read, kept, stats = asyncio.run(main())
    np.testing.assert_array_equal(_pixels(kept), _pixels(read))
    np.testing.assert_array_equal(_pixels(read), pixelwire.decode_image(data))
    assert kept.original_bytes == read.original_bytes, "the same vLLM cache key"
    assert stats["outstanding_handouts"] == 1


def test_a_repeated_data_url_is_decoded_once_in_worker_mode(
    connectors: tuple[Any, Any], worker_cache: None
) -> None:
    """The same bytes twice (a conversation resending its image as a data:
    URL) are decoded once and give the same pixels and cache key; the
    resent URL's text is not even base64-decoded again, and another text
    of the same bytes is; vLLM's /metrics (the default registry) shows the
    cache's hits, misses and bytes."""
    import base64

    from prometheus_client import REGISTRY

    from pixelwire.caches.worker_images import worker_image_cache

    ours_cls, _ = connectors
    url = stack.data_url("hopper.png")
    first = asyncio.run(ours_cls().fetch_image_async(url))
    second = asyncio.run(ours_cls().fetch_image_async(url))
    np.testing.assert_array_equal(_pixels(first), _pixels(second))
    assert first.original_bytes == second.original_bytes
    assert (worker_image_cache().hits, worker_image_cache().misses) == (1, 1)
    assert worker_image_cache().data_urls.hits == 1
    # The same bytes under another media type: decoded from its own text.
    other = "data:image/x-png;base64," + base64.b64encode((stack.CORPUS / "hopper.png").read_bytes()).decode()
    third = asyncio.run(ours_cls().fetch_image_async(other))
    np.testing.assert_array_equal(_pixels(third), _pixels(first))
    assert worker_image_cache().data_urls.hits == 1
    assert (worker_image_cache().hits, worker_image_cache().misses) == (2, 1)
    shown = {
        name: REGISTRY.get_sample_value(f"pixelwire_worker_{name}")
        for name in ("cache_hits_total", "cache_misses_total", "data_url_hits_total")
    }
    assert shown == {"cache_hits_total": 2, "cache_misses_total": 1, "data_url_hits_total": 1}
    assert REGISTRY.get_sample_value("pixelwire_worker_cache_bytes") == worker_image_cache().held_bytes > 0


def test_a_resent_images_reference_is_served_from_the_bytes_the_worker_holds(
    connectors: tuple[Any, Any], worker_cache: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker mode: once a data: URL was loaded, a signed reference naming
    its bytes' SHA-256 and size gives the same pixels and the same vLLM
    cache key (the original bytes) without the URL, decoded once. One
    naming bytes the worker does not hold, or another size, is answered
    with the marker after which a frontend sends the URL in full; an
    expired one, or one signed with another secret, is refused."""
    import hashlib

    from pixelwire.caches.worker_images import worker_image_cache
    from pixelwire.resend import NOT_HELD
    from pixelwire.resent_reference import encode_resent

    secret = b"resent-test-secret"
    monkeypatch.setenv("PIXELWIRE_SECRET", secret.decode())
    ours_cls, _ = connectors
    data = (stack.CORPUS / "hopper.png").read_bytes()
    digest = hashlib.sha256(data).hexdigest()

    def fetch(url: str) -> Any:
        return asyncio.run(ours_cls().fetch_image_async(url))

    first = fetch(stack.data_url("hopper.png"))
    resent = fetch(encode_resent(digest, len(data), secret, 30))
    np.testing.assert_array_equal(_pixels(resent), _pixels(first))
    assert resent.original_bytes == first.original_bytes == data
    assert (worker_image_cache().hits, worker_image_cache().misses) == (1, 1)
    for unknown in (
        encode_resent(hashlib.sha256(b"never sent").hexdigest(), 10, secret, 30),
        encode_resent(digest, len(data) + 1, secret, 30),
    ):
        with pytest.raises(ValueError) as not_held:
            fetch(unknown)
        assert str(not_held.value).startswith(NOT_HELD)
    with pytest.raises(ValueError, match="expired"):
        fetch(encode_resent(digest, len(data), secret, -1))
    with pytest.raises(ValueError, match="signature does not match"):
        fetch(encode_resent(digest, len(data), b"another secret", 30))


def test_a_resent_video_url_is_served_from_the_workers_cache_not_decoded_again(
    connectors: tuple[Any, Any], video_clips: dict[str, bytes], worker_cache: None
) -> None:
    """Worker mode with the worker's cache on: the same video ``data:`` URL
    again (turn 2 of a conversation) is neither base64-decoded nor decoded
    again: its frames and metadata come from the cache, equal to vLLM's
    own, as a copy; another frame count decodes for itself."""
    import base64

    from pixelwire.caches.worker_images import worker_image_cache

    ours_cls, theirs_cls = connectors
    url = "data:video/mp4;base64," + base64.b64encode(video_clips["h264_high_bframes.mp4"]).decode()
    four, two = ({"media_io_kwargs": {"video": {"num_frames": n}}} for n in (4, 2))
    first, again = (asyncio.run(ours_cls(**four).fetch_video_async(url)) for _ in range(2))
    stats = worker_image_cache().stats()
    assert (stats["hits"], stats["misses"], stats["data_url_hits"]) == (1, 1, 1), stats
    theirs = asyncio.run(theirs_cls(**four).fetch_video_async(url))
    for ours in (first, again):
        np.testing.assert_array_equal(ours.media[0], theirs.media[0])
        assert ours.media[1] == theirs.media[1] and ours.original_bytes == theirs.original_bytes
    assert again.media[0] is not first.media[0], "each request gets its own copy"
    other = asyncio.run(ours_cls(**two).fetch_video_async(url))
    assert other.media[0].shape[0] == 2
    assert worker_image_cache().stats()["misses"] == 2


def test_a_resent_videos_reference_is_served_from_the_bytes_the_worker_holds(
    connectors: tuple[Any, Any],
    video_clips: dict[str, bytes],
    worker_cache: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Worker mode: once a video's data: URL was loaded, a signed resent
    reference naming its bytes' SHA-256 and size, sent as a video part,
    gives the same frames, metadata and vLLM cache key (the video's bytes)
    from the worker's cache, not decoded again. One naming bytes the worker
    does not hold is answered with the marker after which a frontend sends
    the URL in full; an expired one, or one signed with another secret, is
    refused."""
    import base64
    import hashlib

    from pixelwire.caches.worker_images import worker_image_cache
    from pixelwire.resend import NOT_HELD
    from pixelwire.resent_reference import encode_resent

    secret = b"resent-test-secret"
    monkeypatch.setenv("PIXELWIRE_SECRET", secret.decode())
    ours_cls, theirs_cls = connectors
    clip = video_clips["h264_high_bframes.mp4"]
    digest = hashlib.sha256(clip).hexdigest()
    url = "data:video/mp4;base64," + base64.b64encode(clip).decode()
    four = {"media_io_kwargs": {"video": {"num_frames": 4}}}

    def fetch(url: str) -> Any:
        return asyncio.run(ours_cls(**four).fetch_video_async(url))

    first = fetch(url)
    resent = fetch(encode_resent(digest, len(clip), secret, 30))
    theirs = asyncio.run(theirs_cls(**four).fetch_video_async(url))
    for ours in (first, resent):
        np.testing.assert_array_equal(ours.media[0], theirs.media[0])
        assert ours.media[1] == theirs.media[1] and ours.original_bytes == theirs.original_bytes == clip
    stats = worker_image_cache().stats()
    assert (stats["hits"], stats["misses"]) == (1, 1), stats
    for unknown in (
        encode_resent(hashlib.sha256(b"never sent").hexdigest(), 10, secret, 30),
        encode_resent(digest, len(clip) + 1, secret, 30),
    ):
        with pytest.raises(ValueError) as not_held:
            fetch(unknown)
        assert str(not_held.value).startswith(NOT_HELD)
    with pytest.raises(ValueError, match="expired"):
        fetch(encode_resent(digest, len(clip), secret, -1))
    with pytest.raises(ValueError, match="signature does not match"):
        fetch(encode_resent(digest, len(clip), b"another secret", 30))


def test_a_repeated_video_reference_is_served_without_a_read(
    connectors: tuple[Any, Any], video_clips: dict[str, bytes], unsigned_allowed: None, worker_cache: None
) -> None:
    """With the worker's cache on, a second reference to the same video (a
    frontend cache hit: the same slot, another hand-out) gives the same
    frames and the same vLLM cache key without a READ: its hand-out stays
    outstanding until the frontend's request ends."""
    from pixelwire.signing import encode_reference
    from pixelwire.video.sampling import VideoSampling

    clip = video_clips["h264_high_bframes.mp4"]
    ours_cls, _ = connectors
    kwargs = {"media_io_kwargs": {"video": {"num_frames": 4}}}
    sampling = VideoSampling.from_video_kwargs({"num_frames": 4}, "opencv")

    async def main() -> tuple[Any, Any, dict[str, int]]:
        async with pixelwire.Publisher(cache_bytes=16 * 1024 * 1024) as publisher:
            first, again = [
                await publisher.decode_and_publish_video(clip, sampling=sampling) for _ in range(2)
            ]
            assert isinstance(first, pixelwire.DecodedVideo) and isinstance(again, pixelwire.DecodedVideo)
            assert (first.slot, first.generation) == (again.slot, again.generation)
            read = await ours_cls(**kwargs).fetch_video_async(encode_reference(first.to_dict()))
            kept = await ours_cls(**kwargs).fetch_video_async(encode_reference(again.to_dict()))
            return read, kept, await _stats_with_one_handout_left(publisher, again)

    read, kept, stats = asyncio.run(main())
    np.testing.assert_array_equal(kept.media[0], read.media[0])
    np.testing.assert_array_equal(read.media[0], pixelwire.decode_video(clip, num_frames=4)[0])
    assert kept.media[1] == read.media[1] and kept.original_bytes == read.original_bytes
    assert stats["outstanding_handouts"] == 1, stats
