"""The media pixelwire carries, each a value: a :class:`Medium` names one,
the content part that carries it and its metrics label, and every layer
that handles media keeps a :class:`Registry` of its handlers, keyed by the
medium's name, and dispatches on it:

- :data:`MEDIA` (here): the media themselves;
- ``pixelwire.descriptor.DESCRIPTOR_MEDIA``: how a descriptor of the medium
  is recognised and its own fields checked;
- ``pixelwire.frontend.pipeline.FRONTEND_MEDIA``: what the frontend does with
  a part of the medium's kind (fetch within the limits, decode and publish,
  or pass on);
- ``pixelwire.vllm.reading.WORKER_MEDIA``: how the plug-in reads a descriptor
  of the medium into what vLLM's loader would return.

A new medium is its own module plus one registration in each (see
docs/architecture.md, "Adding a medium"). Image, video and processed images
are registered by the modules that handle them; a processed video is a
video at every layer but vLLM's processor (:data:`PROCESSED_VIDEO`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

H = TypeVar("H")


class UnknownMedium(ValueError):
    """A medium no handler of a layer is registered for."""


@dataclass(frozen=True)
class Medium:
    """One medium: its ``name`` (what descriptors and registries key it
    on), the ``part`` kind that carries it in a request (``MediaPart.kind``:
    a processed image rides an ``image`` part) and its ``label`` on the
    ``pixelwire_*_media`` metrics (its name unless given)."""

    name: str
    part: str
    label: str = ""

    @property
    def metrics_label(self) -> str:
        return self.label or self.name


class Registry(Generic[H]):
    """One layer's handlers, one per medium name, in registration order."""

    def __init__(self, layer: str) -> None:
        self.layer = layer
        self._handlers: dict[str, H] = {}
        self._lock = threading.Lock()

    def register(self, name: str, handler: H) -> H:
        """Registers ``handler`` for medium ``name``; a name is registered once."""
        with self._lock:
            if name in self._handlers:
                raise ValueError(f"{self.layer}: medium {name!r} is registered already")
            self._handlers = {**self._handlers, name: handler}
        return handler

    def unregister(self, name: str) -> None:
        """Takes medium ``name`` out (a registration that ends, as a test's)."""
        with self._lock:
            self._handlers = {key: value for key, value in self._handlers.items() if key != name}

    def get(self, name: str) -> H:
        """The handler of medium ``name`` (:class:`UnknownMedium` if none)."""
        handler = self._handlers.get(name)
        if handler is None:
            raise UnknownMedium(f"{self.layer}: no handler for medium {name!r}")
        return handler

    def __contains__(self, name: object) -> bool:
        return name in self._handlers

    def names(self) -> list[str]:
        return list(self._handlers)

    def newest_first(self) -> Iterator[tuple[str, H]]:
        """(name, handler) from the last registered to the first: the first
        registered is what is left when no later one claims an item."""
        return iter(reversed(list(self._handlers.items())))

    def find(self, claims: Callable[[H], bool]) -> tuple[str, H]:
        """The newest registration whose handler ``claims`` the item."""
        for name, handler in self.newest_first():
            if claims(handler):
                return name, handler
        raise UnknownMedium(f"{self.layer}: no registered medium takes this item")


MEDIA: Registry[Medium] = Registry("media")

IMAGE = MEDIA.register("image", Medium("image", part="image"))
VIDEO = MEDIA.register("video", Medium("video", part="video"))
PROCESSED_IMAGE = MEDIA.register("processed_image", Medium("processed_image", part="image"))
# A video whose frames vLLM's processor takes as its rows, laid out at the
# worker (pixelwire.vllm.processed_videos): its frames travel and are read
# as a video's, so it has no descriptor, frontend or reader handler of its
# own; the worker counts it when its rows go to vLLM.
PROCESSED_VIDEO = MEDIA.register("processed_video", Medium("processed_video", part="video"))
# Audio is passed on (fetched through the guard, identified as one real
# container) and decoded by vLLM.
AUDIO = MEDIA.register("audio", Medium("audio", part="audio"))


def medium(name: str) -> Medium:
    """The registered medium ``name``."""
    return MEDIA.get(name)
