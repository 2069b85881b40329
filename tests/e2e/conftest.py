"""What the vLLM group's modules share."""

from __future__ import annotations

import pytest
from resize_corpus import Case, load_corpus


@pytest.fixture(scope="session")
def resize_corpus() -> tuple[list[Case], dict[str, int]]:
    """The resize corpus (:mod:`resize_corpus`), decoded once a session."""
    return load_corpus()
