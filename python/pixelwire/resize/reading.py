"""What a family reads its policy from, and the rules every family reads
it by: an image processor's config with vLLM's ``--mm-processor-kwargs``
over it, the processor's resample filter, and :class:`NoPolicy`, raised
with why a processor gets none."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pixelwire.resize.policy import Filter, Kernel

# PIL's resample numbers, as preprocessor configs spell them. Lanczos (1) is
# taken only by the families whose parity tests run it.
RESAMPLE: dict[int, Filter] = {1: "lanczos", 2: "bilinear", 3: "bicubic"}


class NoPolicy(Exception):
    """The processor's resize is not one pixelwire reproduces (the message
    says why): its images or frames travel at full resolution."""


def _no_model_config() -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class ImageConfig:
    """An image processor's config as vLLM runs it: ``config`` (the
    ``preprocessor_config.json``) with ``overrides`` (``--mm-processor-kwargs``),
    resized with ``kernel``; and what some families read besides:
    ``processor`` (the top level of ``processor_config.json``), the
    model's ``config.json`` (read only when a family asks, :attr:`model`),
    and whether approximate policies are wanted."""

    config: Mapping[str, Any]
    overrides: Mapping[str, Any] = field(default_factory=dict)
    kernel: Kernel = "torchvision"
    processor: Mapping[str, Any] = field(default_factory=dict)
    read_model_config: Callable[[], Mapping[str, Any]] = _no_model_config
    approximate: bool = False

    @cached_property
    def name(self) -> str:
        """The image processor class the config names, as the registry
        spells it: without transformers' backend suffixes, a processor's
        ``...VLProcessor`` as its image processor."""
        auto_map = self.config.get("auto_map")
        # A remote-code processor may be named only by its auto_map entry ("module.Class").
        remote = auto_map.get("AutoImageProcessor") if isinstance(auto_map, dict) else None
        remote_name = remote.rsplit(".", 1)[-1] if isinstance(remote, str) else ""
        name = str(
            self.config.get("image_processor_type") or self.config.get("processor_class") or remote_name
        )
        for suffix in ("Fast", "Pil"):
            name = name.removesuffix(suffix)
        return name.replace("Processor", "ImageProcessor") if name.endswith("VLProcessor") else name

    @property
    def backend(self) -> str:
        """The backend transformers 5.19 loads the image processor with,
        from vLLM's overrides: their ``backend``, else the deprecated
        ``use_fast`` (false: "pil"), else "torchvision" (installed with vLLM)."""
        backend, use_fast = self.overrides.get("backend"), self.overrides.get("use_fast")
        if backend is None and use_fast is not None:
            backend = "torchvision" if use_fast else "pil"
        return "torchvision" if backend is None else str(backend)

    @cached_property
    def model(self) -> Mapping[str, Any]:
        """The model's ``config.json`` (empty where there is none)."""
        return self.read_model_config()

    @property
    def settings(self) -> dict[str, Any]:
        """The config with the overrides over it, but for ``size``, which
        :meth:`size` merges key by key."""
        return {**self.config, **{key: value for key, value in self.overrides.items() if key != "size"}}

    def size(self) -> dict[str, Any]:
        """The config's ``size`` with the overrides' ``size`` over it."""
        return {**dict(self.config.get("size") or {}), **dict(self.overrides.get("size") or {})}

    def resize_filter(self, default: int = 3, lanczos: bool = False) -> Filter:
        """The filter the processor resizes with (its ``resample``, else
        ``default``). Raises :class:`NoPolicy` where it does not resize or
        resizes with a filter pixelwire does not reproduce for it (Lanczos
        only where ``lanczos``)."""
        settings = self.settings
        if settings.get("do_resize", True) is False:
            raise NoPolicy(f"{self.name or 'the processor'} does not resize (do_resize is false)")
        resample = settings.get("resample", default)
        filter_ = RESAMPLE.get(resample) if isinstance(resample, int) else None
        if filter_ is None or (filter_ == "lanczos" and not lanczos):
            raise NoPolicy(f"{self.name}: resample {resample!r} is not one pixelwire resizes with for it")
        return filter_


def positive(value: Any) -> bool:
    """Whether a config value is a positive integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
