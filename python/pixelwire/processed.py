"""Processed inputs: an image shipped as what vLLM's processor would hand
its engine for it, so that vLLM's API server makes no pass over its pixels.

Covered: the models vLLM serves with ``Qwen2VLMultiModalProcessor``
(Qwen2-VL, and Qwen2.5-VL through its subclass) or with
``Qwen3VLMultiModalProcessor`` (Qwen3-VL, dense and MoE), whose image processor is
transformers' ``Qwen2VLImageProcessor`` on its default torchvision backend,
with vLLM's device-side normalisation (``mm_device_do_normalize``, on by
default for them). The processor's output is then the resized image's own
bytes, cut into patch rows (``pixel_values``, uint8, ``rows x 3*T*P*P``),
with ``image_grid_thw`` ``[1, H/P, W/P]``: the frontend resizes exactly as
the processor does (:mod:`pixelwire.resize`) and lays the rows out natively
(``src/patches.rs``), each patch once; the worker makes the temporal copies
as it hands them on (:mod:`pixelwire.vllm.processed_inputs`).

:func:`processed_identity` is the one rule naming such an output: the
frontend computes it from ``--model``'s configs, the plug-in from the
processor its vLLM would run, and a processed image is handed to vLLM only
when the two are equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pixelwire import model_files
from pixelwire.resize import Filter, Kernel, ResizePolicy
from pixelwire.resize.families.smart import SmartPolicy

# config.json model_type of the models vLLM processes with
# Qwen2VLMultiModalProcessor (Qwen2.5-VL's processor is its subclass) or
# Qwen3VLMultiModalProcessor (Qwen3-VL and Qwen3-VL-MoE): each has the
# processor seam (pixelwire.vllm.processed_inputs) and an image processor
# that is transformers' Qwen2VLImageProcessor (Qwen3-VL's with patch 16).
COVERED_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
# transformers' Qwen2VLImageProcessor defaults for the patch grid.
_DEFAULT_GRID = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}
CHANNELS = 3


def processed_identity(patch: int, temporal: int, merge: int, resize_identity: str) -> str:
    """What names a processed image's form: uint8 patch rows of a
    ``patch``-pixel grid, ``temporal`` copies, ``merge`` windows, of an
    image resized by the policy ``resize_identity``."""
    return f"qwen2_vl_patches:uint8:patch={patch}:temporal={temporal}:merge={merge}:{resize_identity}"


@dataclass(frozen=True)
class PatchLayout:
    """How a model's processor turns a resized image into its patch rows."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    resize: SmartPolicy

    @property
    def grid(self) -> tuple[int, int, int]:
        """``patches=`` for the processor's own rows (each patch repeated
        along the temporal patch), as vLLM's engine gets them."""
        return self.patch_size, self.temporal_patch_size, self.merge_size

    @property
    def wire_grid(self) -> tuple[int, int, int]:
        """``patches=`` for the rows as they travel: each patch once (the
        temporal copies are made at the worker, as the rows leave its
        receive memory), so they cost what the pixels would."""
        return self.patch_size, 1, self.merge_size

    @property
    def identity(self) -> str:
        return processed_identity(*self.grid, self.resize.identity)

    @property
    def bytes_per_pixel(self) -> int:
        """Bytes a pixel of the resized image takes in the rows as they travel."""
        return CHANNELS

    @property
    def kernel(self) -> Kernel:
        return self.resize.kernel

    @property
    def filter(self) -> Filter:
        return self.resize.filter

    def target(self, height: int, width: int) -> tuple[int, int]:
        """The size the processor resizes a (height, width) image to: the
        rows are that image's (its one resize, whatever the size)."""
        return self.resize.processor_target(height, width)

    def steps(self, height: int, width: int) -> list[tuple[int, int]]:
        """The native decoder's ``resize=``: :meth:`target`, in one step."""
        return [self.target(height, width)]

    def grid_thw(self, height: int, width: int) -> list[int]:
        """``image_grid_thw`` of an image resized to (height, width)."""
        return [1, height // self.patch_size, width // self.patch_size]

    def record(self, height: int, width: int) -> dict[str, Any]:
        """The descriptor's ``pixelwire.processed`` for an image resized to (height, width)."""
        return {
            "processor": self.identity,
            "grid_thw": self.grid_thw(height, width),
            "patch": list(self.grid),
        }


def patch_layout(
    model: str, mm_processor_kwargs: Mapping[str, Any] | None, resize: ResizePolicy | None
) -> PatchLayout | None:
    """The patch layout of ``model`` served with ``mm_processor_kwargs``
    (vLLM's ``--mm-processor-kwargs``), whose resize policy is ``resize``;
    None where processed inputs are not made for it (another processor,
    the PIL backend, a resize pixelwire does not reproduce)."""
    # Qwen2VLImageProcessor's own smart resize (not GLM's, nor a video's).
    if not isinstance(resize, SmartPolicy) or resize.temporal_factor or resize.kernel != "torchvision":
        return None
    if model_files.model_config(model).get("model_type") not in COVERED_MODEL_TYPES:
        return None
    kwargs = dict(mm_processor_kwargs or {})
    if kwargs.get("use_fast") is False or kwargs.get("backend") not in (None, "torchvision"):
        return None
    settings = {**_DEFAULT_GRID, **model_files.image_processor_config(model), **kwargs}
    if settings.get("do_resize", True) is False:
        return None
    grid = [settings[name] for name in _DEFAULT_GRID]
    if not all(type(value) is int and 0 < value <= 1024 for value in grid):
        return None
    patch, temporal, merge = grid
    if patch * merge != resize.factor:
        return None
    return PatchLayout(patch, temporal, merge, resize)
