"""Finding and loading NIXL's runtime: its C API (``libnixl_capi.so``) and,
next to it, the UCX backend plug-in. pixelwire links neither; it loads the
library of an installed ``nixl-cu13`` or ``nixl-cu12`` wheel (installed with
``--no-deps``: torch is not needed) once per process."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

from pixelwire._native import TransferError, load_nixl
from pixelwire.config import nixl_library_from_env

_loaded = False
_load_lock = threading.Lock()


def nixl_library_path() -> str:
    """Where ``libnixl_capi.so`` is: ``PIXELWIRE_NIXL_LIB``, else the installed
    ``nixl-cu13`` or ``nixl-cu12`` wheel."""
    explicit = nixl_library_from_env()
    if explicit:
        return explicit
    for dist in ("nixl_cu13", "nixl_cu12"):
        spec = importlib.util.find_spec(dist)
        if spec is None or not spec.submodule_search_locations:
            continue
        site = Path(next(iter(spec.submodule_search_locations))).parent
        for candidate in sorted(site.glob(f".{dist}.mesonpy.libs/libnixl_capi.so")):
            return str(candidate)
    raise TransferError(
        "NIXL runtime not found: install it with `pip install --no-deps nixl-cu12==1.5.1 numpy` "
        "(or nixl-cu13), or point PIXELWIRE_NIXL_LIB at libnixl_capi.so"
    )


def ensure_nixl() -> None:
    """Loads NIXL's C API once per process."""
    global _loaded
    with _load_lock:
        if not _loaded:
            load_nixl(nixl_library_path())
            _loaded = True
