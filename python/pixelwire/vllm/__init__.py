"""pixelwire's vLLM plug-in: a media connector named ``"pixelwire"``.

vLLM calls :func:`register` in each of its processes through the
``vllm.general_plugins`` entry point; ``VLLM_MEDIA_CONNECTOR=pixelwire``
selects the connector. Importing :mod:`pixelwire` never imports vLLM: only
:func:`register` does.
"""

from __future__ import annotations

import logging
import os

from pixelwire.config import CONNECTOR_NAME

__all__ = ["CONNECTOR_NAME", "register"]


def _log_through_vllm() -> None:
    """vLLM configures only its own ``vllm`` logger, so pixelwire's start-up
    lines below WARNING would go unseen: unless the process set up logging
    itself (a root handler), pixelwire's logger uses vLLM's handlers."""
    ours, theirs = logging.getLogger("pixelwire"), logging.getLogger("vllm")
    if ours.handlers or logging.getLogger().handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.level)
    ours.propagate = False


def register() -> None:
    """Registers the connector and its metrics (idempotent). When vLLM is
    told to use it, NIXL is loaded now, so a broken install stops vLLM at
    start-up instead of failing its first image request."""
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    from pixelwire.vllm import connector, worker_settings

    _log_through_vllm()
    MEDIA_CONNECTOR_REGISTRY.register(CONNECTOR_NAME)(connector.PixelwireMediaConnector)
    selected = os.environ.get("VLLM_MEDIA_CONNECTOR", "http")
    if selected == CONNECTOR_NAME:
        import sys

        from pixelwire.nixl import ensure_nixl
        from pixelwire.vllm.nixl_interfaces import apply_reader_interfaces

        apply_reader_interfaces(sys.argv)
        ensure_nixl()
        worker_settings.check_signing_setting()
        worker_settings.check_media_cache_setting()
        worker_settings.check_resize_setting(sys.argv)
        from pixelwire.vllm import processed_inputs

        processed_inputs.install_processor_seam()
    worker_settings.install_metrics(selected)
