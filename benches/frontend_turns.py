"""The frontend's CPU per request, by turn of conversations that resend their images.

``pixelwire frontend`` (a real process, the tiny Qwen2-VL's resize, its
cache on) in front of the tests' loopback upstream, which plays vLLM's HTTP
side and READs every reference over NIXL. ``--conversations`` chats run
side by side, 8 turns each: turn k sends k 1080p PNG screenshots as
``data:`` URLs (one new, the earlier ones again, as OpenAI-style clients
do). Per turn: the frontend process's CPU (every thread, from /proc) over
the turn's requests, per request, median over ``--rounds`` rounds of fresh
screenshots. The peer in the same run: the same frontend with its cache off
(``--cache-bytes 0``), which decodes every resent screenshot again; and
the frontend in worker mode (``--decode-at worker``), which checks each
part and passes the ``data:`` URLs on for the worker to decode. No vLLM:
the frontend's own share of a turn (``pixelwire bench serve --workloads
multiturn`` measures the whole stack).

Usage::

    python benches/frontend_turns.py [--conversations 4] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [
    str(HERE.parent / "tests"),
    str(HERE.parent / "tests" / "e2e"),
    str(HERE.parent / "tests" / "frontend"),
]

from pixelwire.bench.conversation import Conversation  # noqa: E402
from pixelwire.bench.inputs import screenshot  # noqa: E402
from pixelwire.bench.services import cpu_seconds  # noqa: E402
from pixelwire.resize import image_resize_policy  # noqa: E402

from frontend_client import started_frontend  # noqa: E402
from loopback_servers import Upstream, worker_info  # noqa: E402

TURNS = 8
# The tiny Qwen2-VL's image processor (tests/e2e/tiny_model.py).
PROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": 14,
    "merge_size": 2,
    "min_pixels": 3136,
    "max_pixels": 12544,
}


def run(conversations: int, rounds: int, cache_bytes: int, folder: Path, *extra: str) -> dict[int, float]:
    """Median frontend CPU ms per request, by turn."""
    model = folder / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    policy = image_resize_policy(model)
    assert policy is not None
    upstream = Upstream()
    upstream.metrics_text = worker_info(resize=policy.identity)
    frontend = started_frontend(
        folder,
        upstream.url,
        "--model",
        str(model),
        "--cache-bytes",
        str(cache_bytes),
        "--lease-seconds",
        "30",
        *extra,
    )

    def post(body: dict[str, Any]) -> None:
        request = urllib.request.Request(
            f"{frontend.url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status < 300, response.status
            response.read()

    per_turn: dict[int, list[float]] = {turn: [] for turn in range(1, TURNS + 1)}
    seed = 7000
    try:
        with ThreadPoolExecutor(conversations) as pool:
            for _ in range(rounds):
                chats = []
                for _ in range(conversations):
                    urls = []
                    for _ in range(TURNS):
                        seed += 1
                        urls.append("data:image/png;base64," + base64.b64encode(screenshot(seed)).decode())
                    chats.append(Conversation(urls))
                for turn in range(1, TURNS + 1):
                    bodies = [
                        {"model": "tiny", "messages": chat.messages(), "max_tokens": 4} for chat in chats
                    ]
                    before = cpu_seconds(frontend.pid, with_descendants=True)
                    list(pool.map(post, bodies))
                    spent = cpu_seconds(frontend.pid, with_descendants=True) - before
                    per_turn[turn].append(spent / conversations * 1000)
                    for chat in chats:
                        chat.answered("A short answer.")
    finally:
        frontend.stop()
        upstream.close()
    return {turn: statistics.median(values) for turn, values in per_turn.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    results: dict[str, Any] = {"conversations": args.conversations, "rounds": args.rounds, "paths": {}}
    with tempfile.TemporaryDirectory() as tmp:
        frontends = (
            ("cache on (512 MiB)", 512 << 20, ()),
            ("cache off", 0, ()),
            ("worker mode", 0, ("--decode-at", "worker")),
        )
        for name, cache_bytes, extra in frontends:
            folder = Path(tmp) / name.split()[1]
            turns = run(args.conversations, args.rounds, cache_bytes, folder, *extra)
            ratio = turns[TURNS] / turns[1]
            results["paths"][name] = {"cpu_ms_per_request": turns, "turn8_over_turn1": ratio}
            cells = " | ".join(f"{turns[t]:.1f}" for t in range(1, TURNS + 1))
            print(f"| {name} | {cells} | {ratio:.2f}x |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
