"""The layouts of processed inputs the model this vLLM serves takes, from
its command line and files: what the worker declares at start-up and what
its connector lays rows out for (the seam, :mod:`pixelwire.vllm.processed_inputs`,
checks vLLM's resolved settings itself)."""

from __future__ import annotations

import os
import sys

from pixelwire.processed import PatchLayout, patch_layout
from pixelwire.resize import ResizePolicy
from pixelwire.vllm.served_model import served_model


def device_normalises(argv: list[str]) -> bool:
    """Whether vLLM started with ``argv`` normalises images on the device
    (``--mm-device-do-normalize``, on by default for the covered models;
    VLLM_USE_RUST_FRONTEND turns it off): the patch rows are then uint8,
    else the processor's float32 values.
    The seam checks vLLM's resolved setting itself; this is what the
    worker declares at start-up."""
    if os.environ.get("VLLM_USE_RUST_FRONTEND", "").strip().lower() in ("1", "true"):
        return False
    on = True
    for arg in argv:
        name, _, value = arg.replace("_", "-").partition("=")
        if name == "--no-mm-device-do-normalize":
            on = False
        elif name == "--mm-device-do-normalize":
            on = value.lower() not in ("false", "0", "no", "off")
    return on


def worker_patch_layout(policy: ResizePolicy | None) -> PatchLayout | None:
    """The patch layout of the model this vLLM serves (its resize policy:
    ``policy``), or None where it takes no processed inputs."""
    served = served_model(sys.argv)
    if served.model is None or served.trusts_request_kwargs:
        return None
    try:
        return patch_layout(
            served.model, served.mm_processor_kwargs, policy, device_normalize=device_normalises(sys.argv)
        )
    except (OSError, ValueError):
        return None
