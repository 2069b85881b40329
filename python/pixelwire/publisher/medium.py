"""One medium's decode-and-publish as the publisher runs it
(:class:`MediumPublish`): :meth:`pixelwire.publisher.Publisher.publish`
runs any medium's on that medium's threads, off the event loop, cancelled
and freed as :func:`pixelwire.publisher.off_loop.off_loop` does, and
returns what it published as descriptors. Images
(:class:`pixelwire.publisher.images.ImageBatch`) and videos
(:class:`pixelwire.publisher.video.VideoPublish`) are two of them."""

from __future__ import annotations

import concurrent.futures
from typing import Protocol, TypeVar

from pixelwire import _native

R = TypeVar("R")
D = TypeVar("D", covariant=True)


class MediumPublish(Protocol[R, D]):
    """A publish of one medium: ``R`` what its native call returns, ``D``
    the descriptors it makes of it."""

    def executor(self) -> concurrent.futures.Executor:
        """The threads its native call waits on."""
        ...

    def run(self, native: _native.NativePublisher, control: _native.BatchControl) -> R:
        """Decodes and publishes into ``native``'s pool (GIL released),
        stopping with ``Cancelled`` once ``control`` is cancelled."""
        ...

    def release(self, native: _native.NativePublisher, result: R) -> None:
        """Frees what an abandoned :meth:`run` published."""
        ...

    def described(self, agent: str, result: R, published_at: float) -> D:
        """What :meth:`run` published, as the descriptors of ``agent``'s slots."""
        ...
