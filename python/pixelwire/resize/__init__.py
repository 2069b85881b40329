"""Model-aware resize: the size a model's image processor will resize an
image to, so the frontend can ship exactly those pixels.

A policy (:class:`ResizePolicy`, :mod:`pixelwire.resize.policy`) is read
from a model's Hugging Face ``preprocessor_config.json`` plus vLLM-style
``--mm-processor-kwargs`` overrides (:mod:`pixelwire.resize.lookup`).
Given a decoded image's (height, width) it returns the size the processor
resizes to; the native decoder then resizes with the processor's own
arithmetic (transformers 5's torchvision backend, or Pillow for the PIL
backend), bit for bit, so the worker's processor finds the image already
at its target size and leaves it as is.

Each family (what transformers 5.19 does for a kind of processor) is a
module of :mod:`pixelwire.resize.families`: its settings, identity, size
arithmetic and config readers. :mod:`pixelwire.resize.registry` names the
image and video processor classes each family reads. Anything else
(tiling, pan-and-scan, unknown processors) gets no policy and one log line
saying why.
"""

from pixelwire.resize.lookup import (
    image_policy_from_config,
    image_resize_policy,
    video_policy_from_config,
    video_resize_policy,
)
from pixelwire.resize.policy import Filter, Kernel, ResizePolicy

__all__ = [
    "Filter",
    "Kernel",
    "ResizePolicy",
    "image_policy_from_config",
    "image_resize_policy",
    "video_policy_from_config",
    "video_resize_policy",
]
