"""Fixtures of the frontend's tests: every test runs `pixelwire frontend` as
a real process, in front of an upstream server in this process that plays
vLLM's HTTP side and reads every descriptor over real NIXL with a real
Reader. (The vLLM end-to-end group is tests/e2e.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import pixelwire

import stack
from frontend_client import started_frontend
from loopback_servers import Counting, Upstream


@pytest.fixture(scope="session", autouse=True)
def nixl_runtime() -> None:
    """A frontend publishes over NIXL: without its runtime, every test here is skipped."""
    try:
        pixelwire.transfer.nixl_library_path()
    except pixelwire.TransferError as missing:  # pragma: no cover - CI installs it
        pytest.skip(f"NIXL runtime not installed: {missing}")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    u = Upstream()
    yield u
    u.close()


@pytest.fixture(scope="module")
def frontend(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.Service]:
    service = started_frontend(tmp_path_factory.mktemp("frontend"), upstream.url, "--lease-seconds", "30")
    yield service
    service.stop()


@pytest.fixture(scope="module")
def trusting_frontend(
    upstream: Upstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[stack.Service]:
    """A frontend that honours a request's own media_io_kwargs and
    mm_processor_kwargs (``--trust-request-mm-kwargs``)."""
    service = started_frontend(
        tmp_path_factory.mktemp("frontend"),
        upstream.url,
        "--lease-seconds",
        "30",
        "--trust-request-mm-kwargs",
    )
    yield service
    service.stop()


@pytest.fixture(scope="module")
def trap() -> Iterator[Counting]:
    server = Counting()
    yield server
    server.close()
