"""Fixtures of the fault suite: the namespace pair (skipped cleanly where it
cannot be created), the images, and a registry that ends every child
process before the namespaces go."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from faultnet import FaultImage, NetPair, Procs, make_image
from netns import Unavailable, why_namespaces_unavailable

import pixelwire


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FaultImage]:
    try:
        pixelwire.transfer.nixl_library_path()
    except pixelwire.TransferError as missing:
        pytest.skip(f"NIXL runtime not installed: {missing}")
    folder = tmp_path_factory.mktemp("fault-images")
    return {
        # 4000 x 2000 RGB: 24 000 000 bytes of pixels.
        "big": make_image(folder, "big.png", 4000, 2000, seed=1),
        "big2": make_image(folder, "big2.png", 4000, 2000, seed=2),
        "small": make_image(folder, "small.png", 320, 240, seed=3),
        "medium": make_image(folder, "medium.png", 512, 384, seed=4),
    }


@pytest.fixture
def net() -> Iterator[NetPair]:
    reason = why_namespaces_unavailable()
    if reason is not None:
        pytest.skip(f"fault suite: {reason}")
    pair = NetPair()
    try:
        pair.open()
    except Unavailable as error:
        pytest.skip(f"fault suite: {error}")
    try:
        yield pair
    finally:
        pair.close()


@pytest.fixture
def procs(net: NetPair, tmp_path: Path) -> Iterator[Procs]:
    registry = Procs(net, tmp_path)
    try:
        yield registry
    finally:
        registry.close()
