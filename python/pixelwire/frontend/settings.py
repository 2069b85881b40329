"""``pixelwire frontend``'s settings: :class:`FrontendConfig`, every
setting with its default (the defaults and variables themselves are
:mod:`pixelwire.config`'s), the publisher's and the video limits among them
as the objects they are handed to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pixelwire._native import SLOT_HEADER_BYTES, VideoLimits
from pixelwire.config import (
    ACCESS_LOG,
    CACHE_BYTES,
    CONNECT_TIMEOUT,
    DRAIN_SECONDS,
    FRONTEND_MAX_VIDEO_BYTES,
    FRONTEND_MAX_VIDEO_DECODE_PIXELS,
    FRONTEND_MAX_VIDEO_FRAME_BYTES,
    FRONTEND_MAX_VIDEO_FRAMES,
    FRONTEND_MAX_VIDEO_PIXELS,
    FRONTEND_MAX_VIDEO_SECONDS,
    HEADER_TIMEOUT,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    MAX_FETCHES_PER_REQUEST,
    MAX_IMAGE_BYTES_PER_REQUEST,
    MAX_JSON_VALUES,
    MAX_MEDIA_PER_REQUEST,
    MAX_PIXELS_PER_REQUEST,
    MAX_REQUEST_BYTES,
    MIN_BODY_RATE,
    POOL_BYTES,
    UPSTREAM_TIMEOUT,
    DecodeAt,
    PublisherSettings,
    access_log_from_env,
    allow_private_from_env,
    api_keys_from_env,
    secret_from_env,
    video_pool_bytes,
)

if TYPE_CHECKING:
    from pixelwire.processed import PatchLayout
    from pixelwire.resize import ResizePolicy


def _default_publisher() -> PublisherSettings:
    """A frontend's publisher unless given one: it decodes, its cache on."""
    return PublisherSettings(decode_at="frontend", cache_bytes=CACHE_BYTES)


def frontend_video_limits(pool_bytes: int, **given: int | None) -> VideoLimits:
    """What one video may cost at the frontend: the ``given`` bounds
    (:class:`VideoLimits`' names; None: not given), else the
    ``FRONTEND_MAX_VIDEO_*`` defaults, and its frames within the videos'
    share of a ``pool_bytes`` pool, where they ship as one slot."""
    defaults = {
        "max_bytes": FRONTEND_MAX_VIDEO_BYTES,
        "max_frames": FRONTEND_MAX_VIDEO_FRAMES,
        "max_pixels": FRONTEND_MAX_VIDEO_PIXELS,
        "max_frame_bytes": FRONTEND_MAX_VIDEO_FRAME_BYTES,
        "max_seconds": FRONTEND_MAX_VIDEO_SECONDS,
        "max_decode_pixels": FRONTEND_MAX_VIDEO_DECODE_PIXELS,
    }
    bounds = {**defaults, **{name: value for name, value in given.items() if value is not None}}
    bounds["max_frame_bytes"] = min(
        bounds["max_frame_bytes"], video_pool_bytes(pool_bytes) - SLOT_HEADER_BYTES
    )
    return VideoLimits(**bounds)


@dataclass
class FrontendConfig:
    """``pixelwire frontend``: every setting, with its default."""

    upstream: str
    # The publisher's settings, handed to it whole: where images are decoded,
    # its pool, lease and threads, and the pool bytes of published images
    # kept for repeats (cache_bytes, 0: off; in worker mode, where nothing is
    # published, its DATA_URL_MEMO_SHARE sizes the record of data: URLs the
    # worker was sent, pixelwire.resent_reference).
    publisher: PublisherSettings = field(default_factory=_default_publisher)
    secret: bytes | None = None
    # Server-wide defaults for images, as vLLM's --media-io-kwargs '{"image": {...}}'.
    image_kwargs: dict[str, Any] = field(default_factory=dict)
    upstream_timeout: float = UPSTREAM_TIMEOUT
    connect_timeout: float = CONNECT_TIMEOUT
    drain_seconds: float = DRAIN_SECONDS
    allowed_domains: list[str] | None = None
    allow_private: bool = False
    check_upstream: bool = True
    # The vLLM /metrics pages the handshake reads (--upstream-metrics), where
    # the upstream is a router or load balancer that does not pass vLLM's
    # own on; empty: the upstream's /metrics.
    upstream_metrics: list[str] = field(default_factory=list)
    # Request body cap (413 above it).
    max_request_bytes: int = MAX_REQUEST_BYTES
    # Media parts in one request (400 above it), counted before any fetch or decode.
    max_media_per_request: int = MAX_MEDIA_PER_REQUEST
    # Total encoded image bytes in one request (400 above it): data: URLs
    # are counted before any work, fetched bodies as they arrive.
    max_image_bytes_per_request: int = MAX_IMAGE_BYTES_PER_REQUEST
    # Decoded pixels in one request (400 above it), from the images' headers
    # before any decode, whatever the resize.
    max_pixels_per_request: int = MAX_PIXELS_PER_REQUEST
    # The model's resize (pixelwire frontend --model): images ship at the
    # size its processor would resize them to.
    resize: ResizePolicy | None = None
    # The model's patch layout (--model, unless --no-processed-inputs): RGB
    # images ship as its processor's output, which vLLM's API server hands
    # its engine as it is (pixelwire.processed); None: as resized pixels.
    processed: PatchLayout | None = None
    max_fetches_per_request: int = MAX_FETCHES_PER_REQUEST
    # Bearer tokens a client must send (Authorization) before the frontend
    # does any work for it; empty: every client is served.
    api_keys: list[str] = field(default_factory=list)
    # Server-wide video defaults, as vLLM's --media-io-kwargs '{"video": {...}}'.
    video_kwargs: dict[str, Any] = field(default_factory=dict)
    # As vLLM's --trust-request-mm-kwargs: a request's own media_io_kwargs
    # and mm_processor_kwargs are honoured; without it such a request is
    # refused before any fetch or decode, as vLLM refuses it.
    trust_request_mm_kwargs: bool = False
    # The loader vLLM samples the model's videos with (from --model's video
    # processor); None: the frontend cannot tell, and passes videos on
    # unless video_kwargs names one (video_backend).
    video_loader: str | None = None
    # The model's per-frame resize (from --model's video processor): video
    # frames ship at the size its processor would resize them to.
    video_resize: ResizePolicy | None = None
    # What one video may cost (--max-video-*), its frames within the
    # videos' share of the pool (frontend_video_limits).
    video_limits: VideoLimits = field(default_factory=lambda: frontend_video_limits(POOL_BYTES))
    # JSON values in one body (400 above it), counted as 1 + the `{`, `[`
    # and `,` bytes anywhere in the body: an upper bound (characters inside
    # strings count too; base64 has none, and ordinary prose needs ~30 MB
    # to reach the default).
    max_json_values: int = MAX_JSON_VALUES
    # A line a request on the "pixelwire.frontend.access" logger.
    access_log: bool = ACCESS_LOG
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    header_timeout: float = HEADER_TIMEOUT
    min_body_rate: int = MIN_BODY_RATE
    # UCX_NET_DEVICES for the NIXL agent (None: every device); the CLI
    # derives it from --nixl-interface and the upstream
    # (pixelwire.frontend.nixl_interfaces).
    nixl_devices: str | None = None

    @property
    def max_images_per_request(self) -> int:
        """:attr:`max_media_per_request`, by the name it had when it was taken for images only."""
        return self.max_media_per_request

    @property
    def decode_at(self) -> DecodeAt:
        """Where images are decoded: the publisher's setting."""
        return self.publisher.decode_at

    @classmethod
    def from_env(
        cls,
        upstream: str,
        *,
        publisher: PublisherSettings | None = None,
        video_limits: VideoLimits | None = None,
        **settings: Any,
    ) -> FrontendConfig:
        """``settings`` as given (None means "not given"); the publisher's
        :meth:`PublisherSettings.for_frontend` and the video limits for its
        pool unless given; the rest from ``PIXELWIRE_ALLOW_PRIVATE``,
        ``PIXELWIRE_SECRET``, ``VLLM_API_KEY`` and ``PIXELWIRE_ACCESS_LOG``,
        else the defaults."""
        given = {name: value for name, value in settings.items() if value is not None}
        publisher = publisher if publisher is not None else PublisherSettings.for_frontend()
        if video_limits is None:
            video_limits = frontend_video_limits(publisher.pool_bytes)
        given["allow_private"] = bool(given.get("allow_private")) or allow_private_from_env()
        given.setdefault("secret", secret_from_env())
        given["api_keys"] = list(given.get("api_keys") or api_keys_from_env())
        given["access_log"] = bool(given.get("access_log")) or access_log_from_env()
        return cls(upstream=upstream, publisher=publisher, video_limits=video_limits, **given)
