"""Processed inputs at the worker: a frontend's patch rows handed to vLLM's
engine as its processor's output, so that the API server makes no pass
over their pixels (:mod:`pixelwire.processed` says what they are).

The seam (docs/architecture.md, "Processed inputs"): vLLM 0.32's
``BaseMultiModalProcessor._apply_hf_processor_main``, on each covered
family's processor (:attr:`pixelwire.processed.Family.seam`):
``Qwen2VLMultiModalProcessor`` (Qwen2.5-VL's processor inherits it),
``Qwen3VLMultiModalProcessor``'s own override of it (which calls the HF
processor for the images and each video apart) and
``Glm4vMultiModalProcessor``'s (videos item by item, then one call). Every
path of vLLM's processing goes through it, with its processor cache on or
off (lru, shm): it turns a request's media items into the processor's
``BatchFeature``, from which vLLM builds the items, their prompt updates
and what its caches keep. The wrapper takes the processed images out, has
the HF processor make the rest (none: it is not called), and puts each
processed image's rows and grid in its place.

A processed image travels from the connector to the seam as a
:class:`ProcessedImage`: a small ndarray (vLLM's parser leaves arrays as
they are, and re-parses them so on a cache miss) whose bytes are the
image's keyed identity, which vLLM's hasher keys its caches on, with the
rows and grid attached. It is handed to vLLM only when the processor this
vLLM would run has the same identity and the request sets no
``mm_processor_kwargs`` of its own; otherwise the request fails with a
ValueError (vLLM's 400) naming the setting. Never a wrong tensor.
"""

from __future__ import annotations

import importlib
import logging
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from pixelwire._native import join_patch_rows
from pixelwire.processed import (
    FAMILIES,
    NORMALISATION_SETTINGS,
    Normalisation,
    family_of,
    normalisation,
    processed_identity,
)
from pixelwire.resize import image_policy_from_config
from pixelwire.vllm.processed_videos import answer_video_call, splice_videos, split_videos

log = logging.getLogger("pixelwire.vllm")

_install_lock = threading.Lock()
_installed = False


class ProcessedImage(np.ndarray):
    """A processed image on its way to the seam: the array is its keyed
    identity (what vLLM's caches key it on); ``rows`` (a 2-D numpy array of
    patch rows: uint8 as they travel from a frontend, whatever the
    processor's values; uint8 or float32 made here), ``copies`` (how many times each block of a row
    lands in the processor's own rows: its temporal patch for rows as they
    travel, 1 for rows made here), ``lent`` (the rows are the reader's
    receive memory, lent until the carrier is dropped), ``image_grid_thw``
    (int64, 1 x 3) and ``processor`` (the identity of the processor whose
    output they are) ride along."""

    rows: Any
    copies: int
    lent: bool
    image_grid_thw: Any
    processor: str


def processed_image(
    identity: bytes,
    rows: Any,
    grid_thw: list[int],
    processor: str,
    *,
    copies: int = 1,
    lent: bool = False,
) -> ProcessedImage:
    """The carrier of a processed image (read from a frontend, or made here)."""
    import torch

    item = np.frombuffer(identity, dtype=np.uint8).copy().reshape(1, -1, 1).view(ProcessedImage)
    item.rows, item.copies, item.lent = rows, copies, lent
    item.image_grid_thw = torch.tensor([grid_thw], dtype=torch.int64)
    item.processor = processor
    return item


def live_output(processor: Any) -> tuple[str, Normalisation | None] | None:
    """The identity of the output the processor ``processor`` (vLLM's
    multimodal processor) would make of an image, from its live HF image
    processor and vLLM's resolved settings, with the normalisation of its
    values: uint8 patch rows (None) with vLLM's device normalisation, the
    float32 rows of its rescale and normalisation without; None where
    pixelwire makes neither (the PIL backend among them)."""
    model_config = processor.info.ctx.model_config
    # The seams' classes also process models pixelwire does not cover
    # (their subclasses: Qwen3.5, InternS1-Pro, GLM-OCR, ...).
    family = family_of(getattr(model_config.hf_config, "model_type", None))
    if family is None:
        return None
    image_processor = processor.info.get_hf_processor().image_processor
    if type(image_processor).__name__ != family.image_processor:
        return None  # the PIL backend (its ...Pil class) makes float rows of Pillow's resize
    # vLLM passes its --mm-processor-kwargs to every call of the HF
    # processor, over the constructor's settings (GLM's size, image_mean,
    # say, are not ones its constructor takes).
    merged = processor.info.ctx.get_merged_mm_kwargs({})
    called = {**merged, **(merged.get("images_kwargs") or {})}
    policy = image_policy_from_config(image_processor.to_dict(), called)
    if policy is None:
        return None
    values = None
    if not model_config.multimodal_config.mm_device_do_normalize:
        settings = {
            name: called.get(name, getattr(image_processor, name, None)) for name in NORMALISATION_SETTINGS
        }
        values = normalisation(settings, "torchvision")
        if values is None:
            return None
    patch, temporal, merge = (
        called.get(name, getattr(image_processor, name))
        for name in ("patch_size", "temporal_patch_size", "merge_size")
    )
    return processed_identity(patch, temporal, merge, policy.identity, values, rows=family.rows), values


def _checked(
    processor: Any, items: list[ProcessedImage], hf_kwargs: Mapping[str, object]
) -> Normalisation | None:
    """Refuses processed images this vLLM would not have made as they are;
    else the normalisation of their values (None: uint8 rows)."""
    if hf_kwargs:
        raise ValueError(
            "this request sets its own mm_processor_kwargs, but its images came processed by a pixelwire "
            "frontend for the server's settings: send the request without them"
        )
    output = live_output(processor)
    ours = None if output is None else output[0]
    for item in items:
        if item.processor != ours:
            raise ValueError(
                f"the frontend processed this image for {item.processor}, but this vLLM's processor makes "
                f"{ours or 'no rows pixelwire makes (the PIL backend, or a normalisation it does not)'}: "
                "give the frontend vLLM's --model, --mm-processor-kwargs and --[no-]mm-device-do-normalize, "
                "or start it with --no-processed-inputs"
            )
    assert output is not None  # an item's processor is never None
    return output[1]


def _float_rows(
    processor: Any,
    values: Normalisation,
    everything: list[Any],
    processed: list[bool],
    parts: list[Any],
    copies: list[int],
) -> Any:
    """The float rows of a request's images as vLLM's engine gets them:
    each processed image's rows as float32 with their temporal copies made
    (one native pass: rows that travelled as the image's bytes become the
    processor's values, ``values``, in it), then cast to the model's dtype
    as vLLM casts its HF processor's float outputs
    (``InputProcessingContext._postprocess_output``:
    ``tensor.to(dtype=model_config.dtype)``, a copy only where that is not
    float32); the other images' rows as vLLM made them."""
    import torch

    dtype = processor.info.ctx.model_config.dtype
    tensors = []
    for item, p, part, n in zip(everything, processed, parts, copies, strict=True):
        if not p:
            tensors.append(part)
            continue
        if part.dtype == np.uint8:
            joined = join_patch_rows([part], [n], normalize=values.native)
        elif part.dtype != np.float32:
            raise ValueError(f"a request's processed rows are {part.dtype} beside float rows")
        elif n == 1 and not item.lent:
            tensors.append(torch.from_numpy(part).to(dtype=dtype))
            continue
        else:
            joined = join_patch_rows([part.view(np.uint8)], [n])
        rows = joined.reshape(joined.shape[0], -1).view(np.float32)
        tensors.append(torch.from_numpy(rows).to(dtype=dtype))
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def _apply_with_processed(original: Any, *, videos: bool = False) -> Any:
    """``original`` with processed images put in place, and with
    ``videos`` (the processors that call the HF processor once for every
    medium: Qwen2-VL's) processed videos too."""
    if videos:
        images = _apply_with_processed(original)

        def apply_videos(self: Any, mm_items: Any, hf_kwargs: Mapping[str, object]) -> Any:
            split = split_videos(self, mm_items, hf_kwargs)
            if split is None:
                return images(self, mm_items, hf_kwargs)
            rest, places = split
            out = images(self, rest, hf_kwargs)
            splice_videos(self, out, places)
            return out

        apply_videos.__wrapped__ = original  # type: ignore[attr-defined]
        return apply_videos

    def apply(self: Any, mm_items: Any, hf_kwargs: Mapping[str, object]) -> Any:
        from vllm.multimodal.parse import ImageProcessorItems, MultiModalDataItems

        images = mm_items.get("image")
        everything = images.get_all() if isinstance(images, ImageProcessorItems) else []
        processed = [isinstance(item, ProcessedImage) for item in everything]
        if not any(processed):
            return original(self, mm_items, hf_kwargs)
        values = _checked(self, [item for item, p in zip(everything, processed, strict=True) if p], hf_kwargs)
        import torch

        rest = MultiModalDataItems({name: items for name, items in mm_items.items() if name != "image"})
        others = [item for item, p in zip(everything, processed, strict=True) if not p]
        if others:
            rest["image"] = ImageProcessorItems(others)
        out = original(self, rest, hf_kwargs)
        made_rows, made_grids = out.get("pixel_values"), out.get("image_grid_thw")
        made = iter(
            zip(made_rows.split(made_grids.prod(-1).tolist()), made_grids.split(1), strict=True)
            if others
            else []
        )
        parts, copies, grids = [], [], []
        for item, p in zip(everything, processed, strict=True):
            if p:
                parts.append(item.rows)
                copies.append(item.copies)
                grids.append(item.image_grid_thw)
            else:
                rows, grid = next(made)
                parts.append(rows)  # a tensor (vLLM's, float ones in the model's dtype)
                copies.append(1)
                grids.append(grid)
        # The engine gets one tensor of every image's rows, made here in one
        # native pass that also writes each travelled patch's temporal
        # copies and frees the reader's receive memory the rows were lent
        # in: vLLM's items, which its processor cache may keep
        # (processor-only, with several API servers) as long as it likes,
        # never hold that memory. One image made here needs no pass at all.
        alone = (
            len(parts) == 1
            and copies[0] == 1
            and not any(item.lent for item, p in zip(everything, processed, strict=True) if p)
        )
        if values is None:
            # uint8 rows (vLLM's own images' too: its processor normalises none).
            arrays = [part.numpy() if isinstance(part, torch.Tensor) else part for part in parts]
            joined = arrays[0] if alone else join_patch_rows(arrays, copies)
            out["pixel_values"] = torch.from_numpy(joined.reshape(joined.shape[0], joined.shape[1]))
        else:
            out["pixel_values"] = _float_rows(self, values, everything, processed, parts, copies)
        out["image_grid_thw"] = grids[0] if len(grids) == 1 else torch.cat(grids)
        return out

    apply.__wrapped__ = original  # type: ignore[attr-defined]
    return apply


def _call_with_processed(original: Any) -> Any:
    """vLLM's ``InputProcessingContext.call_hf_processor``, answering
    Qwen3-VL's per-video calls on a processed video itself
    (:func:`pixelwire.vllm.processed_videos.answer_video_call`)."""

    def call(
        self: Any, hf_processor: Any, data: Mapping[str, object], kwargs: Mapping[str, object] = {}
    ) -> Any:
        answer = answer_video_call(self, hf_processor, data, kwargs)
        return original(self, hf_processor, data, kwargs) if answer is None else answer

    call.__wrapped__ = original  # type: ignore[attr-defined]
    return call


def install_processor_seam() -> None:
    """Wraps each covered family's ``_apply_hf_processor_main`` (once):
    Qwen2-VL's (inherited from vLLM's base processor), with its videos,
    Qwen3-VL's and GLM-4.1V's own; and vLLM's context's
    ``call_hf_processor``, to answer Qwen3-VL's per-video HF calls on
    processed videos."""
    global _installed
    with _install_lock:
        if _installed:
            return
        with warnings.catch_warnings():
            # vLLM's model modules warn of torch's own deprecations on
            # import: Python hides them by default, and so does this.
            warnings.simplefilter("ignore", DeprecationWarning)
            from vllm.multimodal.processing.context import InputProcessingContext

            seams: dict[Any, bool] = {}
            for family in FAMILIES:
                module, _, name = family.seam.partition(":")
                seam = getattr(importlib.import_module(module), name)
                seams[seam] = seams.get(seam, False) or family.videos_at_seam
        for covered, videos in seams.items():
            covered._apply_hf_processor_main = _apply_with_processed(
                covered._apply_hf_processor_main, videos=videos
            )
        InputProcessingContext.call_hf_processor = _call_with_processed(
            InputProcessingContext.call_hf_processor
        )
        _installed = True
