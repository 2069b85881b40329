"""What the frontend does with each medium's parts: one handler per part
kind, in :data:`FRONTEND_MEDIA`, that the request's
:class:`pixelwire.frontend.pipeline.MediaPipeline` dispatches to (see
:mod:`pixelwire.media`)."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pixelwire.media import Registry

if TYPE_CHECKING:
    from pixelwire.frontend.pipeline import MediaPipeline
    from pixelwire.media_parts import MediaPart


@dataclass(frozen=True)
class Fetched:
    """An image part's encoded bytes, fetched to be decoded here in the
    request's image batch, and when its fetch started."""

    data: bytes
    started: float


class FrontendMedium(Protocol):
    """One part kind's handler at the frontend."""

    async def decoded_here(self, pipeline: MediaPipeline, part: MediaPart) -> str | Fetched:
        """At a frontend that decodes: the part's new URL (a signed
        reference, or its bytes for the worker to decode), or its bytes to
        decode in the request's image batch; fetched within the request's
        limits (``pipeline.fetch``). Raises the part's error."""
        ...

    def passed_on(self, pipeline: MediaPipeline, part: MediaPart) -> str:
        """In worker mode, once the URL passed this frontend's guard: the
        URL the worker gets."""
        ...


# Each part kind's handler (MediaPart.kind): image, video and audio are
# registered by pixelwire.frontend.pipeline.
FRONTEND_MEDIA: Registry[FrontendMedium] = Registry("frontend")


def bytes_url(data: bytes) -> str:
    """Encoded bytes as a ``data:`` URL (vLLM's loader sniffs the format):
    what vLLM decodes of it is exactly ``data``, however the client spelt
    its own URL."""
    return "data:application/octet-stream;base64," + base64.b64encode(data).decode("ascii")
