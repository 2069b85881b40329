"""The frontend's video parts (:class:`VideoParts`, registered in
:data:`pixelwire.frontend.media.FRONTEND_MEDIA`): a JPEG-frame list checked
and passed on, a video sampled, decoded and published here, or its bytes
for the worker's vLLM loader when pixelwire does not reproduce its
sampling, codec or container; in worker mode, its URL (a resent ``data:``
URL as a resent reference, :mod:`pixelwire.resent_reference`)."""

from __future__ import annotations

import asyncio
import base64
from typing import TYPE_CHECKING

from pixelwire._native import Limits, UnsupportedVideo
from pixelwire.descriptor import DecodedVideo
from pixelwire.frontend.media import bytes_url
from pixelwire.loader_input import (
    FRAME_LIST_TYPE,
    check_frames,
    checked_container,
    frame_list_frames,
    is_frame_list,
)
from pixelwire.media_parts import data_url_bytes
from pixelwire.signing import encode_reference
from pixelwire.video_client import tagged_url

if TYPE_CHECKING:
    from pixelwire.frontend.pipeline import MediaPipeline
    from pixelwire.media_parts import MediaPart

# A frame list this long (characters) is checked off the event loop.
_THREAD_CHARS = 1 << 20


def _frame_list_url(frames: list[bytes]) -> str:
    """Frames as vLLM's JPEG-frame form, each exactly the bytes checked."""
    return f"data:{FRAME_LIST_TYPE};base64," + ",".join(base64.b64encode(f).decode("ascii") for f in frames)


class VideoParts:
    """A ``video_url`` part at the frontend."""

    async def decoded_here(self, pipeline: MediaPipeline, part: MediaPart) -> str:
        if is_frame_list(part.url):
            return await self._frame_list(pipeline, part)
        if pipeline.video is None:
            # Sampled in a way pixelwire does not reproduce: vLLM decodes it,
            # from bytes fetched here through this guard and identified as
            # one real container.
            return bytes_url(checked_container(await pipeline.fetch(part), "video"))
        # A resent data: URL's bytes (and digest) from the memo, as for images.
        return await self._publish(pipeline, await pipeline.fetch_remembered(part))

    def passed_on(self, pipeline: MediaPipeline, part: MediaPart) -> str:
        """The URL as it goes on. A JPEG-frame list as it came (the worker
        checks its frames). A video's ``data:`` URL resent (every later turn
        of a chat about it) as a reference to the bytes the worker holds, as
        an image's; sent in full, with the client's signed tag in its header
        (:mod:`pixelwire.video_client`), so that the plug-in's decode turns
        count its decoding as this client's whatever bytes it sends."""
        if is_frame_list(part.url):
            return part.url
        url = pipeline.passed_url(part.url)
        secret = pipeline.config.secret
        if url != part.url or secret is None or part.url[:5].lower() != "data:":
            return url
        return tagged_url(part.url, pipeline.client, secret)

    async def _frame_list(self, pipeline: MediaPipeline, part: MediaPart) -> str:
        """A JPEG-frame list, which vLLM's loader decodes with Pillow: its
        frames counted against the request's bytes, checked from their
        headers against the image and video limits, and passed on as
        exactly the frames checked (a large list off the event loop)."""
        pipeline.count_bytes(part, data_url_bytes(part.url))
        limits, video = pipeline.publisher.settings.limits or Limits(), pipeline.config.video_limits

        def checked() -> str:
            frames = frame_list_frames(part.url)
            check_frames(frames, limits, video)
            return _frame_list_url(frames)

        url = checked() if len(part.url) < _THREAD_CHARS else await asyncio.to_thread(checked)
        pipeline.metrics.handled_video("passthrough", 0)
        return url

    async def _publish(self, pipeline: MediaPipeline, data: bytes) -> str:
        """The reference of a video sampled and published here (checked
        against the frontend's video limits before any frame memory
        exists); its bytes, for the worker's vLLM loader, when pixelwire
        does not decode its codec or container."""
        assert pipeline.video is not None
        try:
            decoded = await pipeline.publisher.decode_and_publish_video(
                data,
                sampling=pipeline.video,
                limits=pipeline.config.video_limits,
                resize=pipeline.video_resize,
                client=pipeline.client,
                cache_salt=pipeline.cache_salt,
            )
        except UnsupportedVideo:
            pipeline.metrics.handled_video("passthrough", 0)
            return bytes_url(checked_container(data, "video"))
        assert isinstance(decoded, DecodedVideo)
        pipeline.published.append(decoded)
        pipeline.metrics.handled_video("nixl", decoded.size)
        return encode_reference(decoded.to_dict(), pipeline.config.secret)
