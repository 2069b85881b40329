"""The multi-turn workloads' conversations and what is made of each turn.

An agent loop, as OpenAI-style clients send it: turn k carries the whole
chat so far, so its request holds k screenshots (every earlier one again,
as the same ``data:`` URL) and the k - 1 answers the model streamed back.
A chat about one video (``video_conversation``) sends the video with its
first question and resends it, as the same ``data:`` URL, with every later
turn's whole chat. The conversations of a cell advance in lockstep, a turn
at a time, so that the CPU the servers spend between two turns' barriers
is that turn's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pixelwire.bench.inputs import MULTI_TURN
from pixelwire.bench.load import Outcome, percentiles


def turn_prompt(turn: int) -> str:
    return f"Screenshot {turn}: what changed on the screen, and what should I click next?"


def video_prompt(turn: int) -> str:
    return f"Question {turn} about the video: what happens in it, and what comes next?"


class Conversation:
    """One chat: per turn, the medium (a ``data:`` URL of ``kind``) it adds,
    or None for a turn of text alone, and the answers streamed back so far."""

    def __init__(
        self,
        media: Sequence[str | None],
        *,
        kind: str = "image",
        prompt: Callable[[int], str] = turn_prompt,
    ) -> None:
        if not media:
            raise ValueError("a conversation needs at least one turn")
        if kind not in ("image", "video"):
            raise ValueError(f"a conversation sends images or videos, not {kind!r}")
        self.media = list(media)
        self.kind = kind
        self.prompt = prompt
        self.replies: list[str] = []

    @property
    def turns(self) -> int:
        return len(self.media)

    @property
    def next_turn(self) -> int:
        """The turn (from 1) the next request is; turns + 1 once over."""
        return len(self.replies) + 1

    def media_in(self, turn: int) -> dict[str, int]:
        """How many media turn ``turn``'s request carries, by kind."""
        if not 1 <= turn <= self.turns:
            raise ValueError(f"turn {turn} is not one of the conversation's {self.turns}")
        return {self.kind: sum(url is not None for url in self.media[:turn])}

    def messages(self) -> list[dict[str, Any]]:
        """The next turn's request: every earlier turn (its medium, its
        prompt, the answer to it), then this turn's medium and prompt."""
        turn = self.next_turn
        if turn > self.turns:
            raise ValueError(f"the conversation is over after {self.turns} turns")
        part = f"{self.kind}_url"
        out: list[dict[str, Any]] = []
        for n in range(1, turn + 1):
            url = self.media[n - 1]
            content = [] if url is None else [{"type": part, part: {"url": url}}]
            content.append({"type": "text", "text": self.prompt(n)})
            out.append({"role": "user", "content": content})
            if n < turn:
                out.append({"role": "assistant", "content": self.replies[n - 1]})
        return out

    def answered(self, reply: str) -> None:
        """The answer to the turn just sent: part of every later request."""
        if self.next_turn > self.turns:
            raise ValueError(f"the conversation is over after {self.turns} turns")
        self.replies.append(reply)


def video_conversation(video: str, turns: int) -> Conversation:
    """A chat of ``turns`` questions about one video (a ``data:`` URL) sent
    with the first; each later turn adds a question and resends the chat."""
    return Conversation([video, *[None] * (turns - 1)], kind="video", prompt=video_prompt)


def turn_cell(
    *,
    path: str,
    concurrency: int,
    turn: int,
    outcomes: Sequence[Outcome],
    usage: Mapping[str, float],
    has_frontend: bool,
    workload: str = MULTI_TURN,
    media: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """One turn of a workload, path and concurrency, over every
    conversation and round: ``media``, what a request carries by kind
    (default ``turn`` images: the screenshots' workload); ``usage`` holds
    the totals measured across that turn's windows (CPU seconds
    ``api_server``, ``vllm_all``, ``frontend``; ``pixel_bytes`` the
    frontend handed out over NIXL and ``nixl_reads``, the READs the
    plug-in made). Per request: totals over the requests that succeeded;
    None where nothing succeeded or the path has no frontend."""
    succeeded = [o for o in outcomes if o.error is None]
    errors = [o.error for o in outcomes if o.error is not None]
    requests = len(succeeded)

    def per_request(total: float, scale: float = 1.0, *, frontend_only: bool = False) -> float | None:
        if not requests or (frontend_only and not has_frontend):
            return None
        return total * scale / requests

    carried = dict(media) if media is not None else {"image": turn}
    pixel_bytes = usage.get("pixel_bytes", 0.0)
    items = sum(carried.values()) * requests
    return {
        "workload": workload,
        "path": path,
        "concurrency": concurrency,
        "turn": turn,
        "images_per_request": carried.get("image", 0),
        "videos_per_request": carried.get("video", 0),
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
        # The frontend's CPU for taking in the same bodies once more and
        # refusing them (pixelwire.bench.multiturn._taking_in): the floor
        # under its "frontend" above; None where not measured.
        "frontend_floor_ms_per_request": (
            per_request(usage["floor_frontend"], 1e3, frontend_only=True)
            if "floor_frontend" in usage
            else None
        ),
        # What the requests' descriptors refer to (every medium, read or not) ...
        "nixl_pixel_bytes_per_request": per_request(pixel_bytes, frontend_only=True),
        # ... and what crossed: READs (one a medium; a worker-cache hit makes
        # none) times a medium's bytes (the screenshots all have one size).
        "nixl_reads_per_request": per_request(usage.get("nixl_reads", 0.0), frontend_only=True),
        "nixl_read_bytes_per_request": per_request(
            usage.get("nixl_reads", 0.0) * pixel_bytes / items if items else 0.0, frontend_only=True
        ),
    }


def cell_workload(cell: Mapping[str, Any]) -> str:
    """The workload a turn cell is of (cells written before the video
    workload have no key: screenshots)."""
    return str(cell.get("workload", MULTI_TURN))


def turn_ratios(cells: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per workload, path and concurrency: the last turn's CPU ms per
    request of the API server and of the frontend over the first turn's
    (None where a side has no value or the first turn's is 0)."""
    out: list[dict[str, Any]] = []
    groups: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell_workload(cell), cell["path"], cell["concurrency"]), []).append(cell)
    for (workload, path, concurrency), chosen in groups.items():
        first = min(chosen, key=lambda c: c["turn"])
        last = max(chosen, key=lambda c: c["turn"])
        ratios: dict[str, float | None] = {}
        for part in ("api_server", "frontend"):
            a, b = first["cpu_ms_per_request"][part], last["cpu_ms_per_request"][part]
            ratios[part] = b / a if a and b is not None else None
        out.append(
            {
                "workload": workload,
                "path": path,
                "concurrency": concurrency,
                "first_turn": first["turn"],
                "last_turn": last["turn"],
                "cpu_ratio": ratios,
            }
        )
    return out
