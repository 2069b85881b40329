"""`pixelwire frontend`: its options (:func:`add_arguments`), and how
they become the frontend's settings, each object built once (the
publisher's, the video limits, :class:`~pixelwire.frontend.settings.FrontendConfig`),
before it serves (:func:`run`). The frontend itself is imported only to run."""

from __future__ import annotations

import argparse
import logging

from pixelwire import config
from pixelwire._native import PixelwireError
from pixelwire.cli_arguments import CommandError, json_object_argument, size_argument


def add_arguments(front: argparse.ArgumentParser) -> None:
    """The frontend's options, their defaults and help from :mod:`pixelwire.config`."""
    front.add_argument(
        "--upstream",
        required=True,
        help="the vLLM server's address, e.g. http://127.0.0.1:8000, without /v1 (required)",
    )
    front.add_argument(
        "--upstream-metrics",
        action="append",
        default=None,
        metavar="URL",
        help="a vLLM server's /metrics page, e.g. http://10.0.0.5:8000/metrics, where the handshake reads "
        "the plug-in's settings, for an --upstream that is a router or load balancer that does not pass "
        "vLLM's /metrics on (repeatable: each server behind it; default: the upstream's /metrics)",
    )
    front.add_argument(
        "--host",
        default="0.0.0.0",
        help="address to listen on (default 0.0.0.0: every interface; without --api-key the frontend "
        "warns at start-up that anyone who reaches it is served)",
    )
    front.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    front.add_argument(
        "--api-key",
        action="append",
        default=None,
        help="a Bearer token clients must send (Authorization) before any fetch, decode or publish, "
        "as vLLM's --api-key (repeatable; default: VLLM_API_KEY, else none); forwarded to vLLM",
    )
    front.add_argument(
        "--decode-at",
        choices=["frontend", "worker"],
        default=None,
        help="where images are decoded (default: PIXELWIRE_DECODE_AT, else frontend)",
    )
    front.add_argument(
        "--pool-bytes",
        type=size_argument,
        default=None,
        help="registered pixel pool, in bytes or with a unit (512MiB, 1GiB, 2G) (default: "
        f"PIXELWIRE_POOL_BYTES, else {config.POOL_BYTES >> 20}MiB)",
    )
    front.add_argument(
        "--cache-bytes",
        type=size_argument,
        default=None,
        help="pool bytes of published images kept to serve a repeated image without decoding it again, "
        "within --pool-bytes (evicted first when the pool is full); 0 turns it off (default: "
        f"PIXELWIRE_CACHE_BYTES, else {config.CACHE_BYTES >> 20}MiB, at most half --pool-bytes)",
    )
    front.add_argument(
        "--region-bytes",
        type=size_argument,
        default=None,
        help="the pool grows by registered regions of this size (default: PIXELWIRE_REGION_BYTES, else "
        f"{config.REGION_BYTES >> 20}MiB; larger images: their own)",
    )
    front.add_argument(
        "--lease-seconds",
        type=float,
        default=None,
        help=f"how long an image waits for its reader (default: PIXELWIRE_LEASE_SECONDS, else "
        f"{config.LEASE_SECONDS:g} s)",
    )
    front.add_argument(
        "--media-io-kwargs",
        type=json_object_argument,
        default={},
        help="the same JSON as vLLM's --media-io-kwargs; its 'image' and 'video' parts are used (a "
        "video is sampled here only when the loader is known: 'video_backend' here, or --model) "
        "(default: none)",
    )
    front.add_argument(
        "--allowed-domains",
        nargs="+",
        default=None,
        help="hosts images may come from ('*.example.com' for subdomains) (default: any public host)",
    )
    front.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="client connections held open at once; more are closed as they come "
        f"(default {config.MAX_CONNECTIONS})",
    )
    front.add_argument(
        "--max-connections-per-client",
        type=int,
        default=None,
        help="client connections held open from one address (default "
        f"{config.MAX_CONNECTIONS_PER_CLIENT}; behind a load balancer, raise it to its maxconn)",
    )
    front.add_argument(
        "--header-timeout",
        type=float,
        default=None,
        help="seconds a request head may take to arrive, from the connection's opening or its last "
        f"answer; the connection is closed after (default {config.HEADER_TIMEOUT:g})",
    )
    front.add_argument(
        "--min-body-rate",
        type=int,
        default=None,
        help="bytes a second a request body must keep up after the header timeout's grace; slower is "
        f"a 408 (default {config.MIN_BODY_RATE})",
    )
    front.add_argument(
        "--nixl-interface",
        default=None,
        help="the network interfaces the NIXL agent listens on, as UCX_NET_DEVICES names them "
        "(eth0, mlx5_0:1, comma-separated; 'all' for every one); default: lo when the upstream is on "
        "this host, else the interface toward the upstream and every RDMA port "
        "(UCX_NET_DEVICES in the environment wins)",
    )
    front.add_argument(
        "--allow-private",
        action="store_true",
        help="let image URLs reach private, loopback and link-local addresses (also "
        "PIXELWIRE_ALLOW_PRIVATE=1; worker mode: set it on vLLM too)",
    )
    front.add_argument(
        "--trust-request-mm-kwargs",
        action="store_true",
        help="honour a request's own media_io_kwargs and mm_processor_kwargs, as vLLM's flag of that name "
        "(set it on both; default: such a request is refused with vLLM's 400 before any work)",
    )
    front.add_argument(
        "--model",
        default=None,
        help="the model vLLM serves (a folder or a Hub id): images ship at the size its image processor "
        "resizes to (its processor configs are read; default: none, images ship at their decoded size)",
    )
    front.add_argument(
        "--resize-approximate",
        action="store_true",
        help="with --model, also resize for processors that resize the original twice (LLaVA-OneVision: "
        "the grid-size image ships, its tiles exact, its base tile a resize of it); vLLM's plug-in "
        "must allow it too (PIXELWIRE_RESIZE_APPROXIMATE=1) (default: off, those images ship at full size)",
    )
    front.add_argument(
        "--processed-inputs",
        action=argparse.BooleanOptionalAction,
        default=config.PROCESSED_INPUTS,
        help="with --model of a processor pixelwire makes the outputs of (Qwen2-VL, Qwen2.5-VL, "
        "Qwen3-VL, GLM-4.1V/4.5V), RGB images ship as that processor's output (its patch rows and "
        "grid), which vLLM's plug-in hands the engine as they are: vLLM's API server makes no pass over "
        "their pixels (default: on; --no-processed-inputs ships the resized pixels)",
    )
    front.add_argument(
        "--mm-device-do-normalize",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="as vLLM's flag of that name, which the processed inputs follow: on (vLLM's default for the "
        "covered models), the processor's uint8 patch rows; off, its float32 normalised rows, made by "
        "the plug-in from rows that cross NIXL as the image's bytes (default: on)",
    )
    front.add_argument(
        "--mm-processor-kwargs",
        type=json_object_argument,
        default=None,
        help="the same JSON as vLLM's --mm-processor-kwargs (e.g. '{\"max_pixels\": 1003520}'; "
        "default: none)",
    )
    front.add_argument(
        "--upstream-timeout",
        type=float,
        default=config.UPSTREAM_TIMEOUT,
        help="seconds a forwarded request may take, its answer included "
        f"(default {config.UPSTREAM_TIMEOUT:g})",
    )
    front.add_argument(
        "--drain-seconds",
        type=float,
        default=config.DRAIN_SECONDS,
        help="after SIGTERM, seconds the frontend keeps serving while /health answers 503 (so a load "
        "balancer takes it out), before it stops listening and lets the requests in flight finish; "
        f"sooner once no request has been in flight or come for {config.DRAIN_IDLE_SECONDS:g} s "
        f"(default {config.DRAIN_SECONDS:g})",
    )
    front.add_argument(
        "--max-request-bytes",
        type=size_argument,
        default=config.MAX_REQUEST_BYTES,
        help=f"request body cap, 413 above it (default {config.MAX_REQUEST_BYTES >> 20} MiB: OpenAI's "
        "50 MB request payload fits)",
    )
    front.add_argument(
        "--max-media-per-request",
        "--max-images-per-request",
        dest="max_media_per_request",
        type=int,
        default=config.MAX_MEDIA_PER_REQUEST,
        help="media parts (images, videos, audio) in one request, 400 above it, checked before any "
        f"fetch (default {config.MAX_MEDIA_PER_REQUEST}; give it vLLM's --limit-mm-per-prompt image "
        "count when that is lower); --max-images-per-request is another name for it",
    )
    front.add_argument(
        "--max-fetches-per-request",
        type=int,
        default=config.MAX_FETCHES_PER_REQUEST,
        help=f"image URLs of one request fetched at once (default {config.MAX_FETCHES_PER_REQUEST}): one "
        "request cannot hold every connection the others need",
    )
    front.add_argument(
        "--max-image-bytes-per-request",
        type=size_argument,
        default=config.MAX_IMAGE_BYTES_PER_REQUEST,
        help="encoded image bytes in one request, 400 above it: data: URLs counted before any work, "
        f"fetched images as they arrive (default {config.MAX_IMAGE_BYTES_PER_REQUEST >> 20} MiB)",
    )
    front.add_argument(
        "--max-pixels-per-request",
        type=int,
        default=config.MAX_PIXELS_PER_REQUEST,
        help="decoded pixels of one request's images, 400 above it, from their headers before any "
        f"decode (default {config.MAX_PIXELS_PER_REQUEST:,}: 32 photos of 12 MP fit); a request's "
        "images must also fit in the pool at once",
    )
    front.add_argument(
        "--max-video-bytes",
        type=size_argument,
        default=config.FRONTEND_MAX_VIDEO_BYTES,
        help="encoded bytes of one video, 400 above it "
        f"(default {config.FRONTEND_MAX_VIDEO_BYTES >> 20} MiB)",
    )
    front.add_argument(
        "--max-video-frames",
        type=int,
        default=config.FRONTEND_MAX_VIDEO_FRAMES,
        help=f"frames sampled from one video, 400 above it (default {config.FRONTEND_MAX_VIDEO_FRAMES})",
    )
    front.add_argument(
        "--max-video-pixels",
        type=int,
        default=config.FRONTEND_MAX_VIDEO_PIXELS,
        help=f"pixels of one video frame, 400 above it, from the stream's headers (default "
        f"{config.FRONTEND_MAX_VIDEO_PIXELS:,}: 4K UHD)",
    )
    front.add_argument(
        "--max-video-frame-bytes",
        type=size_argument,
        default=config.FRONTEND_MAX_VIDEO_FRAME_BYTES,
        help=f"bytes of one video's sampled RGB frames, 400 above it, before any is decoded (default "
        f"{config.FRONTEND_MAX_VIDEO_FRAME_BYTES >> 20} MiB, and never more than --pool-bytes)",
    )
    front.add_argument(
        "--max-video-seconds",
        type=int,
        default=config.FRONTEND_MAX_VIDEO_SECONDS,
        help="length of one video, 400 above it, from its headers before any frame is decoded (default "
        f"{config.FRONTEND_MAX_VIDEO_SECONDS} s)",
    )
    front.add_argument(
        "--max-video-decode-pixels",
        type=int,
        default=config.FRONTEND_MAX_VIDEO_DECODE_PIXELS,
        help="pixels decoded for one video (every frame up to the last sampled one, whatever rate its "
        "header claims), 400 above it, from its headers before any frame memory and as it decodes "
        f"(default {config.FRONTEND_MAX_VIDEO_DECODE_PIXELS:,}: 3 hours of 1080p at 30 fps)",
    )
    front.add_argument(
        "--max-json-values",
        type=int,
        default=config.MAX_JSON_VALUES,
        help=f"JSON values in one request body, 400 above it, bounded before parsing (default "
        f"{config.MAX_JSON_VALUES}; counts every '{{', '[' and ',' byte, so it is an upper bound)",
    )
    front.add_argument(
        "--no-check-upstream",
        action="store_true",
        help="skip the handshake: never refuse image requests for the upstream worker's settings "
        "(connector, version, secret, resize, private-address policy, API key)",
    )
    front.add_argument(
        "--access-log",
        action="store_true",
        help="log a line per request: method, path, status, bytes sent, milliseconds, media count "
        "(never a body or a header; also PIXELWIRE_ACCESS_LOG=1; default: off)",
    )


def run(args: argparse.Namespace) -> int:
    """Builds the frontend's settings from ``args`` and serves until stopped."""
    from pixelwire.frontend.allocator import keep_heap_memory

    # Before the first large block: a threshold applies to blocks allocated after it.
    keep_heap_memory()
    from pixelwire import frontend
    from pixelwire.config import PublisherSettings
    from pixelwire.frontend.nixl_interfaces import InterfaceNotFound, listen_devices
    from pixelwire.frontend.settings import FrontendConfig, frontend_video_limits
    from pixelwire.frontend.upstream_watch import upstream_url
    from pixelwire.processed import patch_layout
    from pixelwire.resize import image_resize_policy, video_resize_policy
    from pixelwire.video.sampling import model_video_loader

    try:
        upstream = upstream_url(args.upstream)
        upstream_metrics = [upstream_url(url, "--upstream-metrics") for url in args.upstream_metrics or []]
    except ValueError as error:
        raise CommandError(str(error)) from None
    media_io_kwargs = args.media_io_kwargs
    image_kwargs = media_io_kwargs.get("image", {})
    video_kwargs = media_io_kwargs.get("video", {})
    resize = video_resize = video_loader = processed = None
    if args.resize_approximate and not args.model:
        raise CommandError("--resize-approximate resizes for the model --model names: give --model")
    if args.model:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            resize = image_resize_policy(
                args.model, args.mm_processor_kwargs, approximate=args.resize_approximate
            )
            video_resize = video_resize_policy(args.model, args.mm_processor_kwargs)
            if args.processed_inputs:
                processed = patch_layout(
                    args.model,
                    args.mm_processor_kwargs,
                    resize,
                    device_normalize=args.mm_device_do_normalize,
                )
            video_loader = model_video_loader(args.model)
        except (OSError, ValueError) as error:
            raise CommandError(f"--model {args.model}: {error}") from None
    bounds = {
        "--max-connections": args.max_connections,
        "--max-connections-per-client": args.max_connections_per_client,
        "--header-timeout": args.header_timeout,
        "--min-body-rate": args.min_body_rate,
    }
    for flag, value in bounds.items():
        if value is not None and value <= 0:
            # Zero would close every connection, or time every body out.
            raise CommandError(f"{flag} must be positive, not {value:g}")
    try:
        nixl_devices = listen_devices(args.nixl_interface, upstream)
    except InterfaceNotFound as error:
        raise CommandError(str(error)) from None
    publisher = PublisherSettings.for_frontend(
        decode_at=args.decode_at,
        pool_bytes=args.pool_bytes,
        cache_bytes=args.cache_bytes,
        region_bytes=args.region_bytes,
        lease_seconds=args.lease_seconds,
    )
    video_limits = frontend_video_limits(
        publisher.pool_bytes,
        max_bytes=args.max_video_bytes,
        max_frames=args.max_video_frames,
        max_pixels=args.max_video_pixels,
        max_frame_bytes=args.max_video_frame_bytes,
        max_seconds=args.max_video_seconds,
        max_decode_pixels=args.max_video_decode_pixels,
    )
    config = FrontendConfig.from_env(
        upstream,
        publisher=publisher,
        video_limits=video_limits,
        upstream_metrics=upstream_metrics,
        nixl_devices=nixl_devices,
        image_kwargs=image_kwargs,
        video_kwargs=video_kwargs,
        video_loader=video_loader,
        video_resize=video_resize,
        upstream_timeout=args.upstream_timeout,
        drain_seconds=args.drain_seconds,
        allowed_domains=args.allowed_domains,
        allow_private=args.allow_private,
        trust_request_mm_kwargs=args.trust_request_mm_kwargs,
        check_upstream=not args.no_check_upstream,
        max_request_bytes=args.max_request_bytes,
        max_media_per_request=args.max_media_per_request,
        max_image_bytes_per_request=args.max_image_bytes_per_request,
        max_pixels_per_request=args.max_pixels_per_request,
        max_fetches_per_request=args.max_fetches_per_request,
        max_json_values=args.max_json_values,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        header_timeout=args.header_timeout,
        min_body_rate=args.min_body_rate,
        resize=resize,
        processed=processed,
        api_keys=args.api_key,
        access_log=args.access_log or None,
    )
    if publisher.decode_at == "frontend":
        if publisher.cache_bytes > publisher.pool_bytes:
            raise CommandError(
                f"--cache-bytes ({publisher.cache_bytes}) is over --pool-bytes ({publisher.pool_bytes}): the "
                "cache keeps published images inside the pool; give a smaller --cache-bytes (or "
                "PIXELWIRE_CACHE_BYTES), or a larger --pool-bytes"
            )
        _load_nixl()
    frontend.run(config, args.host, args.port)
    return 0


def _load_nixl() -> None:
    """NIXL's runtime, loaded before the frontend says it serves: without
    it, one line saying what to install, not a traceback at start-up."""
    from pixelwire.nixl import ensure_nixl

    try:
        ensure_nixl()
    except PixelwireError as error:
        raise CommandError(
            f"{error}; or run the frontend with --decode-at worker, which publishes nothing over NIXL"
        ) from None
