"""vLLM's own media settings, as the plug-in applies them to its fetches:
:class:`VllmMediaSettings`, read from vLLM's variables (their defaults are
:mod:`pixelwire.config`'s ``VLLM_*``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from pixelwire.config import (
    UNLIMITED_BYTES,
    VLLM_AUDIO_FETCH_TIMEOUT,
    VLLM_IMAGE_FETCH_TIMEOUT,
    VLLM_MAX_IMAGE_PIXELS,
    VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB,
    VLLM_MEDIA_FETCH_MAX_RETRIES,
    VLLM_VIDEO_FETCH_TIMEOUT,
    MiB,
    env_int,
)


@dataclass(frozen=True)
class VllmMediaSettings:
    """vLLM's own media settings, as the plug-in applies them to its fetches
    (vLLM 0.32's variables, read as vLLM reads them): ``attempts`` from
    ``VLLM_MEDIA_FETCH_MAX_RETRIES`` (tries in all, at least one; vLLM's
    back-off between them), ``max_bytes`` from
    ``VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB`` (None: no limit, for 0 or less),
    the fetch timeouts of each medium (``VLLM_IMAGE_FETCH_TIMEOUT``,
    ``VLLM_VIDEO_FETCH_TIMEOUT``, ``VLLM_AUDIO_FETCH_TIMEOUT``), whether
    redirects are followed (``VLLM_MEDIA_URL_ALLOW_REDIRECTS``), the decoded
    pixel limit (``VLLM_MAX_IMAGE_PIXELS``, 0: none) and ``VLLM_MEDIA_CACHE``
    (which the plug-in does not use: docs/architecture.md, "Differences from vLLM")."""

    attempts: int = VLLM_MEDIA_FETCH_MAX_RETRIES
    max_bytes: int | None = VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB * MiB
    image_timeout: float = VLLM_IMAGE_FETCH_TIMEOUT
    video_timeout: float = VLLM_VIDEO_FETCH_TIMEOUT
    audio_timeout: float = VLLM_AUDIO_FETCH_TIMEOUT
    allow_redirects: bool = True
    max_image_pixels: int = VLLM_MAX_IMAGE_PIXELS
    media_cache: str = ""

    @classmethod
    def from_env(cls) -> VllmMediaSettings:
        size_mb = env_int("VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB", VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB)
        return cls(
            attempts=max(1, env_int("VLLM_MEDIA_FETCH_MAX_RETRIES", VLLM_MEDIA_FETCH_MAX_RETRIES)),
            max_bytes=size_mb * MiB if size_mb > 0 else None,
            image_timeout=env_int("VLLM_IMAGE_FETCH_TIMEOUT", VLLM_IMAGE_FETCH_TIMEOUT),
            video_timeout=env_int("VLLM_VIDEO_FETCH_TIMEOUT", VLLM_VIDEO_FETCH_TIMEOUT),
            audio_timeout=env_int("VLLM_AUDIO_FETCH_TIMEOUT", VLLM_AUDIO_FETCH_TIMEOUT),
            allow_redirects=env_int("VLLM_MEDIA_URL_ALLOW_REDIRECTS", 1) != 0,
            max_image_pixels=env_int("VLLM_MAX_IMAGE_PIXELS", VLLM_MAX_IMAGE_PIXELS),
            media_cache=os.environ.get("VLLM_MEDIA_CACHE", ""),
        )

    def body_limit(self, medium_max_bytes: int | None) -> int:
        """The byte cap of one fetch, as vLLM's: the smaller of the download
        limit and the medium's own (``MediaIO.get_max_bytes()``), no limit
        when neither has one."""
        limits = [limit for limit in (self.max_bytes, medium_max_bytes) if limit is not None]
        return min(limits) if limits else UNLIMITED_BYTES
