"""A model's resize policies, looked up by its processors' class names in
:mod:`pixelwire.resize.registry` and read from their configs (found and
read by :mod:`pixelwire.model_files`); None, logged with why, where
pixelwire does not reproduce the resize."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

from pixelwire import model_files
from pixelwire.resize.policy import Kernel, ResizePolicy
from pixelwire.resize.reading import ImageConfig, NoPolicy
from pixelwire.resize.registry import IMAGE_PROCESSORS, PILLOW_BACKENDS, VIDEO_PROCESSORS

log = logging.getLogger("pixelwire.resize")


def image_resize_policy(
    model: str | os.PathLike[str],
    mm_processor_kwargs: Mapping[str, Any] | None = None,
    *,
    kernel: Kernel = "torchvision",
    approximate: bool = False,
) -> ResizePolicy | None:
    """The image policy of a model: a local folder, or a Hub id resolved
    through the Hugging Face cache. Read: the image processor's config
    (``preprocessor_config.json``, or the ``image_processor`` part of
    ``processor_config.json``, where transformers 5 saves it), the
    processor's own settings, and ``config.json`` where the family needs
    it. ``approximate``: see :func:`image_policy_from_config`."""
    config = model_files.image_processor_config(str(model))
    overrides, processor = dict(mm_processor_kwargs or {}), model_files.processor_settings(str(model))
    return _image_policy(
        ImageConfig(
            config, overrides, kernel, processor, lambda: model_files.model_config(str(model)), approximate
        )
    )


def image_policy_from_config(
    config: Mapping[str, Any],
    mm_processor_kwargs: Mapping[str, Any] | None = None,
    *,
    kernel: Kernel = "torchvision",
    processor_config: Mapping[str, Any] | None = None,
    model_config: Mapping[str, Any] | None = None,
    approximate: bool = False,
) -> ResizePolicy | None:
    """The policy of a ``preprocessor_config.json`` with vLLM's
    ``--mm-processor-kwargs`` applied the way vLLM applies them (``size``
    first, then ``min_pixels``/``max_pixels``); None, logged, when
    pixelwire cannot reproduce the processor's resize.
    ``processor_config``: the processor's own settings (the top level of
    ``processor_config.json``), which Pixtral's resize depends on.
    ``model_config``: the model's ``config.json``, which vLLM counts an
    anyres image's tokens with. ``approximate``: also the policies whose
    outputs are not the processor's own on the original (anyres)."""
    overrides, processor = dict(mm_processor_kwargs or {}), processor_config or {}
    return _image_policy(
        ImageConfig(config, overrides, kernel, processor, lambda: model_config or {}, approximate)
    )


def _image_policy(image: ImageConfig) -> ResizePolicy | None:
    """The policy of ``image``'s processor, read by the registry's reader
    for it, with the kernel of the backend vLLM loads it with."""
    read = IMAGE_PROCESSORS.get(image.name)
    try:
        if read is None:
            raise NoPolicy(
                f"{image.name or 'an unnamed image processor'} is not a family pixelwire resizes for"
            )
        if image.backend != "torchvision":
            if image.backend != "pil" or image.name not in PILLOW_BACKENDS:
                raise NoPolicy(f"{image.name}'s {image.backend!r} backend is not one pixelwire resizes for")
            image = dataclasses.replace(image, kernel="pillow")
        return read(image)
    except NoPolicy as why:
        log.info("no model-aware resize: %s; images travel at full resolution", why)
        return None


def video_resize_policy(
    model: str | os.PathLike[str], mm_processor_kwargs: Mapping[str, Any] | None = None
) -> ResizePolicy | None:
    """The resize ``model``'s video processor applies to each frame, read
    from its ``video_preprocessor_config.json`` or the ``video_processor``
    part of ``processor_config.json`` (:func:`video_policy_from_config`)."""
    config = model_files.video_processor_config(str(model))
    if config is None:
        log.info(
            "no model-aware resize of video frames: %s: no video processor config; frames travel at full "
            "resolution",
            model,
        )
        return None
    return video_policy_from_config(config, mm_processor_kwargs)


def video_policy_from_config(
    config: Mapping[str, Any], mm_processor_kwargs: Mapping[str, Any] | None = None
) -> ResizePolicy | None:
    """The resize a video processor config's processor applies to each
    frame: ``Qwen2VLVideoProcessor``'s per frame, ``Qwen3VLVideoProcessor``'s
    per video (see
    :meth:`~pixelwire.resize.families.smart_video.SmartVideoPolicy.video_target`).
    None, logged, when pixelwire does not reproduce it: another video
    processor, ``--mm-processor-kwargs`` (vLLM passes them on to videos by
    rules of its own) or Qwen2-VL's per-frame pixel cap."""
    name = str(config.get("video_processor_type") or "").removesuffix("Fast")
    processor = VIDEO_PROCESSORS.get(name)
    try:
        if processor is None or processor.read is None:
            raise NoPolicy(f"{name or 'an unnamed video processor'} is not one pixelwire resizes for")
        if mm_processor_kwargs:
            raise NoPolicy("not with --mm-processor-kwargs")
        return processor.read(config)
    except NoPolicy as why:
        log.info("no model-aware resize of video frames: %s; frames travel at full resolution", why)
        return None
