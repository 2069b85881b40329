"""`pixelwire demo` over files: a row of the table for each file, by name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import pixelwire
from pixelwire import cli

from reference import CORPUS


@pytest.fixture(autouse=True)
def nixl_runtime() -> None:
    try:
        pixelwire.transfer.nixl_library_path()
    except pixelwire.TransferError as missing:  # pragma: no cover - CI installs it
        pytest.skip(f"NIXL runtime not installed: {missing}")


def test_a_folder_gets_a_row_per_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A name starting with a digit once had a row of its own, the rest one "files" row.
    names = ["1-hopper.png", "flower2.jpg", "hopper.png"]
    for name in names:
        shutil.copy(CORPUS / name.removeprefix("1-"), tmp_path / name)
    assert cli.main(["demo", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table = out.split("read GB/s\n", 1)[1].split("\n\n", 1)[0]
    rows = {line.split()[0]: line.split()[1] for line in table.splitlines()}
    assert rows == {**dict.fromkeys(names, "1"), "all": "3"}, out
