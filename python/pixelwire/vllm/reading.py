"""How the plug-in reads a signed descriptor reference, whatever its
medium: the signature checked before anything reaches NIXL, the medium
found from the descriptor (:data:`pixelwire.descriptor.DESCRIPTOR_MEDIA`),
refused when the part that carried it belongs to another medium, and read
by that medium's handler in :data:`WORKER_MEDIA` (see
:mod:`pixelwire.media`). The READ with its latency metric is one step,
:func:`read_timed`, that every handler takes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pixelwire._native import DescriptorError
from pixelwire.config import BACKGROUND
from pixelwire.descriptor import RemoteMedia, descriptor_medium
from pixelwire.media import MEDIA, Registry
from pixelwire.metrics import MediaMetrics
from pixelwire.resent_reference import resent_image
from pixelwire.signing import decode_reference, reference_secret
from pixelwire.transfer import default_reader


@dataclass(frozen=True)
class ReadRequest:
    """What vLLM asked for with a reference: the ``part`` kind it came in
    (``fetch_image`` or ``fetch_video``), the metrics to count it on, the
    loader settings this vLLM would use for it, and the connector (for a
    medium whose read loads bytes through it)."""

    part: str
    metrics: MediaMetrics
    connector: Any = None
    image_mode: str | None = "RGB"
    background: tuple[int, int, int] = BACKGROUND
    video_kwargs: dict[str, Any] = field(default_factory=dict)
    video_loader: str = ""


class WorkerMedium(Protocol):
    """One medium's reader in the plug-in (registered in :data:`WORKER_MEDIA`)."""

    async def read(self, descriptor: dict[str, Any], request: ReadRequest) -> Any:
        """What vLLM's loader would have returned for the medium the
        verified ``descriptor`` names, once its settings are checked
        against this vLLM's (``DescriptorError`` otherwise)."""
        ...


# Each medium's reader: image, processed image and video are registered by
# pixelwire.vllm.connector.
WORKER_MEDIA: Registry[WorkerMedium] = Registry("worker")


def _a(kind: str) -> str:
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"


async def read_reference(reference: str, request: ReadRequest) -> Any:
    """The medium a signed reference names, read by its handler. Without
    PIXELWIRE_SECRET every reference is refused unless
    PIXELWIRE_ALLOW_UNSIGNED=1 (``reference_secret`` raises)."""
    descriptor = decode_reference(reference, reference_secret())
    # A resent reference names bytes, not a medium: the part it came in
    # says which medium's handler loads them (an image's or a video's).
    name = request.part if resent_image(descriptor) is not None else descriptor_medium(descriptor)
    part = MEDIA.get(name).part
    if part != request.part:
        raise DescriptorError(f"this reference names {_a(part)}, sent as {_a(request.part)} part")
    return await WORKER_MEDIA.get(name).read(descriptor, request)


async def read_timed(remote: RemoteMedia, output: Literal["pil", "numpy"], metrics: MediaMetrics) -> Any:
    """The remote bytes read over NIXL (by the process's reader) as
    ``output``, timed on ``nixl``, and the publish→read latency observed."""
    with metrics.timed("nixl"):
        result = await default_reader().read_remote(remote, output=output)
    latency = metrics.publish_to_read_seconds
    if latency is not None and remote.published_at is not None:
        latency.observe(max(0.0, time.time() - remote.published_at))
    return result
