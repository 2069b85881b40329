"""A video's frames as the plug-in's cache keeps them
(:mod:`pixelwire.caches.worker_images`): in an anonymous memory file, each
hand-out a private copy-on-write mapping of it.

A resent video's frames are handed to vLLM on every turn, and vLLM's
processor cache usually already holds what its processor made of them (the
item's hash is the signed identity or the video's bytes, never the
frames), so the frames are not read at all. A plain copy writes all of
them anyway (50 MB for 8 sampled 1080p frames), into memory the process
may have to fault in afresh: that copy was most of the API server's CPU on
a frontend-mode conversation's second turn. A private mapping costs a
system call; a page is faulted in only when something reads it, and copied
only when something writes it, so a hand-out is as independent of the
cache (and of every other hand-out) as a copy: nothing written to one
reaches the memory file or any other mapping.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable

import numpy as np


class MappedFrames:
    """A C-contiguous copy of an array in a memory file; :meth:`copy` hands
    out a writable array of the same shape, dtype and bytes, mapped
    privately. Not for an empty array (nothing to map)."""

    def __init__(self, frames: np.ndarray) -> None:
        self.shape = frames.shape
        self.dtype = frames.dtype
        self.nbytes = int(frames.nbytes)
        fd = os.memfd_create("pixelwire-frames", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, self.nbytes)
            with mmap.mmap(fd, self.nbytes, flags=mmap.MAP_SHARED) as shared:
                view = np.frombuffer(shared, dtype=self.dtype).reshape(self.shape)
                np.copyto(view, frames)
                del view  # the buffer's export ends before the mapping closes
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def copy(self) -> np.ndarray:
        """The frames, in a private mapping of the memory file: unmapped
        when the array (and every view of it) is gone."""
        assert self._fd is not None
        private = mmap.mmap(self._fd, self.nbytes, flags=mmap.MAP_PRIVATE)
        return np.frombuffer(private, dtype=self.dtype).reshape(self.shape)

    def __del__(self, _close: Callable[[int], None] = os.close) -> None:
        # Mappings handed out keep the memory file's pages until they go.
        # os.close bound at definition: at interpreter exit, module globals
        # may already be gone when the cache's last entries are.
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            _close(fd)


def kept_frames(frames: np.ndarray) -> MappedFrames | np.ndarray:
    """What the cache keeps of ``frames``: a :class:`MappedFrames`, or a
    plain copy where a memory file cannot hold them (an empty array, one
    of Python objects, a system without ``memfd_create``)."""
    if frames.nbytes == 0 or frames.dtype.hasobject or not hasattr(os, "memfd_create"):
        return frames.copy()
    try:
        return MappedFrames(frames)
    except OSError:
        return frames.copy()
