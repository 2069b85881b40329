"""The connector itself; imports vLLM, so only :func:`pixelwire.vllm.register` loads it."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from typing import Any, NoReturn

from PIL import Image
from vllm.multimodal.media import AudioMediaIO, MediaConnector, MediaWithBytes
from vllm.multimodal.media.base import MediaIO
from vllm.multimodal.media.image import ImageMediaIO
from vllm.multimodal.media.video import VideoMediaIO

from pixelwire._native import (
    DecodeError,
    DescriptorError,
    ImageTooLarge,
    PixelwireError,
)
from pixelwire.caches.worker_images import worker_image_cache
from pixelwire.config import (
    BACKGROUND,
    DECODED_MODES,
)
from pixelwire.descriptor import RemoteMedia, decoded_as, parse_descriptor
from pixelwire.loader_input import checked_container, is_frame_list
from pixelwire.media import IMAGE, PROCESSED_IMAGE, VIDEO
from pixelwire.metrics import MediaMetrics
from pixelwire.outputs import as_output
from pixelwire.processed import PatchLayout
from pixelwire.reader import Reader
from pixelwire.resend import NOT_HELD
from pixelwire.resent_reference import ResentImage, resent_image
from pixelwire.signing import is_reference
from pixelwire.transfer import default_reader
from pixelwire.vllm.data_urls import decode_data_url_async
from pixelwire.vllm.errors import as_vllm_error, local_files_refused
from pixelwire.vllm.fetching import media_fetcher
from pixelwire.vllm.identity import cache_identity
from pixelwire.vllm.image_info import checked_for_vllm_loader
from pixelwire.vllm.media_settings import VllmMediaSettings
from pixelwire.vllm.native_decode import check_frame_list, decode_for_model, decode_processed
from pixelwire.vllm.processed_inputs import ProcessedImage, processed_image
from pixelwire.vllm.processed_videos import tagged_media
from pixelwire.vllm.reading import WORKER_MEDIA, ReadRequest, read_reference, read_timed
from pixelwire.vllm.sync_loop import run_sync
from pixelwire.vllm.video import (
    decode_video_bytes,
    read_video_descriptor,
    signed_video_client,
    vllm_video_settings,
    worker_video_resize_policy,
)
from pixelwire.vllm.video_memo import remembered_video, video_data_url
from pixelwire.vllm.worker_layouts import worker_patch_layout
from pixelwire.vllm.worker_settings import install_metrics, url_resize_allowed, worker_resize_policy

log = logging.getLogger("pixelwire.vllm")


def _check_resize(remote: RemoteMedia) -> str:
    """A frontend-resized image must carry this vLLM's policy and its target
    size; returns the policy's identity."""
    expected = worker_resize_policy()
    assert remote.resize is not None
    policy, (height, width) = remote.resize.policy, remote.resize.source
    if expected is None:
        raise DescriptorError(
            f"the frontend resized this image for {policy}, but this vLLM's pixelwire plug-in "
            "has no resize policy to check it against (its model unknown, or no processor pixelwire "
            "resizes for; the start-up log says which): set PIXELWIRE_MODEL (and "
            "PIXELWIRE_MM_PROCESSOR_KWARGS) to vLLM's --model (and --mm-processor-kwargs), "
            "or start the frontend without --model"
        )
    if policy != expected.identity:
        raise DescriptorError(
            f"the frontend resized this image for {policy}, but this vLLM's processor resizes for "
            f"{expected.identity}: give the frontend the same --model and --mm-processor-kwargs as vLLM"
        )
    if remote.shape[:2] != expected.target(height, width):
        raise DescriptorError(
            f"the frontend's resize of a {[height, width]} image does not match {expected.identity}"
        )
    return policy


def _decoded_image(
    descriptor: dict[str, Any], mode: str | None, background: tuple[int, int, int]
) -> RemoteMedia:
    """The image (or processed image) a descriptor names, once the mode the
    frontend decoded it into and its background are what vLLM asks for."""
    made, made_on = decoded_as(descriptor)
    if made != mode or (mode == "RGB" and made_on != background):
        raise DescriptorError(
            f"the frontend decoded this image as {made} on {list(made_on)} but vLLM asks for "
            f"{mode} on {list(background)}: give the frontend the same --media-io-kwargs as vLLM"
        )
    return parse_descriptor(descriptor)


class PixelwireMediaConnector(MediaConnector):
    """vLLM's MediaConnector with images taken over: descriptor references
    are read over NIXL (signed, unless PIXELWIRE_ALLOW_UNSIGNED=1); every
    ``http(s)``, ``data:`` and allowed ``file:`` URL is fetched by
    pixelwire's guarded Fetcher and decoded natively (off the GIL) when the
    mode asked for is one pixelwire decodes (RGB, RGBA, L); other modes and
    formats go to vLLM's own loader as the bytes already fetched. Videos
    likewise: references read over NIXL, URLs fetched by the guard and
    decoded natively when pixelwire reproduces vLLM's loader
    (:mod:`pixelwire.vllm.video`), by vLLM's loader otherwise. Audio is
    fetched by the same guard and decoded by vLLM's own loader."""

    async def load_from_url_async(
        self, url: str, media_io: MediaIO[Any], *, fetch_timeout: int | None = None
    ) -> Any:
        # vLLM's one way to every URL it fetches (video and audio; images
        # come through fetch_image_async). What is not a URL vLLM refuses
        # itself. Its video and audio loaders are FFmpeg with every demuxer:
        # their bytes, fetched or in a data: URL, are identified first, and a
        # JPEG-frame list (Pillow, at any size) has its frames checked.
        if not isinstance(url, str) or ":" not in url:
            return await super().load_from_url_async(url, media_io, fetch_timeout=fetch_timeout)
        data_url = url[:5].lower() == "data:"
        if data_url and isinstance(media_io, VideoMediaIO) and is_frame_list(url):
            await asyncio.to_thread(check_frame_list, url)
            return await super().load_from_url_async(url, media_io, fetch_timeout=fetch_timeout)
        if data_url and not isinstance(media_io, (AudioMediaIO, VideoMediaIO)):
            return await super().load_from_url_async(url, media_io, fetch_timeout=fetch_timeout)
        try:
            if data_url:
                data = await decode_data_url_async(url)
            else:
                data = await self._fetch(url, fetch_timeout, media_io.get_max_bytes())
            if isinstance(media_io, AudioMediaIO):
                checked_container(data, "audio")
            elif isinstance(media_io, VideoMediaIO):
                checked_container(data, "video")
        except PixelwireError as e:
            self._raise_as_vllms(e, url, install_metrics("pixelwire"))
        return await asyncio.to_thread(media_io.load_bytes, data)

    async def _fetch(
        self, url: str, timeout: float | None = None, medium_max_bytes: int | None = None
    ) -> bytes:
        """The bytes of an ``http(s)`` or ``file:`` URL, through pixelwire's
        guarded Fetcher under vLLM's settings."""
        if url[:5].lower() == "file:" and self.allowed_local_media_path is None:
            raise local_files_refused()
        fetcher = media_fetcher(
            self.allowed_media_domains, self.allowed_local_media_path, timeout, medium_max_bytes
        )
        return await fetcher.fetch(url)

    def _raise_as_vllms(self, error: PixelwireError, url: str, metrics: MediaMetrics) -> NoReturn:
        """Counts a fault on ``url`` and raises vLLM's own exception for it,
        so vLLM's server answers with the status it gives its own loader's
        (the error itself where that is vLLM's answer too)."""
        metrics.failed(error)
        vllms = as_vllm_error(error, url, self.allowed_local_media_path)
        if vllms is error:
            raise error
        raise vllms from error

    def load_from_url(self, url: str, media_io: MediaIO[Any], *, fetch_timeout: int | None = None) -> Any:
        return run_sync(self.load_from_url_async(url, media_io, fetch_timeout=fetch_timeout))

    async def fetch_video_async(
        self, video_url: str, *, image_mode: str | None = "RGB", video_processor: str | None = None
    ) -> Any:
        metrics = install_metrics("pixelwire")
        video_kwargs, loader = vllm_video_settings(self.media_io_kwargs, video_processor)
        if not isinstance(video_url, str) or is_frame_list(video_url):
            # Not a URL (vLLM refuses it), or JPEG frames sent as one data:
            # URL: vLLM's own loader, through load_from_url_async, which
            # checks the frames from their headers first.
            metrics.handled_video("vllm", 0)
            return await super().fetch_video_async(
                video_url, image_mode=image_mode, video_processor=video_processor
            )
        try:
            if is_reference(video_url):
                request = ReadRequest(
                    VIDEO.part,
                    metrics,
                    self,
                    image_mode=image_mode,
                    video_kwargs=video_kwargs,
                    video_loader=loader,
                )
                return await read_reference(video_url, request)
            digest: str | None = None
            client: str | None = None
            if video_url[:5].lower() == "data:":
                data, digest = await video_data_url(video_url)
                client = signed_video_client(video_url)
            else:
                timeout = VllmMediaSettings.from_env().video_timeout
                max_bytes = self._video_io(image_mode, video_kwargs, loader).get_max_bytes()
                data = await self._fetch(video_url, timeout, max_bytes)
            return await self._load_video(data, digest, image_mode, video_kwargs, loader, metrics, client)
        except PixelwireError as e:
            self._raise_as_vllms(e, video_url, metrics)

    def _video_io(self, image_mode: str | None, video_kwargs: dict[str, Any], loader: str) -> VideoMediaIO:
        """vLLM's video loader as this vLLM configures it."""
        return VideoMediaIO(
            ImageMediaIO(**({"image_mode": image_mode} | self.media_io_kwargs.get("image", {}))),
            **(video_kwargs | {"video_backend": loader}),
        )

    async def _load_video(
        self,
        data: bytes,
        digest: str | None,
        image_mode: str | None,
        video_kwargs: dict[str, Any],
        loader: str,
        metrics: MediaMetrics,
        client: str | None = None,
    ) -> MediaWithBytes:
        """A video's bytes (``digest``: their SHA-256 when known) as vLLM's
        loader returns them: from the worker's cache, decoded natively (its
        decode turns taken as ``client``'s, the frontend's signed client,
        when given), or by vLLM's loader."""
        vllm_io = self._video_io(image_mode, video_kwargs, loader)
        resize = worker_video_resize_policy() if url_resize_allowed() else None
        decode = functools.partial(
            decode_video_bytes, data, video_kwargs, loader, vllm_io, metrics, resize, client
        )
        loaded = await remembered_video(
            data, digest, video_kwargs, loader, image_mode, resize, metrics, decode
        )
        # Handed to vLLM's processor as its rows where it would make them
        # of these frames (pixelwire.vllm.processed_videos).
        return loaded if resize is None or image_mode != "RGB" else tagged_media(loaded, "url")

    async def _load_resent_video(self, resent: ResentImage, request: ReadRequest) -> MediaWithBytes:
        """A resent video's reference: the bytes remembered under its
        digest, loaded as the ``data:`` URL they came in would be; when they
        are no longer held, the answer after which the frontend sends the
        URLs in full (:data:`pixelwire.resend.NOT_HELD`)."""
        resent.check(time.time())
        data = worker_image_cache().data_urls.by_sha256(resent.sha256)
        if data is None or len(data) != resent.nbytes:
            raise ValueError(f"{NOT_HELD}this worker no longer holds the video of SHA-256 {resent.sha256}")
        return await self._load_video(
            data,
            resent.sha256,
            request.image_mode,
            request.video_kwargs,
            request.video_loader,
            request.metrics,
        )

    def fetch_video(
        self, video_url: str, *, image_mode: str | None = "RGB", video_processor: str | None = None
    ) -> Any:
        return run_sync(
            self.fetch_video_async(video_url, image_mode=image_mode, video_processor=video_processor)
        )

    def _image_settings(self, image_mode: str | None) -> tuple[str | None, tuple[int, int, int]]:
        # ImageMediaIO validates the kwargs exactly as vLLM does.
        io = ImageMediaIO(**({"image_mode": image_mode} | self.media_io_kwargs.get("image", {})))
        return io.image_mode, io.rgba_background_color

    async def fetch_image_async(self, image_url: str, *, image_mode: str | None = "RGB") -> Any:
        mode, background = self._image_settings(image_mode)
        metrics = install_metrics("pixelwire")
        if not isinstance(image_url, str):
            # Not a URL (vLLM passes only strings): vLLM's own answer.
            metrics.handled("vllm", 0)
            return await super().fetch_image_async(image_url, image_mode=image_mode)
        try:
            if is_reference(image_url):
                request = ReadRequest(IMAGE.part, metrics, self, image_mode=mode, background=background)
                return await read_reference(image_url, request)
            # Every URL is fetched by pixelwire's guarded Fetcher, whatever
            # the mode; modes pixelwire does not decode go to vLLM's loader
            # as bytes.
            return await self._load_url(image_url, mode, background, metrics)
        except PixelwireError as e:
            self._raise_as_vllms(e, image_url, metrics)

    def fetch_image(self, image_url: str, *, image_mode: str | None = "RGB") -> Any:
        return run_sync(self.fetch_image_async(image_url, image_mode=image_mode))

    async def _read_image(
        self,
        descriptor: dict[str, Any],
        mode: str | None,
        background: tuple[int, int, int],
        metrics: MediaMetrics,
    ) -> Image.Image | MediaWithBytes:
        resent = resent_image(descriptor)
        if resent is not None:
            return await self._load_resent(resent, mode, background, metrics)
        remote = _decoded_image(descriptor, mode, background)
        policy = _check_resize(remote) if remote.resize is not None else ""
        reader: Reader = default_reader()
        # vLLM's hasher keys a MediaWithBytes image on its bytes (it neither
        # re-normalises it nor hashes its pixels): here the signed identity,
        # which no client can choose (the frontend takes out their uuids)
        # nor compute. Without a source digest, the pixels' content hash,
        # covered by the signature too, stands in; with neither, vLLM hashes
        # the pixels themselves.
        if remote.source_sha256:
            identity: bytes | None = cache_identity(remote.source_sha256, mode, background, policy)
        elif remote.content_hash:
            identity = cache_identity(f"content:{remote.content_hash}", mode, background, policy)
        else:
            identity = None
        # A repeat (same signed identity, same signed pixels' hash and shape)
        # is checked as a read would be, then served without a READ: the
        # frontend ends its hand-out when the request ends.
        cache = worker_image_cache()
        key = ("nixl", identity, remote.content_hash, remote.shape, remote.layout)
        kept = None
        if cache.enabled and identity is not None and remote.content_hash:
            remote.check(reader.settings.max_pixels, time.time())
            kept = cache.get(key)
        if kept is not None:
            image: Image.Image = kept[0]
        else:
            image = await read_timed(remote, "pil", metrics)
            if cache.enabled and identity is not None and remote.content_hash:
                cache.put(key, image, remote.size)
        metrics.handled_image("nixl", remote.shape, remote.source_size)
        return image if identity is None else MediaWithBytes(image, identity)

    async def _read_processed(self, remote: RemoteMedia, metrics: MediaMetrics) -> ProcessedImage:
        """A processed image's patch rows, read over NIXL (or served from the
        worker's cache) and carried to vLLM's processor
        (:mod:`pixelwire.vllm.processed_inputs`), which hands them on only
        when its own processor would have made them."""

        processed, resize = remote.processed, remote.resize
        assert processed is not None
        layout = worker_patch_layout(worker_resize_policy())
        if layout is None or processed.processor != layout.identity:
            raise DescriptorError(
                f"the frontend processed this image for {processed.processor}, but this vLLM takes "
                f"{'no processed inputs' if layout is None else layout.identity} (the start-up log says "
                "why): give the frontend vLLM's --model and --mm-processor-kwargs, or start it with "
                "--no-processed-inputs"
            )
        if processed.dtype != layout.dtype:
            raise DescriptorError(
                f"the processed image's rows are {processed.dtype}, its processor's {layout.dtype}"
            )
        if resize is None or processed.grid_thw != tuple(layout.grid_thw(*layout.target(*resize.source))):
            raise DescriptorError("the processed image's grid is not its processor's for its source size")
        identity = cache_identity(
            remote.source_sha256 or f"content:{remote.content_hash}", "RGB", BACKGROUND, processed.processor
        )
        reader: Reader = default_reader()
        cache = worker_image_cache()
        key = ("processed", identity, remote.content_hash, remote.shape)
        kept = None
        if cache.enabled and remote.content_hash:
            remote.check(reader.settings.max_pixels, time.time())
            kept = cache.get(key)
        if kept is not None:
            rows = kept[0]
        else:
            read = await read_timed(remote, "numpy", metrics)
            # Still in the reader's receive pool: the seam copies the rows out
            # as it hands them to vLLM (processed_inputs).
            rows = read.reshape(remote.shape[0], -1).view(layout.dtype)
            if cache.enabled and remote.content_hash:
                cache.put(key, rows, remote.size)
        metrics.handled(
            "nixl", remote.size, resize.source[0] * resize.source[1] * 3, medium=PROCESSED_IMAGE.metrics_label
        )
        grid, copies = list(processed.grid_thw), processed.patch[1]
        lent = kept is None
        return processed_image(identity, rows, grid, processed.processor, copies=copies, lent=lent)

    async def _load_url(
        self, url: str, mode: str | None, background: tuple[int, int, int], metrics: MediaMetrics
    ) -> Image.Image | MediaWithBytes:
        cache = worker_image_cache()
        digest: str | None = None
        if url[:5].lower() == "data:":
            # A resent one: the bytes (and digest) of the first time.
            known = cache.data_urls.lookup(url, None)
            if known is not None:
                data, digest = known, cache.data_urls.sha256(known)
            else:
                # vLLM's grammar and decoder (and vLLM's exceptions), not the
                # Fetcher's more lenient ones.
                data = await decode_data_url_async(url)
                cache.data_urls.remember(url, None, data)
        else:
            data = await self._fetch(url)
        return await self._load_bytes(data, digest, mode, background, metrics)

    async def _load_resent(
        self, resent: ResentImage, mode: str | None, background: tuple[int, int, int], metrics: MediaMetrics
    ) -> Image.Image | MediaWithBytes:
        """A resent image's reference: the bytes remembered under its digest,
        loaded as the ``data:`` URL they came in would be; when they are no
        longer held, the answer after which the frontend sends the URLs in
        full (:data:`pixelwire.resend.NOT_HELD`)."""
        resent.check(time.time())
        data = worker_image_cache().data_urls.by_sha256(resent.sha256)
        if data is None or len(data) != resent.nbytes:
            raise ValueError(f"{NOT_HELD}this worker no longer holds the image of SHA-256 {resent.sha256}")
        return await self._load_bytes(data, resent.sha256, mode, background, metrics)

    async def _load_bytes(
        self,
        data: bytes,
        digest: str | None,
        mode: str | None,
        background: tuple[int, int, int],
        metrics: MediaMetrics,
    ) -> Image.Image | MediaWithBytes:
        """An image's encoded bytes (``digest``: their SHA-256 when known),
        decoded here or by vLLM's loader."""
        cache = worker_image_cache()
        if cache.enabled and digest is None:
            # Noted for the memo too: a resent image's reference finds the bytes by it.
            digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
            cache.data_urls.note_sha256(data, digest)
        if mode not in DECODED_MODES:
            # A mode pixelwire does not decode (P, None = the file's own, ...).
            return await self._vllm_load(data, mode, metrics)
        policy = worker_resize_policy() if mode == "RGB" and url_resize_allowed() else None
        layout = worker_patch_layout(policy) if policy is not None else None
        if layout is not None:
            processed = await self._load_processed(data, digest, background, layout, metrics)
            if processed is not None:
                return processed
        # The same bytes decoded the same way: served from the worker's cache.
        key = None
        if cache.enabled:
            key = ("url", digest, len(data), mode, background, None if policy is None else policy.identity)
            kept = cache.get(key)
            if kept is not None:
                metrics.handled("url", 0)
                return MediaWithBytes(kept[0], data, kept[1])
        try:
            with metrics.timed("url"):
                pixels, source_bytes, info, io_config = await asyncio.to_thread(
                    decode_for_model, data, mode, background, policy
                )
        except ImageTooLarge:
            raise  # a limit: never handed to a loader without pixelwire's limits
        except DecodeError:
            # A format (or variant) pixelwire does not decode, or data its
            # decoder refuses where Pillow's may be more lenient: vLLM's
            # loader gives vLLM's answer, whichever it is.
            return await self._vllm_load(data, mode, metrics)
        metrics.handled("url", int(pixels.nbytes), source_bytes)
        image = as_output(pixels, "pil", "cpu")
        image.info.update(info)
        # With the encoded bytes, vLLM's processor cache hashes them as it
        # does for its own loader.
        if key is not None:
            cache.put(key, image, int(pixels.nbytes), io_config)
        return MediaWithBytes(image, data, io_config)

    async def _load_processed(
        self,
        data: bytes,
        digest: str | None,
        background: tuple[int, int, int],
        layout: PatchLayout,
        metrics: MediaMetrics,
    ) -> ProcessedImage | None:
        """An image's encoded bytes made into its processor's patch rows
        here, natively (worker mode's processed inputs), or taken from the
        worker's cache; None for a format pixelwire does not decode (vLLM's
        loader and processor then make it)."""

        if digest is None:
            digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        identity = cache_identity(digest, "RGB", background, layout.identity)
        cache = worker_image_cache()
        key = ("processed-url", identity, len(data))
        kept = cache.get(key) if cache.enabled else None
        if kept is not None:
            rows, grid = kept
            metrics.handled("url", 0)
        else:
            try:
                with metrics.timed("url"):
                    rows, grid, source_bytes = await asyncio.to_thread(
                        decode_processed, data, background, layout
                    )
            except ImageTooLarge:
                raise
            except DecodeError:
                return None
            metrics.handled("url", int(rows.nbytes), source_bytes, medium=PROCESSED_IMAGE.metrics_label)
            if cache.enabled:
                cache.put(key, rows, int(rows.nbytes), grid)
        return processed_image(identity, rows, grid, layout.identity)

    async def _vllm_load(self, data: bytes, mode: str | None, metrics: MediaMetrics) -> MediaWithBytes:
        """vLLM's own loader on bytes pixelwire's Fetcher already fetched
        (never on the URL: vLLM's fetch has no address guard), so the result
        is exactly vLLM's; only once they are one image format (Pillow tries
        every plug-in it has)."""
        await asyncio.to_thread(checked_for_vllm_loader, data)
        metrics.handled("vllm", 0)
        io = ImageMediaIO(**({"image_mode": mode} | self.media_io_kwargs.get("image", {})))
        return await asyncio.to_thread(io.load_bytes, data)


class ImageReads:
    """An image's reference (or a resent image's) at the worker."""

    async def read(self, descriptor: dict[str, Any], request: ReadRequest) -> Image.Image | MediaWithBytes:
        connector: PixelwireMediaConnector = request.connector
        return await connector._read_image(
            descriptor, request.image_mode, request.background, request.metrics
        )


class ProcessedImageReads:
    """A processed image's reference at the worker: its patch rows for vLLM's processor."""

    async def read(self, descriptor: dict[str, Any], request: ReadRequest) -> ProcessedImage:
        connector: PixelwireMediaConnector = request.connector
        remote = _decoded_image(descriptor, request.image_mode, request.background)
        return await connector._read_processed(remote, request.metrics)


class VideoReads:
    """A video's reference (or a resent video's) at the worker: its frames
    and vLLM's metadata for them."""

    async def read(self, descriptor: dict[str, Any], request: ReadRequest) -> MediaWithBytes:
        resent = resent_image(descriptor)
        if resent is not None:
            connector: PixelwireMediaConnector = request.connector
            return await connector._load_resent_video(resent, request)
        video = await read_video_descriptor(
            descriptor, request.video_kwargs, request.video_loader, request.metrics
        )
        # Handed to vLLM's processor as its rows where it would make them
        # of these frames (pixelwire.vllm.processed_videos).
        return tagged_media(video, "nixl")


WORKER_MEDIA.register(IMAGE.name, ImageReads())
WORKER_MEDIA.register(PROCESSED_IMAGE.name, ProcessedImageReads())
WORKER_MEDIA.register(VIDEO.name, VideoReads())
