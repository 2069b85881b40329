"""``file:`` URLs: read only below ``allowed_local_path``, symbolic links
followed only inside it, and no window between a check and the open.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

import pixelwire
from pixelwire.fetch import Fetcher

from reference import CORPUS


def test_file_urls_below_the_allowed_path(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    data = (CORPUS / "hopper.png").read_bytes()
    (allowed / "hopper.png").write_bytes(data)
    (allowed / "sub").mkdir()
    (allowed / "sub" / "x y.png").write_bytes(data)

    async def main() -> None:
        async with Fetcher(allowed_local_path=allowed) as fetcher:
            assert await fetcher.fetch(f"file://{allowed}/hopper.png") == data
            assert await fetcher.fetch(f"file://localhost{allowed}/sub/x%20y.png") == data
            assert await fetcher.fetch(f"file://{allowed}/sub/../hopper.png") == data
            with pytest.raises(pixelwire.FetchError) as caught:
                await fetcher.fetch(f"file://{allowed}/missing.png")
            assert not isinstance(caught.value, pixelwire.BlockedURL)
            with pytest.raises(pixelwire.FetchError, match="regular file"):
                await fetcher.fetch(f"file://{allowed}/sub")
        async with Fetcher(allowed_local_path=allowed, max_bytes=100) as small:
            with pytest.raises(pixelwire.FetchError, match="over the limit of 100 bytes"):
                await small.fetch(f"file://{allowed}/hopper.png")

    asyncio.run(main())


# -- file: URLs without a check-then-open race -----------------------------------------


def test_file_url_symlinks_are_followed_only_inside_the_allowed_folder(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    (allowed / "sub").mkdir(parents=True)
    (tmp_path / "outdir").mkdir()
    (allowed / "real.png").write_bytes(b"inside")
    (allowed / "sub" / "x.png").write_bytes(b"inside too")
    (tmp_path / "outside.png").write_bytes(b"SECRET")
    (tmp_path / "outdir" / "x.png").write_bytes(b"SECRET")
    os.symlink("real.png", allowed / "rel.png")
    os.symlink(allowed / "real.png", allowed / "abs.png")
    os.symlink("sub", allowed / "subdir")
    os.symlink("../real.png", allowed / "sub" / "up.png")
    os.symlink("../outside.png", allowed / "out.png")
    os.symlink(tmp_path / "outside.png", allowed / "absout.png")
    os.symlink(tmp_path / "outdir", allowed / "outdir")
    os.symlink("..", allowed / "parent")
    os.symlink("loop", allowed / "loop")

    async def main() -> None:
        async with Fetcher(allowed_local_path=allowed) as fetcher:
            for name in ("real.png", "rel.png", "abs.png", "sub/up.png", "subdir/up.png"):
                assert await fetcher.fetch(f"file://{allowed}/{name}") == b"inside", name
            assert await fetcher.fetch(f"file://{allowed}/subdir/x.png") == b"inside too"
            for name in ("out.png", "absout.png", "outdir/x.png", "parent/outside.png"):
                with pytest.raises(pixelwire.BlockedURL, match="outside allowed_local_path"):
                    await fetcher.fetch(f"file://{allowed}/{name}")
            with pytest.raises(pixelwire.FetchError, match="symbolic links"):
                await fetcher.fetch(f"file://{allowed}/loop")

    asyncio.run(main())


def test_file_swapped_for_a_symlink_never_leaks_what_it_points_at(tmp_path: Path) -> None:
    """A path inside the folder flips between a regular file and a symlink to a
    secret outside it, as fast as a thread can rename: whatever the fetch sees,
    it never returns the secret (no window between a check and the open)."""
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    master = tmp_path / "inside-master"
    master.write_bytes(b"inside")
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"SECRET")
    target = allowed / "flip.png"
    os.link(master, target)
    stop = threading.Event()

    def flip() -> None:
        spare_link, spare_file = allowed / ".link", allowed / ".file"
        while not stop.is_set():
            os.symlink(secret, spare_link)
            os.replace(spare_link, target)
            os.link(master, spare_file)
            os.replace(spare_file, target)

    async def main() -> dict[str, int]:
        seen = {"inside": 0, "refused": 0, "leaked": 0}
        flipper = threading.Thread(target=flip)
        flipper.start()
        try:
            async with Fetcher(allowed_local_path=allowed) as fetcher:
                deadline = time.monotonic() + 1.5
                while time.monotonic() < deadline and not seen["leaked"]:
                    try:
                        data = await fetcher.fetch(f"file://{target}")
                    except pixelwire.FetchError:  # BlockedURL, or the link gone before readlink
                        seen["refused"] += 1
                    else:
                        seen["leaked" if data == b"SECRET" else "inside"] += 1
                        assert data in (b"inside", b"SECRET")
        finally:
            stop.set()
            flipper.join(10)
        return seen

    seen = asyncio.run(main())
    print(f"\nfetches while flipping: {seen}")
    assert seen["leaked"] == 0
    assert seen["inside"] > 0 and seen["refused"] > 0  # both states were met
