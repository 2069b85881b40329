"""glibc's allocator in `pixelwire frontend` (pixelwire.frontend.allocator):
a freed megabyte block is reused from the heap, not faulted in afresh by
the next request, and an operator's own malloc settings are left alone.
Each check runs in a process of its own: the settings are process-wide."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Allocates, touches and frees an 8 MiB block, then does it again, and
# prints the page faults the second one took: 2,048 where its pages are
# new to the process (glibc's defaults map the first block and give it back
# when freed, and the second comes from heap not yet touched), none where
# the first one's memory is reused.
_REFAULTS = """
import resource, sys
from pixelwire.frontend.allocator import keep_heap_memory
kept = keep_heap_memory() if sys.argv[1] == "kept" else None
def touched():
    block = bytearray(8 << 20)
    block[::4096] = b"x" * (len(block) // 4096)
    return block
touched()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = touched()
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _run(mode: str, **env: str) -> tuple[str, int]:
    import os

    done = subprocess.run(
        [sys.executable, "-c", _REFAULTS, mode],
        env={**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    kept, faults = done.stdout.split()
    return kept, int(faults)


def test_a_freed_block_is_reused_without_faulting_its_pages_in_again() -> None:
    kept, faults = _run("kept")
    assert kept == "True"
    assert faults < 100, f"{faults} page faults for a reused 8 MiB block"
    # The check can fail: glibc's defaults map such a block afresh.
    _, default_faults = _run("default")
    assert default_faults > 1000, default_faults


@pytest.mark.parametrize("name", ["MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES"])
def test_an_operators_own_malloc_settings_are_left_alone(name: str) -> None:
    value = "glibc.malloc.trim_threshold=1048576" if name == "GLIBC_TUNABLES" else "1048576"
    kept, _ = _run("kept", **{name: value})
    assert kept == "False"
