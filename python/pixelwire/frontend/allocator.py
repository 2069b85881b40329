"""glibc malloc settings for `pixelwire frontend`: request bodies of
megabytes reuse heap memory instead of faulting fresh pages in on every
request (``pixelwire.config.MALLOC_MMAP_THRESHOLD`` says why)."""

from __future__ import annotations

import ctypes
import logging
import os

from pixelwire.config import MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD

log = logging.getLogger(__name__)

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# Environment settings through which an operator tunes glibc's allocator
# already: left as they are.
_OPERATOR_SETTINGS = ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_heap_memory() -> bool:
    """Sets glibc's mmap and trim thresholds for this process; whether they
    were set. Not on another C library (no ``mallopt``, or ``gnu_get_libc_version``
    missing), nor where an operator's environment tunes malloc already."""
    if any(os.environ.get(name) for name in _OPERATOR_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl's mallopt does nothing
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done: bool = mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD) == 1
    done = mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD) == 1 and done
    if not done:
        log.warning("glibc refused the frontend's malloc settings: request bodies fault pages in afresh")
    return done
