"""Images decoded and published side by side on native threads
(:func:`publish_many`), each as its descriptor (:func:`image_descriptor`),
with the options they are published with (:class:`ImageOptions`)."""

from __future__ import annotations

import concurrent.futures
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pixelwire import _native
from pixelwire._native import PixelwireError
from pixelwire.config import Layout, Mode
from pixelwire.descriptor import Decoded
from pixelwire.processed import PatchLayout
from pixelwire.publisher.off_loop import publish_executor
from pixelwire.publisher.slots import release_slot, slot_fields

if TYPE_CHECKING:
    from pixelwire.resize import ResizePolicy

    # How an image is shaped for the model: resized pixels, or the
    # processor's patch rows of them (processed inputs, layout "PATCHES").
    Shaping = ResizePolicy | PatchLayout
    # One image's outcome of a publish: its published fields and source
    # SHA-256, or its error (the fields' type is the stub's only).
    PublishOutcome = tuple[_native.Published, str] | Exception


@dataclass(frozen=True)
class ImageOptions:
    """How a call's images are published: decoded into ``mode``, RGBA
    composited onto ``background`` for RGB, stored in ``layout``, shaped
    for the model as ``resize`` says (None: full resolution)."""

    mode: Mode
    background: tuple[int, int, int]
    layout: Layout
    resize: Shaping | None

    def check(self) -> None:
        """Refuses options no image can be published with."""
        if self.resize is not None and self.mode != "RGB":
            raise ValueError("a model-aware resize needs mode='RGB' (what the processors see)")
        if (self.layout == "PATCHES") != isinstance(self.resize, PatchLayout):
            raise ValueError("the PATCHES layout is made for a processor's patch layout (resize=PatchLayout)")


def _resize_target(
    data: bytes | bytearray, resize: Shaping | None
) -> list[tuple[int, int]] | Exception | None:
    """The sizes `resize` takes the image to in turn (the last is the one
    shipped), from its header (the orientation applied); the error instead
    when its header says no."""
    if resize is None:
        return None
    try:
        return resize.steps(*_native.probe_image(data)["oriented_size"])
    except (PixelwireError, ValueError) as error:
        return error


def publish_many(
    native: _native.NativePublisher,
    sources: Sequence[bytes | bytearray],
    options: ImageOptions,
    control: _native.BatchControl,
    threads: int,
    digests: Sequence[str] | None = None,
) -> list[PublishOutcome]:
    """Decode-and-publish of every source (each resized as ``options`` say),
    side by side on native threads, plus each published source's SHA-256
    (`digests` when given), in one trip off the event loop (hashlib releases
    the GIL on large inputs). One result per source, in order; a source that
    fails costs only itself."""
    resize = options.resize
    targets = [_resize_target(data, resize) for data in sources]
    to_publish = [index for index, target in enumerate(targets) if not isinstance(target, Exception)]
    kernel: dict[str, Any] = {}
    if resize is not None:
        kernel = {"resize_kernel": resize.kernel, "resize_filter": resize.filter}
    published = iter(
        native.publish_many(
            [sources[index] for index in to_publish],
            mode=options.mode,
            background=options.background,
            rgbx=options.layout == "RGBX",
            patches=resize.wire_grid if isinstance(resize, PatchLayout) else None,
            resizes=[target for target in targets if not isinstance(target, Exception)],
            control=control,
            threads=threads,
            **kernel,
        )
        if to_publish
        else []
    )
    outcomes: list[PublishOutcome] = []
    for index, (data, target) in enumerate(zip(sources, targets, strict=True)):
        fields = target if isinstance(target, Exception) else next(published)
        if isinstance(fields, Exception):
            outcomes.append(fields)
        else:
            outcomes.append((fields, hashlib.sha256(data).hexdigest() if digests is None else digests[index]))
    return outcomes


def sha256s(sources: Sequence[bytes | bytearray]) -> list[str]:
    """Each source's SHA-256 (off the event loop: hashlib releases the GIL on large inputs)."""
    return [hashlib.sha256(data).hexdigest() for data in sources]


def release_batch(native: _native.NativePublisher, outcomes: list[PublishOutcome]) -> None:
    """Frees what an abandoned batch still reports as published."""
    for outcome in outcomes:
        if not isinstance(outcome, Exception):
            release_slot(native, outcome[0])


@dataclass(frozen=True)
class ImageBatch:
    """Images published side by side (:func:`publish_many`) as a
    :class:`pixelwire.publisher.medium.MediumPublish`: each one's
    :class:`Decoded`, or the exception it failed with."""

    sources: Sequence[bytes | bytearray]
    options: ImageOptions
    threads: int
    digests: Sequence[str] | None = None

    def executor(self) -> concurrent.futures.Executor:
        return publish_executor()

    def run(self, native: _native.NativePublisher, control: _native.BatchControl) -> list[PublishOutcome]:
        return publish_many(native, self.sources, self.options, control, self.threads, self.digests)

    def release(self, native: _native.NativePublisher, result: list[PublishOutcome]) -> None:
        release_batch(native, result)

    def described(
        self, agent: str, result: list[PublishOutcome], published_at: float
    ) -> list[Decoded | Exception]:
        return [
            outcome
            if isinstance(outcome, Exception)
            else image_descriptor(agent, *outcome, self.options, published_at)
            for outcome in result
        ]


def image_descriptor(
    agent: str, fields: _native.Published, source_sha256: str, options: ImageOptions, published_at: float
) -> Decoded:
    """The descriptor of one image `agent` published."""
    resize = options.resize
    source = fields["source_shape"]
    processed = resize.record(*resize.target(*source)) if isinstance(resize, PatchLayout) else None
    policy = resize.resize if isinstance(resize, PatchLayout) else resize
    return Decoded(
        **slot_fields(agent, fields),
        shape=fields["shape"],
        format=fields["format"],
        color_type=options.mode,
        background=options.background,
        published_at=published_at,
        source_sha256=source_sha256,
        layout=options.layout,
        extra={"source_mode": fields["color_type"]},
        resize=None if policy is None else {"policy": policy.identity, "source": list(source)},
        processed=processed,
    )
