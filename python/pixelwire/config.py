"""Every setting pixelwire has: each default once, and the ``PIXELWIRE_*``
environment read in one place, vLLM's media settings the plug-in honours
among them (read into :class:`pixelwire.vllm.media_settings.VllmMediaSettings`).

Other modules take their defaults from here (the CLI's help text too), so a
default changes in one line. Settings a process reads from its environment
(the plug-in inside vLLM, the default publisher and reader) come from the
``from_env`` constructors below; a malformed number raises ``ValueError``
naming the variable, and a flag that is not one of 1/true/yes/0/false/no
keeps its default, so a typo never turns a guard off.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from pixelwire._native import Limits, VideoLimits
from pixelwire.sizes import parse_bytes

MiB = 1024 * 1024
GiB = 1024 * MiB

# VLLM_MEDIA_CONNECTOR's value that selects pixelwire's plug-in.
CONNECTOR_NAME = "pixelwire"

# The modes pixelwire decodes into; other modes are left to vLLM's loader.
Mode = Literal["RGB", "RGBA", "L"]
DECODED_MODES: tuple[Mode, ...] = ("RGB", "RGBA", "L")
# How a reader hands pixels back.
Output = Literal["pil", "numpy", "torch"]
# Where images are decoded: at the frontend (pixels over NIXL) or at the
# worker (the frontend passes the bytes on).
DecodeAt = Literal["frontend", "worker"]
# How a published image is stored: (H, W, C), or RGB at four bytes a pixel
# (Pillow's in-memory layout, mapped without a copy by a PIL reader).
Layout = Literal["HWC", "RGBX", "PATCHES"]

# -- defaults ------------------------------------------------------------------

# Registered pixel memory of a publisher or reader, grown by regions.
POOL_BYTES = 256 * MiB
REGION_BYTES = 64 * MiB
# How long a published image waits for its reader before the slot is reclaimed.
LEASE_SECONDS = 60.0
# Published images `pixelwire frontend` keeps to hand out again to a request
# that sends the same image (decoded once, not once per turn), in pool bytes:
# counted inside its pool (a publish that finds the pool full evicts them
# before it waits); 0 turns the cache off. Not given, it is at most half the
# pool (default_cache_bytes), so that a smaller --pool-bytes alone keeps
# room for the images in flight. A Publisher made in code keeps none unless
# given cache_bytes.
CACHE_BYTES = 128 * MiB
# Beside it, the data: URLs behind the cached images, by exact text and
# cache_salt (pixelwire.caches.data_urls): a resent one is neither base64-decoded
# nor hashed again. Its texts and decoded bytes are Python memory, not pool
# bytes, held within this share of cache_bytes.
DATA_URL_MEMO_SHARE = 0.25
# Images the vLLM plug-in keeps (as copies, in vLLM's API-server process) to
# serve a repeated reference without a READ, or a repeated URL's same bytes
# without decoding them again (PIXELWIRE_WORKER_CACHE_BYTES); 0 turns it
# off. On by default: chat clients resend every earlier image each turn, and
# without it a conversation's later turns cost vLLM's API server (and, in
# worker mode, the frontend, which sends resent data: URLs as references only
# to a worker that keeps them) several times its first ones. 1 GiB holds the
# 8 latest full-size 1080p screenshots (8.3 MB each as the frontend ships
# them, RGBX) of 16 conversations, and many more at a model's resized size;
# with the quarter beside it for the data: URLs (DATA_URL_MEMO_SHARE) it is
# 1.25 GiB at most, about a third of the 4 GiB vLLM's own processor cache
# takes by default (--mm-processor-cache-gb) in the same process, on GPU
# hosts with hundreds of GiB of memory.
WORKER_CACHE_BYTES = 1 * GiB
# How long a publish waits for a free slot in a full pool.
ACQUIRE_TIMEOUT = 10.0
# How long a worker's READ may take.
READ_TIMEOUT = 30.0
# A frontend no READ has used for this long is forgotten by the reader (its
# metadata and connections let go; a later descriptor connects again): a
# frontend that died or left its load balancer sends nothing more.
READER_FRONTEND_IDLE = 60.0
# The largest image a reader accepts, in pixels: the decoder's own limit.
MAX_PIXELS = Limits().max_pixels
# Frames a video is sampled to when the caller names no number: vLLM's
# default (VideoMediaIO's num_frames).
VIDEO_NUM_FRAMES = 32
# What one video may cost, each bound checked from the container and codec
# headers before the memory it guards is taken: the native defaults (1 GiB
# encoded, 1024 frames sampled, 8K frames, 4 GiB of sampled frames, 3 hours,
# and the decoding of 3 hours of 1080p30: every frame up to the last sampled
# one, counted by the frames there are, whatever rate a header claims).
MAX_VIDEO_BYTES = VideoLimits().max_bytes
MAX_VIDEO_FRAMES = VideoLimits().max_frames
MAX_VIDEO_PIXELS = VideoLimits().max_pixels
MAX_VIDEO_FRAME_BYTES = VideoLimits().max_frame_bytes
MAX_VIDEO_SECONDS = VideoLimits().max_seconds
MAX_VIDEO_DECODE_PIXELS = VideoLimits().max_decode_pixels
# How a worker READs (see docs/performance.md, "Transfers", for the sweep
# these come from). NIXL's progress thread on a reader's agent: without it
# nothing progresses the UCX worker between reads, and after a link outage
# the reader could not connect to the same frontend again (tests/faults).
# On a 100 ms timeout (src/agent.rs), idle, it costs under 1 ms of CPU a second.
READER_PROGRESS_THREAD = True
# UCX backend threads a large READ is split across (NIXL's num_threads, one
# UCX worker each); 0 keeps every READ on the calling thread.
READ_THREADS = 4
# READs of at least this many bytes are split across those threads.
READ_SPLIT_MIN_BYTES = 1 * MiB
# Host READs whose content hash is checked go in chunks of this size (whole
# 256 KiB hash pieces), posted without waiting for one another; each chunk's
# pieces are hashed on HASH_THREADS threads as it lands, while the next are
# READ. On the H200 and H100 boxes 4 MiB chunks beat 1 MiB ones (each chunk
# is a NIXL request split across the READ threads; small ones cost more than
# the overlap gains): docs/performance.md, "Transfers".
READ_CHUNK_BYTES = 4 * MiB


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (which taskset and
    a container's cpuset narrow), else the machine's count; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# One hashing thread a core, up to 16: on the H200 box (16 cores) 16 threads
# read 24 MiB in 1.9 ms against 2.6 ms with 4 (the hash tail after the last
# chunk shrinks with them); docs/performance.md.
HASH_THREADS = min(16, usable_cpus())
# Host READs run on native background threads, started at once. Those of
# images up to READ_INLINE_BYTES are waited for in place by the event loop
# (GIL released, without sleeping) for up to READ_INLINE_WAIT seconds: such a
# READ takes tens of microseconds, less than a hand-off to a Python thread and
# back. Larger ones, and any not done by then (a slow or stuck frontend, a
# first connection), are awaited off the loop. 0 bytes: none in place.
READ_INLINE_BYTES = 256 * 1024
READ_INLINE_WAIT = 0.0003
# A CUDA destination: READ into pinned, registered host memory and copy each
# chunk to the device as it lands ("pinned"), or READ straight into
# registered device memory through UCX ("direct": 5-10x slower on the H200
# box). 8 MiB chunks beat 2 and 4 MiB ones there and on the H100 box (more,
# smaller READs are slower than the copies they let start early):
# docs/performance.md.
CudaStaging = Literal["pinned", "direct"]
CUDA_STAGING: CudaStaging = "pinned"
CUDA_CHUNK_BYTES = 8 * MiB
# What RGBA is composited onto for RGB (vLLM's rgba_background_color).
BACKGROUND: tuple[int, int, int] = (255, 255, 255)

# Frontend request caps. OpenAI caps a request's payload at 50 MB; 64 MiB
# takes any it takes, and bounds what one request makes the frontend hold.
MAX_REQUEST_BYTES = 64 * MiB
# vLLM's own --limit-mm-per-prompt (999 by default) is not exposed by a
# stock server, so this is a setting: give it vLLM's value when that is
# lower. 32 keeps one request's images to half the default 256 MiB pool at
# ~1 MP each (4 MiB RGBX), so one request cannot fill it.
MAX_MEDIA_PER_REQUEST = 32
# Its name from when it was taken for images only.
MAX_IMAGES_PER_REQUEST = MAX_MEDIA_PER_REQUEST
MAX_IMAGE_BYTES_PER_REQUEST = 64 * MiB
# Concurrent URL fetches of one request (the fetcher pools 64 connections).
MAX_FETCHES_PER_REQUEST = 8
# JSON values in one body, bounded before parsing: a maximum-size body of
# tiny values (64 MiB of `{},`) would otherwise take ~45 s of the Python
# scanner. A long chat with tools is a few thousand values.
MAX_JSON_VALUES = 500_000
# Decoded pixels of one request's images, from their headers, before any is
# decoded: 32 large photos (12 MP each) fit, 32 pixel bombs (a 2 KB WebP
# can claim 50 MP) do not. A request's images must also fit in the pool
# at once, at the size they ship: it could never be served otherwise.
MAX_PIXELS_PER_REQUEST = 400_000_000
# One video at the frontend, which serves clients that may be hostile: the
# same checks as MAX_VIDEO_* above, tighter (a 400 naming the setting above
# each): its encoded bytes (the request's encoded-bytes cap applies too),
# the frames sampled (Qwen's loaders sample up to 768), the pixels of a
# frame (4K UHD), the bytes of all its sampled RGB frames (which also must
# fit in the pool: a video ships as one slot) and its length.
FRONTEND_MAX_VIDEO_BYTES = 256 * MiB
FRONTEND_MAX_VIDEO_FRAMES = 768
FRONTEND_MAX_VIDEO_PIXELS = 3840 * 2160
FRONTEND_MAX_VIDEO_FRAME_BYTES = 1024 * MiB
FRONTEND_MAX_VIDEO_SECONDS = MAX_VIDEO_SECONDS
FRONTEND_MAX_VIDEO_DECODE_PIXELS = MAX_VIDEO_DECODE_PIXELS
# Videos decoded at once in one process, each on its decoder's own threads
# (min(cores, 16), as OpenCV), on threads whose priority is lowered as the
# image pool's are: more at once would only oversubscribe the cores, and at
# full priority a few long videos would crowd out every image.
VIDEO_DECODE_CALLS = max(1, usable_cpus() // 8)
VIDEO_DECODE_NICE = 10
# Threads videos are decoded on: the VIDEO_DECODE_CALLS decodes that run,
# and those waiting for a turn (pixelwire._native.configure_video_turns):
# a running decode hands its turn on, between packets, to a waiting one
# whose client has had less decoding time, so a short clip does not wait
# for a long video to end. Each thread may hold an opened decoder (a 4K
# H.264 decoder holds up to ~40 frames, ~0.5 GB), which bounds the count.
VIDEO_DECODE_THREADS = VIDEO_DECODE_CALLS + 7
# Of those threads, what one client's videos may hold (its further videos
# wait for its own): another client's video always finds a thread.
VIDEO_DECODES_PER_CLIENT = VIDEO_DECODE_THREADS // 2
# Of the pool, what the videos decoding at once may hold together (a
# video's slot is taken before its first frame and held to its last): the
# rest is left to images, which a long video must never crowd out. One
# video's frames must fit in it (--max-video-frame-bytes is bounded by it).
VIDEO_POOL_SHARE = 0.5


def video_pool_bytes(pool_bytes: int) -> int:
    """The bytes of a ``pool_bytes`` pool the videos decoding at once may hold."""
    return int(pool_bytes * VIDEO_POOL_SHARE)


# Threads of the publish pool, which decodes a request's images taking
# turns with the other requests' (at a lower priority than the process's
# other threads): every core but one, so the event loop and the single
# small images decoded where they are asked for keep a core of their own.
# With every core, abandoned batches of pixel bombs took a small image's
# p99 to 3-5x its unloaded value on 2 cores; with one left, 1.4-1.8x.
PUBLISH_THREADS = max(1, usable_cpus() - 1)
# Publish calls in flight at once in one process. Each holds a thread that
# waits (GIL released) while the native pool, which shares its threads out
# among requests, decodes; a cancelled call ends within about one image.
PUBLISH_CALLS = 64
UPSTREAM_TIMEOUT = 600.0
# glibc's allocator in `pixelwire frontend` (pixelwire.frontend.allocator):
# by default it maps every block of 128 KiB or more afresh and hands it back
# when freed, and trims the heap's free top, so each request body, each
# 256 KiB socket read and each decoded data: URL faults its pages in again
# (a few microseconds a page on a VM: a 4 MiB body cost the event loop 9.4
# ms of CPU to receive, against 3.6 ms with these: benches/body_receive.py).
# Blocks up to
# MALLOC_MMAP_THRESHOLD come from the heap, and up to MALLOC_TRIM_THRESHOLD
# of free heap is kept for the next request: the process stays at its peak
# instead of giving memory back. Operators' own MALLOC_* or GLIBC_TUNABLES
# settings win.
MALLOC_MMAP_THRESHOLD = 32 * MiB
MALLOC_TRIM_THRESHOLD = 256 * MiB
# One log line a request (method, path, status, bytes, milliseconds, media):
# off unless asked for (--access-log, PIXELWIRE_ACCESS_LOG=1), since a busy
# frontend's log would be mostly these.
ACCESS_LOG = False
# pixelwire frontend --model: images ship as the processor's output where
# pixelwire makes it (pixelwire.processed); --no-processed-inputs turns it off.
PROCESSED_INPUTS = True
CONNECT_TIMEOUT = 10.0
# Client connections the frontend holds open, in all and from one address
# (more are closed as they come): under the file descriptors it may open
# (it raises its soft limit to fit them, with room for its own), and a
# per-address share so that one client cannot hold them all (behind a load
# balancer every connection has its address: raise it there).
MAX_CONNECTIONS = 8192
MAX_CONNECTIONS_PER_CLIENT = 1024
# Connections the kernel queues for the frontend (and it takes to be set
# up), and how many it sets up a turn, fewest-held clients' first.
LISTEN_BACKLOG = 4096
ACCEPT_BATCH = 16
# A request head must arrive within this many seconds of a connection
# opening or of its last answer, else the connection is closed; a body must
# come at MIN_BODY_RATE bytes a second or faster after that grace, else 408.
HEADER_TIMEOUT = 20.0
MIN_BODY_RATE = 16 * 1024
# After SIGTERM, how long the frontend keeps serving while its /health
# answers 503 (a load balancer's checks must see it before it stops
# listening: more than their interval times their fall count).
DRAIN_SECONDS = 5.0
# ...or less: the drain ends once no request has been in flight, and none
# has come (the frontend's own /health and /metrics aside), for this long.
# A load balancer still sending requests keeps it serving; one whose
# requests stopped (it took the frontend out), or a frontend with no
# traffic at all, stops without waiting out the window.
DRAIN_IDLE_SECONDS = 1.0
# The start-up handshake (pixelwire.frontend.upstream_watch): the frontend
# reads the worker's settings from vLLM's /metrics every HANDSHAKE_INTERVAL
# seconds while they agree, every HANDSHAKE_RETRY seconds while they do not
# (or vLLM does not answer yet), and at once when the plug-in refuses a
# request. An image request that finds them disagreeing rechecks first, so
# a fixed worker is seen at once, when the last check began more than
# HANDSHAKE_RECHECK_AGE earlier (a flood of refused requests costs vLLM at
# most four /metrics a second); one refused because vLLM did not answer at
# all waits for a check begun after it came (vLLM starts listening only once
# it is ready). Each check (and a GET /health's look at vLLM's own) waits
# HANDSHAKE_TIMEOUT seconds at most.
HANDSHAKE_INTERVAL = 30.0
HANDSHAKE_RETRY = 2.0
HANDSHAKE_RECHECK_AGE = 0.25
HANDSHAKE_TIMEOUT = 5.0

# Image URL fetching (pixelwire.fetch.Fetcher): a whole fetch, redirects and
# body included, is bounded by FETCH_TIMEOUT, not per read, so a trickling
# server cannot hold a request for ever; 50 MB is vLLM's own cap on a
# fetched image.
FETCH_TIMEOUT = 30.0
FETCH_MAX_BYTES = 50 * 1024 * 1024
FETCH_MAX_REDIRECTS = 3
# Retries (pixelwire.fetch.Fetcher's attempts): one attempt unless asked, so
# the frontend's client decides; what is retried, and vLLM's back-off: attempt
# n (from 0) waits FETCH_TIMEOUT * FETCH_RETRY_GROWTH**n and follows a pause of
# FETCH_RETRY_BACKOFF * FETCH_RETRY_GROWTH**(n - 1) seconds (vLLM 0.32's
# connections.py: 1 s, then 4 s).
FETCH_ATTEMPTS = 1
FETCH_RETRY_BACKOFF = 1.0
FETCH_RETRY_GROWTH = 4.0

# vLLM 0.32's media settings and their defaults (vllm/envs.py), which the
# plug-in reads through VllmMediaSettings.from_env: the one place they are
# mapped onto pixelwire's.
VLLM_MEDIA_FETCH_MAX_RETRIES = 3
VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB = 256
VLLM_IMAGE_FETCH_TIMEOUT = 5
VLLM_VIDEO_FETCH_TIMEOUT = 30
VLLM_AUDIO_FETCH_TIMEOUT = 10
VLLM_MAX_IMAGE_PIXELS = 178_956_970
# No limit at all, where vLLM has none (VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB=0).
UNLIMITED_BYTES = (1 << 63) - 1


# -- the environment -------------------------------------------------------------


def env_int(name: str, default: int) -> int:
    """An integer variable; unset or empty is the default."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    """A number variable; unset or empty is the default."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number") from None


def env_bytes(name: str, default: int) -> int:
    """A size variable (:func:`parse_bytes`: units allowed); unset or empty
    is the default."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return parse_bytes(value)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def env_flag(name: str, default: bool) -> bool:
    """1/true/yes or 0/false/no; anything else (or unset) is the default, so a
    typo never turns a guard off."""
    value = os.environ.get(name, "")
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    return default


def video_limits_from_env() -> VideoLimits:
    """``PIXELWIRE_MAX_VIDEO_BYTES``, ``PIXELWIRE_MAX_VIDEO_FRAMES``,
    ``PIXELWIRE_MAX_VIDEO_PIXELS``, ``PIXELWIRE_MAX_VIDEO_FRAME_BYTES``,
    ``PIXELWIRE_MAX_VIDEO_SECONDS``, ``PIXELWIRE_MAX_VIDEO_DECODE_PIXELS``: the
    limits of a ``decode_video`` given none."""
    return VideoLimits(
        max_bytes=env_bytes("PIXELWIRE_MAX_VIDEO_BYTES", MAX_VIDEO_BYTES),
        max_frames=env_int("PIXELWIRE_MAX_VIDEO_FRAMES", MAX_VIDEO_FRAMES),
        max_pixels=env_int("PIXELWIRE_MAX_VIDEO_PIXELS", MAX_VIDEO_PIXELS),
        max_frame_bytes=env_bytes("PIXELWIRE_MAX_VIDEO_FRAME_BYTES", MAX_VIDEO_FRAME_BYTES),
        max_seconds=env_int("PIXELWIRE_MAX_VIDEO_SECONDS", MAX_VIDEO_SECONDS),
        max_decode_pixels=env_int("PIXELWIRE_MAX_VIDEO_DECODE_PIXELS", MAX_VIDEO_DECODE_PIXELS),
    )


def secret_from_env() -> bytes | None:
    """``PIXELWIRE_SECRET`` as bytes, or None when unset or empty: the key
    descriptor references are signed and checked with."""
    value = os.environ.get("PIXELWIRE_SECRET", "")
    return value.encode() if value else None


def allow_unsigned_from_env() -> bool:
    """``PIXELWIRE_ALLOW_UNSIGNED``: only 1/true/yes turn it on (a typo is off)."""
    return env_flag("PIXELWIRE_ALLOW_UNSIGNED", False)


def api_keys_from_env() -> list[str]:
    """``VLLM_API_KEY``, vLLM's own variable for its ``--api-key``: the
    frontend takes the same key, so one setting guards both."""
    key = os.environ.get("VLLM_API_KEY", "")
    return [key] if key else []


def nixl_library_from_env() -> str | None:
    """``PIXELWIRE_NIXL_LIB``: a ``libnixl_capi.so`` to load instead of the
    installed nixl wheel's; None when unset or empty."""
    return os.environ.get("PIXELWIRE_NIXL_LIB") or None


def worker_nixl_interface_from_env() -> str | None:
    """``PIXELWIRE_NIXL_INTERFACE``: the network devices the plug-in's NIXL
    reader agent listens on, as ``UCX_NET_DEVICES`` names them (``all``:
    every one); None when unset or empty (derived from vLLM's ``--host``:
    :mod:`pixelwire.vllm.nixl_interfaces`)."""
    return os.environ.get("PIXELWIRE_NIXL_INTERFACE") or None


def worker_model_from_env() -> tuple[str | None, dict[str, Any] | None]:
    """The plug-in's overrides of vLLM's ``--model`` and
    ``--mm-processor-kwargs``: ``PIXELWIRE_MODEL`` and
    ``PIXELWIRE_MM_PROCESSOR_KWARGS`` (a JSON object); None for each unset
    (:mod:`pixelwire.vllm.served_model` then reads vLLM's command line)."""
    model = os.environ.get("PIXELWIRE_MODEL") or None
    raw = os.environ.get("PIXELWIRE_MM_PROCESSOR_KWARGS")
    if not raw:
        return model, None
    try:
        kwargs = json.loads(raw)
    except ValueError:
        raise ValueError(f"PIXELWIRE_MM_PROCESSOR_KWARGS={raw!r} is not JSON") from None
    if not isinstance(kwargs, dict):
        raise ValueError(f"PIXELWIRE_MM_PROCESSOR_KWARGS={raw!r} is not a JSON object")
    return model, kwargs


def resize_approximate_from_env() -> bool:
    """``PIXELWIRE_RESIZE_APPROXIMATE``: whether the vLLM plug-in accepts
    (and, in worker mode, makes) the approximate resize of processors that
    resize the original twice, as the frontend's ``--resize-approximate``
    makes it. Only 1/true/yes turn it on: such pixels are not the ones
    vLLM's loader would give its processor, so a typo keeps them out."""
    return env_flag("PIXELWIRE_RESIZE_APPROXIMATE", False)


def decode_at(value: str | None = None) -> DecodeAt:
    """``value``, else ``PIXELWIRE_DECODE_AT``, else ``"frontend"``."""
    chosen = value or os.environ.get("PIXELWIRE_DECODE_AT") or "frontend"
    if chosen not in ("frontend", "worker"):
        raise ValueError(f"decode_at must be 'frontend' or 'worker', not {chosen!r}")
    return "frontend" if chosen == "frontend" else "worker"


def worker_cache_bytes_from_env() -> int:
    """``PIXELWIRE_WORKER_CACHE_BYTES``: the vLLM plug-in's image cache (0: off)."""
    return env_bytes("PIXELWIRE_WORKER_CACHE_BYTES", WORKER_CACHE_BYTES)


def default_cache_bytes(pool_bytes: int) -> int:
    """The frontend's cache when neither ``--cache-bytes`` nor
    ``PIXELWIRE_CACHE_BYTES`` gives one: CACHE_BYTES, at most half the pool."""
    return min(CACHE_BYTES, max(0, pool_bytes) // 2)


def data_url_memo_bytes(cache_bytes: int) -> int:
    """The memo of ``data:`` URLs kept beside a cache of ``cache_bytes``."""
    return int(max(0, cache_bytes) * DATA_URL_MEMO_SHARE)


def access_log_from_env() -> bool:
    """``PIXELWIRE_ACCESS_LOG``: the frontend's line a request, off unless asked for."""
    return env_flag("PIXELWIRE_ACCESS_LOG", ACCESS_LOG)


def allow_private_from_env() -> bool:
    """``PIXELWIRE_ALLOW_PRIVATE``, the explicit opt-out of the fetcher's
    address guard, for deployments that fetch from their own network."""
    return env_flag("PIXELWIRE_ALLOW_PRIVATE", False)


@dataclass(frozen=True)
class PublisherSettings:
    """A :class:`pixelwire.Publisher`'s settings, made once: its pool and
    lease, where it decodes (``decode_at`` not given: ``PIXELWIRE_DECODE_AT``,
    else ``"frontend"``), the image limits, its publish threads and its
    cache (0: off, what a Publisher made in code keeps unless given one)."""

    pool_bytes: int = POOL_BYTES
    region_bytes: int = REGION_BYTES
    lease_seconds: float = LEASE_SECONDS
    acquire_timeout: float = ACQUIRE_TIMEOUT
    publish_threads: int = PUBLISH_THREADS
    decode_at: DecodeAt = field(default_factory=lambda: decode_at())
    limits: Limits | None = None
    cache_bytes: int = 0

    def __post_init__(self) -> None:
        # Frozen: checked once, here, before anyone holds the settings.
        object.__setattr__(self, "decode_at", decode_at(self.decode_at))

    @classmethod
    def from_env(cls, **given: Any) -> PublisherSettings:
        """``given`` settings (None: not given); the rest from
        ``PIXELWIRE_POOL_BYTES``, ``PIXELWIRE_REGION_BYTES``,
        ``PIXELWIRE_LEASE_SECONDS``, ``PIXELWIRE_ACQUIRE_TIMEOUT``,
        ``PIXELWIRE_PUBLISH_THREADS`` and ``PIXELWIRE_DECODE_AT``, else the defaults."""
        from_env = {
            "pool_bytes": env_bytes("PIXELWIRE_POOL_BYTES", POOL_BYTES),
            "region_bytes": env_bytes("PIXELWIRE_REGION_BYTES", REGION_BYTES),
            "lease_seconds": env_float("PIXELWIRE_LEASE_SECONDS", LEASE_SECONDS),
            "acquire_timeout": env_float("PIXELWIRE_ACQUIRE_TIMEOUT", ACQUIRE_TIMEOUT),
            "publish_threads": env_int("PIXELWIRE_PUBLISH_THREADS", PUBLISH_THREADS),
        }
        return cls(**{**from_env, **{name: value for name, value in given.items() if value is not None}})

    @classmethod
    def for_frontend(cls, **given: Any) -> PublisherSettings:
        """:meth:`from_env`, with the frontend's cache: ``cache_bytes`` given,
        else ``PIXELWIRE_CACHE_BYTES``, else :func:`default_cache_bytes` of the pool."""
        settings = cls.from_env(**given)
        if given.get("cache_bytes") is not None:
            return settings
        cache_bytes = env_bytes("PIXELWIRE_CACHE_BYTES", default_cache_bytes(settings.pool_bytes))
        return dataclasses.replace(settings, cache_bytes=cache_bytes)


@dataclass(frozen=True)
class ReaderSettings:
    """A :class:`pixelwire.Reader`'s receive pool and checks, handed whole
    to the native reader, which reads the fields it uses by name. Made
    consistent when made: ``region_bytes`` at most ``pool_bytes``, chunk
    sizes and hashing threads at least 1, ``inline_bytes`` at least 0; a
    negative ``inline_wait`` or an unknown ``cuda_staging`` is a
    ``ValueError``."""

    timeout: float = READ_TIMEOUT
    frontend_idle: float = READER_FRONTEND_IDLE
    verify: bool = True
    max_pixels: int = MAX_PIXELS
    pool_bytes: int = POOL_BYTES
    region_bytes: int = REGION_BYTES
    progress_thread: bool = READER_PROGRESS_THREAD
    read_threads: int = READ_THREADS
    split_min_bytes: int = READ_SPLIT_MIN_BYTES
    chunk_bytes: int = READ_CHUNK_BYTES
    hash_threads: int = HASH_THREADS
    inline_bytes: int = READ_INLINE_BYTES
    inline_wait: float = READ_INLINE_WAIT
    cuda_staging: CudaStaging = CUDA_STAGING
    cuda_chunk_bytes: int = CUDA_CHUNK_BYTES

    def __post_init__(self) -> None:
        if not self.frontend_idle >= 0:
            raise ValueError(
                f"frontend_idle must be a non-negative number of seconds, not {self.frontend_idle!r}"
            )
        if not self.inline_wait >= 0:
            raise ValueError(
                f"inline_wait must be a non-negative number of seconds, not {self.inline_wait!r}"
            )
        consistent = {
            "region_bytes": min(self.region_bytes, self.pool_bytes),
            "chunk_bytes": max(1, self.chunk_bytes),
            "hash_threads": max(1, self.hash_threads),
            "inline_bytes": max(0, self.inline_bytes),
            "cuda_staging": cuda_staging(self.cuda_staging),
            "cuda_chunk_bytes": max(1, self.cuda_chunk_bytes),
        }
        for name, value in consistent.items():
            # Frozen: set once, here, before anyone holds the settings.
            object.__setattr__(self, name, value)

    @classmethod
    def from_env(cls) -> ReaderSettings:
        """``PIXELWIRE_READ_TIMEOUT``, ``PIXELWIRE_READER_FRONTEND_IDLE``, ``PIXELWIRE_VERIFY``,
        ``PIXELWIRE_READER_POOL_BYTES``, ``PIXELWIRE_READER_REGION_BYTES``,
        ``PIXELWIRE_READER_PROGRESS_THREAD``, ``PIXELWIRE_READ_THREADS``,
        ``PIXELWIRE_READ_SPLIT_MIN_BYTES``, ``PIXELWIRE_READ_CHUNK_BYTES``,
        ``PIXELWIRE_HASH_THREADS``, ``PIXELWIRE_READ_INLINE_BYTES``, ``PIXELWIRE_READ_INLINE_WAIT``,
        ``PIXELWIRE_CUDA_STAGING``, ``PIXELWIRE_CUDA_CHUNK_BYTES``."""
        return cls(
            timeout=env_float("PIXELWIRE_READ_TIMEOUT", READ_TIMEOUT),
            frontend_idle=env_float("PIXELWIRE_READER_FRONTEND_IDLE", READER_FRONTEND_IDLE),
            verify=env_flag("PIXELWIRE_VERIFY", True),
            pool_bytes=env_bytes("PIXELWIRE_READER_POOL_BYTES", POOL_BYTES),
            region_bytes=env_bytes("PIXELWIRE_READER_REGION_BYTES", REGION_BYTES),
            progress_thread=env_flag("PIXELWIRE_READER_PROGRESS_THREAD", READER_PROGRESS_THREAD),
            read_threads=env_int("PIXELWIRE_READ_THREADS", READ_THREADS),
            split_min_bytes=env_bytes("PIXELWIRE_READ_SPLIT_MIN_BYTES", READ_SPLIT_MIN_BYTES),
            chunk_bytes=env_bytes("PIXELWIRE_READ_CHUNK_BYTES", READ_CHUNK_BYTES),
            hash_threads=env_int("PIXELWIRE_HASH_THREADS", HASH_THREADS),
            inline_bytes=env_bytes("PIXELWIRE_READ_INLINE_BYTES", READ_INLINE_BYTES),
            inline_wait=env_float("PIXELWIRE_READ_INLINE_WAIT", READ_INLINE_WAIT),
            cuda_staging=cuda_staging(os.environ.get("PIXELWIRE_CUDA_STAGING")),
            cuda_chunk_bytes=env_bytes("PIXELWIRE_CUDA_CHUNK_BYTES", CUDA_CHUNK_BYTES),
        )


def cuda_staging(value: str | None) -> CudaStaging:
    """``value`` (unset or empty: the default) as a CUDA staging choice."""
    chosen = value or CUDA_STAGING
    if chosen not in ("pinned", "direct"):
        raise ValueError(f"cuda_staging must be 'pinned' or 'direct', not {chosen!r}")
    return "pinned" if chosen == "pinned" else "direct"
