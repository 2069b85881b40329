"""Outputs as the caller asks for them; without Pillow, ``output="pil"``
says which extra installs it, and without PyTorch ``output="torch"`` says
to install it, before any work."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest

import pixelwire
from pixelwire.outputs import as_output


@pytest.fixture
def without_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import PIL`` fails, as on the lean install."""
    for name in [m for m in sys.modules if m == "PIL" or m.startswith("PIL.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "PIL", None)


def test_pil_output_without_pillow_names_the_extra(without_pillow: None) -> None:
    pixels = np.zeros((2, 3, 3), dtype=np.uint8)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'pixelwire\[pil\]'"):
        as_output(pixels, "pil")
    assert as_output(pixels, "numpy") is pixels


def test_a_reader_refuses_pil_output_without_pillow_before_reading(without_pillow: None) -> None:
    reader = pixelwire.Reader()  # never opened: the check comes first
    with pytest.raises(ModuleNotFoundError, match=r"pixelwire\[pil\]"):
        asyncio.run(reader.read_decoded({"not": "a descriptor"}))
    with pytest.raises(ModuleNotFoundError, match=r"pixelwire\[pil\]"):
        asyncio.run(reader.load({"url": "data:,"}))


@pytest.fixture
def without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import torch`` fails, as where PyTorch is not installed."""
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)


def test_torch_output_without_torch_says_what_to_install(without_torch: None) -> None:
    pixels = np.zeros((2, 3, 3), dtype=np.uint8)
    with pytest.raises(
        ModuleNotFoundError, match=r"output='torch' needs PyTorch.*pip install torch"
    ) as missing:
        as_output(pixels, "torch")
    assert missing.value.name == "torch" and "output='numpy'" in str(missing.value)


def test_a_reader_refuses_torch_output_without_torch_before_reading(without_torch: None) -> None:
    reader = pixelwire.Reader()  # never opened: the check comes first
    with pytest.raises(ModuleNotFoundError, match=r"needs PyTorch"):
        asyncio.run(reader.read_decoded({"not": "a descriptor"}, output="torch"))


def test_the_pil_extra_is_declared() -> None:
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())[
        "project"
    ]
    assert any(r.lower().startswith("pillow") for r in project["optional-dependencies"]["pil"])
