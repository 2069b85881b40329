"""The multi-turn workload's conversations and what is made of each turn.

An agent loop, as OpenAI-style clients send it: turn k carries the whole
chat so far, so its request holds k screenshots (every earlier one again,
as the same ``data:`` URL) and the k - 1 answers the model streamed back.
The conversations of a cell advance in lockstep, a turn at a time, so that
the CPU the servers spend between two turns' barriers is that turn's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pixelwire.bench.load import Outcome, percentiles


def turn_prompt(turn: int) -> str:
    return f"Screenshot {turn}: what changed on the screen, and what should I click next?"


class Conversation:
    """One chat: a screenshot (a ``data:`` URL) per turn, and the answers
    streamed back so far."""

    def __init__(self, screenshots: Sequence[str]) -> None:
        if not screenshots:
            raise ValueError("a conversation needs at least one screenshot")
        self.screenshots = list(screenshots)
        self.replies: list[str] = []

    @property
    def turns(self) -> int:
        return len(self.screenshots)

    @property
    def next_turn(self) -> int:
        """The turn (from 1) the next request is; turns + 1 once over."""
        return len(self.replies) + 1

    def messages(self) -> list[dict[str, Any]]:
        """The next turn's request: every earlier turn (its screenshot, its
        prompt, the answer to it), then this turn's screenshot and prompt."""
        turn = self.next_turn
        if turn > self.turns:
            raise ValueError(f"the conversation is over after {self.turns} turns")
        out: list[dict[str, Any]] = []
        for n in range(1, turn + 1):
            content = [
                {"type": "image_url", "image_url": {"url": self.screenshots[n - 1]}},
                {"type": "text", "text": turn_prompt(n)},
            ]
            out.append({"role": "user", "content": content})
            if n < turn:
                out.append({"role": "assistant", "content": self.replies[n - 1]})
        return out

    def answered(self, reply: str) -> None:
        """The answer to the turn just sent: part of every later request."""
        if self.next_turn > self.turns:
            raise ValueError(f"the conversation is over after {self.turns} turns")
        self.replies.append(reply)


def turn_cell(
    *,
    path: str,
    concurrency: int,
    turn: int,
    outcomes: Sequence[Outcome],
    usage: Mapping[str, float],
    has_frontend: bool,
) -> dict[str, Any]:
    """One turn of a path and concurrency, over every conversation and
    round: ``usage`` holds the totals measured across that turn's windows
    (CPU seconds ``api_server``, ``vllm_all``, ``frontend``; ``pixel_bytes``
    the frontend handed out over NIXL and ``nixl_reads``, the READs the
    plug-in made). Per request: totals over the requests that succeeded;
    None where nothing succeeded or the path has no frontend."""
    succeeded = [o for o in outcomes if o.error is None]
    errors = [o.error for o in outcomes if o.error is not None]
    requests = len(succeeded)

    def per_request(total: float, scale: float = 1.0, *, frontend_only: bool = False) -> float | None:
        if not requests or (frontend_only and not has_frontend):
            return None
        return total * scale / requests

    pixel_bytes = usage.get("pixel_bytes", 0.0)
    images = turn * requests
    return {
        "path": path,
        "concurrency": concurrency,
        "turn": turn,
        "images_per_request": turn,
        "requests": len(outcomes),
        "errors": len(errors),
        "error_samples": sorted(set(errors))[:5],
        "latency_ms": percentiles([o.latency_s for o in succeeded]),
        "ttft_ms": percentiles([o.ttft_s for o in succeeded if o.ttft_s is not None]),
        "cpu_ms_per_request": {
            "api_server": per_request(usage["api_server"], 1e3),
            "vllm_all": per_request(usage["vllm_all"], 1e3),
            "frontend": per_request(usage.get("frontend", 0.0), 1e3, frontend_only=True),
        },
        # What the requests' descriptors refer to (every image, read or not) ...
        "nixl_pixel_bytes_per_request": per_request(pixel_bytes, frontend_only=True),
        # ... and what crossed: READs (a worker-cache hit makes none) times
        # an image's bytes (the screenshots all have one size).
        "nixl_reads_per_request": per_request(usage.get("nixl_reads", 0.0), frontend_only=True),
        "nixl_read_bytes_per_request": per_request(
            usage.get("nixl_reads", 0.0) * pixel_bytes / images if images else 0.0, frontend_only=True
        ),
    }


def turn_ratios(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per path and concurrency: the last turn's CPU ms per request of the
    API server and of the frontend over the first turn's (None where a
    side has no value or the first turn's is 0)."""
    out: list[dict[str, Any]] = []
    groups: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["path"], cell["concurrency"]), []).append(cell)
    for (path, concurrency), chosen in groups.items():
        first = min(chosen, key=lambda c: c["turn"])
        last = max(chosen, key=lambda c: c["turn"])
        ratios: dict[str, float | None] = {}
        for part in ("api_server", "frontend"):
            a, b = first["cpu_ms_per_request"][part], last["cpu_ms_per_request"][part]
            ratios[part] = b / a if a and b is not None else None
        out.append(
            {
                "path": path,
                "concurrency": concurrency,
                "first_turn": first["turn"],
                "last_turn": last["turn"],
                "cpu_ratio": ratios,
            }
        )
    return out
