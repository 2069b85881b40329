"""Processed inputs: an image shipped as what vLLM's processor would hand
its engine for it, so that vLLM's API server makes no pass over its pixels.

Covered (:data:`FAMILIES`, each family's specifics in one place): the
models vLLM serves with ``Qwen2VLMultiModalProcessor`` (Qwen2-VL, and
Qwen2.5-VL through its subclass), with ``Qwen3VLMultiModalProcessor``
(Qwen3-VL, dense and MoE), whose image processor is transformers'
``Qwen2VLImageProcessor``, and with ``Glm4vMultiModalProcessor`` (GLM-4.1V
and GLM-4.5V), whose image processor is ``Glm4vImageProcessor``: the same
patch rows as Qwen2-VL's, of an image resized by GLM's own
``smart_resize`` (its pixel budget counts the temporal patch). All on the
default torchvision backend, with vLLM's device-side normalisation
(``mm_device_do_normalize``, on by default for them) or without it. With
it, the processor's output is the resized image's own bytes, cut into
patch rows (``pixel_values``, uint8, ``rows x 3*T*P*P``); without it, the
same rows of the processor's float32 normalised values
(:class:`Normalisation`, computed natively with the torchvision backend's
own arithmetic, bit for bit). With them ``image_grid_thw`` ``[1, H/P,
W/P]``: the frontend resizes exactly as the processor does
(:mod:`pixelwire.resize`) and lays the rows out natively
(``src/patches.rs``), each patch once and as the image's bytes, float rows
or not (:attr:`PatchLayout.dtype`); the worker makes the temporal copies,
and the float values where they are wanted, as it hands them on
(:mod:`pixelwire.vllm.processed_inputs`).

:func:`processed_identity` is the one rule naming such an output: the
frontend computes it from ``--model``'s configs, the plug-in from the
processor its vLLM would run, and a processed image is handed to vLLM only
when the two are equal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pixelwire import model_files
from pixelwire.resize import Filter, Kernel, ResizePolicy
from pixelwire.resize.families.smart import SmartPolicy


@dataclass(frozen=True)
class Family:
    """A processor family whose images pixelwire ships processed."""

    # The processed identity's first word: what lays the rows out.
    rows: str
    # config.json model_type of the models vLLM serves with its processor.
    model_types: tuple[str, ...]
    # The image processor class transformers 5.19 loads for them on the
    # torchvision backend (its PIL backend's class is another).
    image_processor: str
    # Whether its smart resize counts the temporal patch (GLM's): the
    # resize policy's temporal factor, else none (Qwen's).
    temporal_resize: bool
    # vLLM 0.32's multimodal processor class, as "module:class", whose
    # _apply_hf_processor_main is the seam (pixelwire.vllm.processed_inputs).
    seam: str
    # Whether that seam lays out its processed videos (Qwen2-VL's: one HF
    # call for a request's videos); Qwen3-VL's videos are answered at its
    # per-video HF calls instead, and GLM-4.1V's are not covered.
    videos_at_seam: bool = False


FAMILIES = (
    # Qwen2.5-VL's processor is Qwen2VLMultiModalProcessor's subclass, and
    # transformers 5 loads Qwen2VLImageProcessor for it.
    Family(
        rows="qwen2_vl_patches",
        model_types=("qwen2_vl", "qwen2_5_vl"),
        image_processor="Qwen2VLImageProcessor",
        temporal_resize=False,
        seam="vllm.model_executor.models.qwen2_vl:Qwen2VLMultiModalProcessor",
        videos_at_seam=True,
    ),
    # Qwen3-VL: the same image processor (patch 16 in its config); its
    # vLLM processor overrides the seam to call the HF processor for the
    # images and each video apart.
    Family(
        rows="qwen2_vl_patches",
        model_types=("qwen3_vl", "qwen3_vl_moe"),
        image_processor="Qwen2VLImageProcessor",
        temporal_resize=False,
        seam="vllm.model_executor.models.qwen3_vl:Qwen3VLMultiModalProcessor",
    ),
    # GLM-4.1V and GLM-4.5V (vLLM registers Glm4vMoeForConditionalGeneration
    # with the same processor): Glm4vImageProcessor patchifies, rescales and
    # normalises as Qwen2VLImageProcessor does, with the same class defaults;
    # its resize is GLM's smart_resize over size alone. vLLM's processor
    # overrides the seam (videos item by item, then one HF call).
    Family(
        rows="glm4v_patches",
        model_types=("glm4v", "glm4v_moe"),
        image_processor="Glm4vImageProcessor",
        temporal_resize=True,
        seam="vllm.model_executor.models.glm4_1v:Glm4vMultiModalProcessor",
    ),
)
COVERED_MODEL_TYPES = tuple(model_type for family in FAMILIES for model_type in family.model_types)


def family_of(model_type: object) -> Family | None:
    """The family of a config.json ``model_type`` (None: not covered)."""
    return next((family for family in FAMILIES if model_type in family.model_types), None)


# The covered image processors' class defaults for the patch grid.
_DEFAULT_GRID = {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2}
# ... and for its rescale and normalisation (OPENAI_CLIP_MEAN and _STD).
_DEFAULT_VALUES = {
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
NORMALISATION_SETTINGS = tuple(_DEFAULT_VALUES)
CHANNELS = 3

Backend = Literal["torchvision"]
# The native ``normalize=``: (backend, image_mean, image_std, rescale_factor).
NativeNormalize = tuple[str, tuple[float, float, float], tuple[float, float, float], float]


@dataclass(frozen=True)
class Normalisation:
    """The processor's rescale and normalisation, both on, as its
    ``backend`` computes them (transformers 5.19's torchvision backend:
    ``mean * (1 / rescale_factor)`` and ``std * (1 / rescale_factor)`` in
    float32, then ``(x - mean) / std`` in float32; ``src/patches.rs``):
    the rows are then float32."""

    backend: Backend
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    rescale: float

    @property
    def identity(self) -> str:
        """The values' part of the processed identity (every float as
        Python writes it, so two sides agree only on the same bits)."""
        floats = (",".join(repr(v) for v in values) for values in (self.mean, self.std))
        mean, std = floats
        return f"float32:{self.backend}:mean={mean}:std={std}:rescale={self.rescale!r}"

    @property
    def native(self) -> NativeNormalize:
        """The native ``normalize=``."""
        return self.backend, self.mean, self.std, self.rescale


def normalisation(settings: Mapping[str, Any], backend: Backend) -> Normalisation | None:
    """The normalisation of an image processor's ``settings`` (its config
    with vLLM's kwargs over it; the class defaults where they are silent);
    None where its float rows are not ones pixelwire makes (rescale or
    normalisation off, a mean or std that is not three finite numbers)."""
    values = {**_DEFAULT_VALUES, **{k: v for k, v in settings.items() if k in _DEFAULT_VALUES}}
    if values["do_rescale"] is not True or values["do_normalize"] is not True:
        return None
    mean, std, rescale = values["image_mean"], values["image_std"], values["rescale_factor"]

    def number(value: Any) -> bool:
        return type(value) in (int, float) and math.isfinite(value)

    if not (isinstance(mean, (list, tuple)) and isinstance(std, (list, tuple))):
        return None
    if len(mean) != CHANNELS or len(std) != CHANNELS or not all(map(number, [*mean, *std, rescale])):
        return None
    if rescale <= 0 or any(float(v) == 0 for v in std):
        return None
    m0, m1, m2 = (float(v) for v in mean)
    s0, s1, s2 = (float(v) for v in std)
    return Normalisation(backend, (m0, m1, m2), (s0, s1, s2), float(rescale))


def processed_identity(
    patch: int,
    temporal: int,
    merge: int,
    resize_identity: str,
    values: Normalisation | None = None,
    *,
    rows: str = "qwen2_vl_patches",
) -> str:
    """What names a processed image's form: patch rows of a ``patch``-pixel
    grid, ``temporal`` copies, ``merge`` windows, of an image resized by the
    policy ``resize_identity``; uint8 (the image's bytes) or the float32
    values of ``values``; laid out as the family ``rows`` lays them out
    (:attr:`Family.rows`)."""
    kind = "uint8" if values is None else values.identity
    return f"{rows}:{kind}:patch={patch}:temporal={temporal}:merge={merge}:{resize_identity}"


@dataclass(frozen=True)
class PatchLayout:
    """How a model's processor turns a resized image into its patch rows."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    resize: SmartPolicy
    # None: uint8 rows (vLLM normalises on the device); else float32 rows.
    normalisation: Normalisation | None = None
    # The family's :attr:`Family.rows`, which the identity begins with.
    rows: str = "qwen2_vl_patches"

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
        return processed_identity(*self.grid, self.resize.identity, self.normalisation, rows=self.rows)

    @property
    def dtype(self) -> str:
        """The rows' numpy dtype as they travel: uint8, the resized image's
        own bytes, whatever the processor's values. Float rows are made from
        them at the worker (:mod:`pixelwire.vllm.processed_inputs`), in the
        one native pass that makes the temporal copies: as float32 they
        would take four times the pools and the wire (a photo kept whole at
        Qwen3-VL's default budget: 201 MB, most of a default 256 MiB pool)."""
        return "uint8"

    @property
    def bytes_per_pixel(self) -> int:
        """Bytes a pixel of the resized image takes in the rows as they
        travel: what its pixels take, float rows or not."""
        return CHANNELS

    @property
    def native_normalize(self) -> NativeNormalize | None:
        """The native ``normalize=`` (None: uint8 rows)."""
        return None if self.normalisation is None else self.normalisation.native

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
        grid_thw = self.grid_thw(height, width)
        return {"processor": self.identity, "grid_thw": grid_thw, "patch": list(self.grid)}


def patch_layout(
    model: str,
    mm_processor_kwargs: Mapping[str, Any] | None,
    resize: ResizePolicy | None,
    *,
    device_normalize: bool = True,
) -> PatchLayout | None:
    """The patch layout of ``model`` served with ``mm_processor_kwargs``
    (vLLM's ``--mm-processor-kwargs``), whose resize policy is ``resize``,
    by a vLLM that normalises images on the device (``device_normalize``:
    uint8 rows) or not (float32 rows); None where processed inputs are not
    made for it (another processor, the PIL backend, a resize or a
    normalisation pixelwire does not reproduce)."""
    if not isinstance(resize, SmartPolicy) or resize.video_frames or resize.kernel != "torchvision":
        return None
    family = family_of(model_files.model_config(model).get("model_type"))
    # The family's own smart resize: GLM's counts the temporal patch, Qwen's not.
    if family is None or bool(resize.temporal_factor) != family.temporal_resize:
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
    if patch * merge != resize.factor or (family.temporal_resize and temporal != resize.temporal_factor):
        return None
    if device_normalize:
        return PatchLayout(patch, temporal, merge, resize, rows=family.rows)
    values = normalisation(settings, "torchvision")
    return None if values is None else PatchLayout(patch, temporal, merge, resize, values, family.rows)
