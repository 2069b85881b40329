"""Reading ``file:`` URLs without ever leaving the allowed folder.

A path is opened one component at a time, each relative to the directory
opened before it and without following symbolic links (``O_NOFOLLOW``); a
link met on the way is read and its target walked the same way, so no link,
however late it is swapped in, leads outside the allowed folder (there is no
check-then-open window).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from pixelwire._native import FetchError
from pixelwire.fetch.errors import blocked, error, too_large

# Directories on the way are opened with these, the file with the next.
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Non-blocking, so that a FIFO cannot hang the open or the read; regular files ignore it.
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_SYMLINKS: Final = 40  # as Linux: more links than this on one path is a loop


class LocalFolder:
    """The folder ``file:`` URLs are read below (``allowed_local_path``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.root = Path(os.path.realpath(path))
        # file: URL paths are matched against the folder as resolved and as given.
        given = os.path.abspath(path)
        self._prefixes: tuple[str, ...] = tuple(dict.fromkeys((str(self.root), given)))

    def read(self, path: str, max_bytes: int) -> bytes:
        """The bytes of the regular file ``path`` names below the folder, at most ``max_bytes``."""
        try:
            fd = self._open_below(path)
            try:
                info = os.fstat(fd)
            except OSError:
                os.close(fd)
                raise
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                raise error(FetchError, "file: URL does not name a regular file")
            if info.st_size > max_bytes:
                os.close(fd)
                size = info.st_size
                raise too_large(f"file of {size} bytes is over the limit of {max_bytes} bytes")
            with open(fd, "rb") as f:
                data = f.read(max_bytes + 1)
        except OSError as exc:
            reason = exc.strerror or exc.__class__.__name__
            raise error(FetchError, f"cannot read file: URL: {reason}") from None
        if len(data) > max_bytes:
            raise too_large(f"file is over the limit of {max_bytes} bytes")
        return data

    def _below_root(self, path: str) -> list[str]:
        """The components of ``path`` below the allowed folder (``..`` resolved
        lexically); refused when it does not lie below it."""
        if "\0" in path:
            raise blocked("invalid file: URL")
        norm = os.path.normpath(path)
        if norm.startswith("/"):
            for prefix in self._prefixes:
                base = prefix.rstrip("/")
                if norm == prefix or norm.startswith(base + "/"):
                    return [c for c in norm[len(base) :].split("/") if c and c != "."]
        raise blocked("file: URL is outside allowed_local_path")

    def _open_below(self, path: str) -> int:
        """Opens ``path`` for reading without ever leaving the folder.

        Each component is opened relative to the directory opened before it,
        with ``O_NOFOLLOW``: a symbolic link met on the way (whenever it was
        put there) fails to open, is read with ``readlink`` and its target
        walked the same way, ``..`` going back up the directories held open and
        an absolute target starting again from the folder. Nothing is resolved by
        path, so there is no window between a check and the open.
        """
        rest = self._below_root(path)
        held = [os.open(self.root, _DIR_FLAGS)]
        links = 0
        try:
            while rest:
                name = rest.pop(0)
                if name == "..":
                    if len(held) == 1:
                        raise blocked("file: URL is outside allowed_local_path")
                    os.close(held.pop())
                    continue
                try:
                    fd = os.open(name, _DIR_FLAGS if rest else _FILE_FLAGS, dir_fd=held[-1])
                except OSError as exc:
                    try:
                        target = os.readlink(name, dir_fd=held[-1])
                    except OSError:
                        raise exc from None  # not a link: the open's own error
                    links += 1
                    if links > _MAX_SYMLINKS:
                        raise error(FetchError, "cannot read file: URL: too many symbolic links") from None
                    if target.startswith("/"):
                        rest = self._below_root(target) + rest
                        while len(held) > 1:
                            os.close(held.pop())
                    else:
                        rest = [c for c in target.split("/") if c and c != "."] + rest
                    continue
                if not rest:
                    return fd
                held.append(fd)
            # The path named a directory (the folder itself, or one reached by "..").
            return os.open(".", _FILE_FLAGS, dir_fd=held[-1])
        finally:
            for fd in held:
                os.close(fd)
