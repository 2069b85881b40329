"""What the vLLM group's modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from resize_corpus import Case, load_corpus


@pytest.fixture(scope="session", autouse=True)
def worker_cache_off() -> Iterator[None]:
    """The plug-in's image cache (on by default) off unless a test turns it
    on (PIXELWIRE_WORKER_CACHE_BYTES), in this process and in every vLLM a
    test starts (``stack.start_vllm`` passes this environment on): tests see
    each reference READ and each URL decoded, as the frontend's tests see a
    pool that empties when its images are read."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIXELWIRE_WORKER_CACHE_BYTES", "0")
        yield


@pytest.fixture(scope="session")
def resize_corpus() -> tuple[list[Case], dict[str, int]]:
    """The resize corpus (:mod:`resize_corpus`), decoded once a session."""
    return load_corpus()
