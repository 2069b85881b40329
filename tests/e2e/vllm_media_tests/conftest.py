"""What runs vLLM's own media tests (copied here, README.md) against both
connectors, here where there is no internet.

* Every test of a module that uses ``MediaConnector`` runs twice: with
  vLLM's connector (``[vllm]``) and with pixelwire's (``[pixelwire]``), the
  module's ``MediaConnector`` swapped for the test. pixelwire's may reach the
  loopback asset server (``PIXELWIRE_ALLOW_PRIVATE=1``): these tests are
  about vLLM's behaviour, not the address guard.
* ``local_asset_server`` and ``image_url`` are vLLM's fixtures (its
  tests/conftest.py), serving local stand-ins for vLLM's four image assets
  under their names: a JPEG photo with an ICC profile, a grey palette PNG,
  an RGB PNG and an RGBA PNG, from the Pillow corpus.
* Tests that need the internet (videos from vLLM's S3 bucket) are skipped
  for both connectors.
* The deliberate differences (docs/architecture.md, "Differences from vLLM")
  are expected failures with pixelwire's connector, strict, each naming its
  line there.
* ``async`` tests run on one event loop for the session (vLLM uses
  pytest-asyncio, which its venv here does not have).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import inspect
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stack

if importlib.util.find_spec("vllm") is None:
    # The core test run's virtualenv has no vLLM; these are the vLLM group's.
    collect_ignore_glob = ["test_*.py"]

HERE = Path(__file__).resolve().parent


def _readme_line(start: str) -> str:
    """The line of docs/architecture.md's "Differences from vLLM" that starts
    with ``start``."""
    doc = (HERE.parents[2] / "docs" / "architecture.md").read_text()
    section = doc.split("\n## Differences from vLLM\n", 1)[1].split("\n## ", 1)[0]
    (line,) = (line for line in section.splitlines() if line.startswith(f"- {start}"))
    return "docs/architecture.md: " + line[2:]


# The docs/architecture.md line behind each expected failure.
CREDENTIALS = _readme_line("Credentials in a URL are refused")
DIFFERENCES = {
    "test_ssrf_bypass_backslash_in_url": CREDENTIALS,
    "test_ssrf_bypass_backslash_disallowed_domain": CREDENTIALS,
}
# This revision of the test expects the host's 404 unwrapped; vLLM 0.32's own
# connector answers it with VLLMUnprocessableEntityError (422), as its
# _wrap_media_fetch_error makes it: it fails with vLLM's connector too.
NOT_VLLM_032 = {
    "test_ssrf_bypass_backslash_in_url": "fails with vLLM 0.32's own connector: its 404 is a "
    "VLLMUnprocessableEntityError there, not the requests/aiohttp error this revision expects",
}
NEEDS_INTERNET = {
    "test_fetch_video_http",
    "test_fetch_video_http_with_dynamic_loader",
    "test_allowed_media_domains",
}

# vLLM's asset names and the corpus files that stand in for them.
ASSETS = {
    "2560px-Gfp-wisconsin-madison-the-nature-boardwalk.jpg": "flower2.jpg",
    "Grayscale_8bits_palette_sample_image.png": None,  # made from hopper.png below
    "1280px-Venn_diagram_rgb.svg.png": "hopper.png",
    "RGBA_comp.png": "transparent.png",
}


def pytest_configure(config: pytest.Config) -> None:
    for marker in (
        "asyncio: a coroutine test (run on this folder's session loop)",
        "cpu_test: vLLM's CI label",
        "flaky(reruns, reruns_delay): vLLM's CI reruns (not applied here)",
    ):
        config.addinivalue_line("markers", marker)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "media_connector" in metafunc.fixturenames and hasattr(metafunc.module, "MediaConnector"):
        metafunc.parametrize("media_connector", ["vllm", "pixelwire"], indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE not in Path(str(item.fspath)).parents:
            continue
        item.add_marker(pytest.mark.vllm)
        name = getattr(item, "originalname", item.name)
        if name in NEEDS_INTERNET:
            item.add_marker(pytest.mark.skip(reason="needs the internet (vLLM's S3 bucket)"))
        callspec = getattr(item, "callspec", None)
        connector = callspec.params.get("media_connector") if callspec is not None else None
        if connector == "pixelwire" and name in DIFFERENCES:
            item.add_marker(pytest.mark.xfail(strict=True, reason=DIFFERENCES[name]))
        elif connector == "vllm" and name in NOT_VLLM_032:
            item.add_marker(pytest.mark.xfail(strict=True, reason=NOT_VLLM_032[name]))


_loop: asyncio.AbstractEventLoop | None = None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Runs a coroutine test to completion on the session's loop."""
    global _loop
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    if _loop is None:
        _loop = asyncio.new_event_loop()
    names = pyfuncitem._fixtureinfo.argnames
    _loop.run_until_complete(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True


@pytest.fixture(autouse=True)
def media_connector(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The connector this run of the test uses, as its module's ``MediaConnector``."""
    kind = getattr(request, "param", None)
    if kind is None:
        return None
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    import pixelwire.vllm

    pixelwire.vllm.register()
    monkeypatch.setattr(
        request.module,
        "MediaConnector",
        MEDIA_CONNECTOR_REGISTRY.name2class["pixelwire" if kind == "pixelwire" else "http"],
    )
    monkeypatch.setenv("PIXELWIRE_ALLOW_PRIVATE", "1")
    return str(kind)


class LocalAssetServer:
    """vLLM's asset server's interface, over a local folder."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.port = int(base_url.rsplit(":", 1)[1])

    def url_for(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def get_image_asset(self, name: str) -> Any:
        from vllm.multimodal.utils import fetch_image

        image = fetch_image(self.url_for(name))
        return getattr(image, "media", image)


@pytest.fixture(scope="session")
def local_asset_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalAssetServer]:
    from PIL import Image

    root = tmp_path_factory.mktemp("vllm-assets")
    for name, source in ASSETS.items():
        if source is None:
            Image.open(stack.CORPUS / "hopper.png").convert("L").convert("P").save(root / name)
        else:
            shutil.copyfile(stack.CORPUS / source, root / name)
    with contextlib.ExitStack() as stop:
        yield LocalAssetServer(stop.enter_context(stack.image_server(root)))


@pytest.fixture
def image_url(request: pytest.FixtureRequest, local_asset_server: LocalAssetServer) -> str:
    return local_asset_server.url_for(request.param)
