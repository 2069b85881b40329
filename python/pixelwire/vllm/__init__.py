"""pixelwire's vLLM plug-in: a media connector named ``"pixelwire"``.

vLLM calls :func:`register` in each of its processes through the
``vllm.general_plugins`` entry point; ``VLLM_MEDIA_CONNECTOR=pixelwire``
selects the connector. Importing :mod:`pixelwire` never imports vLLM: only
:func:`register` does.
"""

from __future__ import annotations

import os

CONNECTOR_NAME = "pixelwire"


def register() -> None:
    """Registers the connector and its metrics (idempotent). When vLLM is
    told to use it, NIXL is loaded now, so a broken install stops vLLM at
    start-up instead of failing its first image request."""
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    from pixelwire.vllm import _connector

    MEDIA_CONNECTOR_REGISTRY.register(CONNECTOR_NAME)(_connector.PixelwireMediaConnector)
    selected = os.environ.get("VLLM_MEDIA_CONNECTOR", "http")
    if selected == CONNECTOR_NAME:
        import sys

        from pixelwire.transfer import ensure_nixl

        ensure_nixl()
        _connector.check_resize_setting(sys.argv)
    _connector.install_metrics(selected)
