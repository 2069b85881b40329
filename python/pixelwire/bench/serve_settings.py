"""The options of `pixelwire bench serve` and the :class:`Settings` a run
takes from them: the paths compared, the workloads, the concurrencies and
the servers' settings."""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pixelwire.sizes import parse_bytes

PATHS = {
    "loader": "vLLM's loader",
    "frontend": "frontend + NIXL",
    "frontend-resize": "frontend + NIXL + resize",
    "frontend-processed": "frontend + NIXL + processed inputs",
    "worker": "worker mode",
}
QUICK_WORKLOADS = ["jpeg-4k-data", "png-4k-http", "mixed"]
MiB = 1 << 20


def positive_count(text: str) -> int:
    """A whole number of at least 1 (turns, conversations, rounds)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is less than 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pixelwire.bench.inputs import WORKLOAD_KEYS

    parser.add_argument(
        "--model", required=True, help="the model vLLM serves (a folder or a Hub id; required)"
    )
    parser.add_argument(
        "--photo",
        type=Path,
        default=None,
        help="a photo the inputs are made from (scaled to 1080p and 4K; default: a generated stand-in)",
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="folder for report.json, report.md and the charts (default target/bench-serve/<time>)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a short run: workloads {', '.join(QUICK_WORKLOADS)}, 3 s a cell",
    )
    parser.add_argument(
        "--video",
        type=Path,
        default=None,
        help="a video the video workloads send (default: a 10 s 1080p H.264 made with the ffmpeg tool)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=list(PATHS),
        default=list(PATHS),
        help="the paths measured (default: all)",
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        choices=WORKLOAD_KEYS,
        default=None,
        help="one input each, or mixed (all in turn); default: all, or --quick's",
    )
    parser.add_argument(
        "--concurrency", nargs="+", type=int, default=[1, 4, 16], help="streaming clients at once, per cell"
    )
    parser.add_argument(
        "--duration", type=float, default=None, help="seconds of load a cell (default 8; --quick 3)"
    )
    parser.add_argument("--max-requests", type=int, default=200, help="requests a cell at most")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens generated a request")
    parser.add_argument(
        "--warm-up", type=int, default=2, help="unmeasured requests per path and workload (default 2)"
    )
    parser.add_argument(
        "--mm-processor-kwargs",
        type=json.loads,
        default=None,
        help="vLLM's --mm-processor-kwargs, given to both vLLMs, the plug-in and the resizing frontend "
        "(default: none)",
    )
    parser.add_argument(
        "--vllm-args",
        default="",
        help="more arguments for both vLLM servers, one string (e.g. '--dtype float32 --enforce-eager')",
    )
    parser.add_argument("--max-num-seqs", type=int, default=16, help="vLLM's --max-num-seqs")
    parser.add_argument(
        "--resize-approximate",
        action="store_true",
        help="the resizing frontend's --resize-approximate, with PIXELWIRE_RESIZE_APPROXIMATE=1 on the "
        "plug-in's vLLM (worker mode's URLs then resize so too); for a processor that resizes twice",
    )
    parser.add_argument(
        "--frontend-pool-bytes",
        type=parse_bytes,
        default=1 << 30,
        help="the frontends' --pool-bytes (default 1 GiB: 16 4K images in flight need ~530 MB)",
    )
    parser.add_argument(
        "--turns",
        type=positive_count,
        default=8,
        help="multi-turn: turns a conversation (turn k sends k screenshots, or the video again; default 8)",
    )
    parser.add_argument(
        "--conversations",
        nargs="+",
        type=positive_count,
        default=[1, 4],
        help="multi-turn: conversations at once, per cell (default 1 4)",
    )
    parser.add_argument(
        "--rounds",
        type=positive_count,
        default=None,
        help="multi-turn: sets of conversations a cell, one after the other (default 3; --quick 1)",
    )
    parser.add_argument(
        "--frontend-cache-bytes",
        type=parse_bytes,
        default=512 * MiB,
        help="multi-turn: the frontends' --cache-bytes (default 512 MiB: 4 conversations of 8 "
        "full-size 1080p screenshots hold 265 MB)",
    )
    parser.add_argument(
        "--worker-cache-bytes",
        type=parse_bytes,
        default=512 * MiB,
        help="multi-turn: the plug-in's PIXELWIRE_WORKER_CACHE_BYTES (default 512 MiB)",
    )
    parser.add_argument(
        "--multi-turn-caches",
        choices=["on", "off"],
        default="on",
        help="multi-turn: on (default): servers of its own with vLLM's, the frontend's and the "
        "worker's caches on; off: the image workloads' servers, every cache off",
    )
    parser.add_argument(
        "--network",
        choices=["auto", "netns", "loopback"],
        default="auto",
        help="auto: the frontend in its own network namespace when possible, else loopback",
    )
    parser.add_argument("--no-pin", action="store_true", help="never pin processes to CPUs")
    parser.add_argument(
        "--startup-timeout", type=float, default=900.0, help="seconds the servers may take to be ready"
    )


@dataclass
class Settings:
    model: str
    results: Path
    paths: list[str]
    workloads: list[str]
    concurrency: list[int]
    duration_s: float
    max_requests: int
    max_tokens: int
    warm_up: int
    mm_processor_kwargs: dict[str, Any] | None
    vllm_args: list[str]
    max_num_seqs: int
    frontend_pool_bytes: int
    quick: bool
    turns: int
    conversations: list[int]
    rounds: int
    frontend_cache_bytes: int
    worker_cache_bytes: int
    multi_turn_caches: bool
    resize_approximate: bool = False

    def turn_workloads(self) -> list[str]:
        """The multi-turn workloads the run has, in the order they run."""
        from pixelwire.bench.inputs import MULTI_TURN_KEYS

        return [w for w in MULTI_TURN_KEYS if w in self.workloads]

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Settings:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        return cls(
            model=args.model,
            results=args.results or Path("target") / "bench-serve" / stamp,
            paths=[p for p in PATHS if p in args.paths],
            workloads=args.workloads or (QUICK_WORKLOADS if args.quick else _all_workloads(args.video)),
            concurrency=sorted(set(args.concurrency)),
            duration_s=args.duration if args.duration is not None else (3.0 if args.quick else 8.0),
            max_requests=args.max_requests,
            max_tokens=args.max_tokens,
            warm_up=args.warm_up,
            mm_processor_kwargs=args.mm_processor_kwargs,
            vllm_args=shlex.split(args.vllm_args),
            max_num_seqs=args.max_num_seqs,
            frontend_pool_bytes=args.frontend_pool_bytes,
            quick=args.quick,
            turns=args.turns,
            conversations=sorted(set(args.conversations)),
            rounds=args.rounds if args.rounds is not None else (1 if args.quick else 3),
            frontend_cache_bytes=args.frontend_cache_bytes,
            worker_cache_bytes=args.worker_cache_bytes,
            multi_turn_caches=args.multi_turn_caches == "on",
            resize_approximate=args.resize_approximate,
        )


def _all_workloads(video: Path | None) -> list[str]:
    """Every image workload, and the video ones when there is a video to
    send (``--video``, or the ffmpeg tool to make one)."""
    import shutil

    from pixelwire.bench.inputs import IMAGE_KEYS, MIXED, MULTI_TURN, MULTI_TURN_VIDEO, VIDEO_KEYS

    videos = VIDEO_KEYS if video is not None or shutil.which("ffmpeg") else []
    return [*IMAGE_KEYS, MIXED, *videos, MULTI_TURN, *([MULTI_TURN_VIDEO] if videos else [])]
