"""The multi-turn workloads of `pixelwire bench serve`: agent conversations
whose turn k resends the k - 1 earlier screenshots with a new one, and
chats about one video sent with the first turn and resent with every later
one (``pixelwire.bench.conversation``), on servers of their own with every
cache on (vLLM's processor and prefix caches, the frontend's and the
worker's), since repeats are what it measures; a path's servers are up only
for its own turns (``pixelwire.bench.serve.measure_multi_turn``).

Per path and number of concurrent conversations, ``rounds`` sets of
conversations run one after the other; within a set they advance a turn at
a time, and the servers' CPU and counters are read at each turn's
barriers. Each conversation has screenshots (or a video) of its own (no
cache is shared across conversations, rounds or paths: only a
conversation's own repeats hit).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from pixelwire.bench.conversation import Conversation, turn_cell, video_conversation
from pixelwire.bench.inputs import MULTI_TURN, MULTI_TURN_VIDEO
from pixelwire.bench.load import Outcome, new_client, openai_module, stream_chat, warm_up

# Seeds of the screenshots: far from the photos' and any test's.
FIRST_SEED = 1_000_000


class Screenshots:
    """A fresh 1080p PNG screenshot as a ``data:`` URL on each call."""

    kind = "image"

    def __init__(self) -> None:
        self._seeds: Iterator[int] = itertools.count(FIRST_SEED)

    def __call__(self) -> str:
        from pixelwire.bench.inputs import data_url, screenshot

        return data_url(screenshot(next(self._seeds)), "image/png")

    def conversation(self, turns: int) -> Conversation:
        return Conversation([self() for _ in range(turns)])


class Videos:
    """The run's video as a ``data:`` URL, bytes of its own on each call
    (``pixelwire.bench.inputs.distinct_video``): the same frames, another
    cache key."""

    kind = "video"

    def __init__(self, video: bytes) -> None:
        self._video = video
        self._seeds: Iterator[int] = itertools.count(FIRST_SEED)

    def __call__(self) -> str:
        from pixelwire.bench.inputs import data_url, distinct_video

        return data_url(distinct_video(self._video, next(self._seeds)), "video/mp4")

    def conversation(self, turns: int) -> Conversation:
        return video_conversation(self(), turns)


def media_for(workload: str, video: bytes | None) -> Screenshots | Videos:
    """What a multi-turn workload's conversations send."""
    if workload == MULTI_TURN:
        return Screenshots()
    if workload == MULTI_TURN_VIDEO:
        if video is None:
            raise ValueError(f"the {workload} workload needs a video")
        return Videos(video)
    raise ValueError(f"{workload!r} is not a multi-turn workload")


def usage(vllm: Any, frontend: Any, *, opening: bool) -> dict[str, Any]:
    """CPU seconds of the API server, of all vLLM and of the frontend; the
    frontend's NIXL pixel bytes (images' and videos' frames) and the
    plug-in's READs so far. The
    scrapes of /metrics stay outside the window (before the CPU times when
    it opens, after them when it closes): their CPU is not a turn's."""
    from pixelwire.bench.services import CpuReading, cpu_seconds, metric_sum

    def scrape() -> dict[str, float]:
        if frontend is None:
            return {"pixel_bytes": 0.0, "nixl_reads": 0.0}
        front, worker = frontend.get("/metrics"), vllm.get("/metrics")
        frames = metric_sum(front, "pixelwire_frontend_video_frame_bytes_total", path="nixl")
        return {
            "pixel_bytes": metric_sum(front, "pixelwire_frontend_pixel_bytes_total", path="nixl") + frames,
            "nixl_reads": metric_sum(worker, "pixelwire_worker_decode_seconds_count", path="nixl"),
        }

    def cpu() -> dict[str, Any]:
        # CpuReadings: a later one minus an earlier one is seconds
        return {
            "api_server": cpu_seconds(vllm.pid),
            "vllm_all": cpu_seconds(vllm.pid, with_descendants=True),
            "frontend": cpu_seconds(frontend.pid, with_descendants=True) if frontend else CpuReading(0.0),
        }

    if opening:
        counts = scrape()
        return {**counts, **cpu()}
    times = cpu()
    return {**times, **scrape()}


async def run_round(
    base_url: str,
    model: str,
    conversations: list[Conversation],
    *,
    max_tokens: int,
    measure: Callable[[bool], dict[str, Any]],
    on_turn: Callable[[int, list[Outcome], dict[str, float]], None],
    floor: bool = False,
) -> None:
    """The conversations, each with its own client, a turn at a time:
    ``on_turn(turn, outcomes, usage)`` gets each turn's outcomes and what
    ``measure`` saw change across it; with ``floor``, the usage's
    ``floor_frontend`` is the frontend's CPU for taking in the same bodies
    once more (:func:`_taking_in`). A failed turn is answered with nothing
    and the conversation goes on."""
    clients = [new_client(base_url) for _ in conversations]
    try:
        for turn in range(1, conversations[0].turns + 1):
            before = measure(True)
            answers = await asyncio.gather(
                *(
                    stream_chat(client, model, conversation.messages(), max_tokens)
                    for client, conversation in zip(clients, conversations, strict=True)
                )
            )
            after = measure(False)
            used = {k: after[k] - before[k] for k in after}
            if floor:
                used["floor_frontend"] = await _taking_in(clients, model, conversations, measure)
            for conversation, (_, reply) in zip(conversations, answers, strict=True):
                conversation.answered(reply)
            on_turn(turn, [outcome for outcome, _ in answers], used)
    finally:
        for client in clients:
            await client.close()


async def _taking_in(
    clients: list[Any],
    model: str,
    conversations: list[Conversation],
    measure: Callable[[bool], dict[str, Any]],
) -> float:
    """The frontend's CPU seconds for receiving and scanning each of the
    turn's bodies once more, and no other work: each is sent with an empty
    ``cache_salt``, which the frontend refuses (400) once it has read and
    parsed the body, before it looks at any medium or sends anything
    upstream. The floor under what a turn's request costs it."""
    openai = openai_module()

    async def refused(client: Any, conversation: Conversation) -> None:
        try:
            await client.chat.completions.create(
                model=model, messages=conversation.messages(), max_tokens=1, extra_body={"cache_salt": ""}
            )
        except openai.BadRequestError:
            return
        raise RuntimeError("the frontend took a request with an empty cache_salt")

    before = measure(True)
    await asyncio.gather(
        *(refused(c, conversation) for c, conversation in zip(clients, conversations, strict=True))
    )
    after = measure(False)
    return float(after["frontend"] - before["frontend"])


def measure_turns(
    stack: Any, settings: Any, model: str, progress: Any, video: bytes | None = None
) -> list[dict[str, Any]]:
    """Every multi-turn workload the run has (``video``: what the video
    one sends), path and number of conversations: a cell per turn
    (``pixelwire.bench.conversation.turn_cell``)."""
    cells: list[dict[str, Any]] = []
    for workload in settings.turn_workloads():
        media = media_for(workload, video)
        for concurrency in settings.conversations:
            for path in settings.paths:
                progress.start_cell(f"{workload} ({settings.turns} turns) c={concurrency} {path}")
                if concurrency == settings.conversations[0] and settings.warm_up:
                    warm = [(media.kind, media()) for _ in range(settings.warm_up)]
                    asyncio.run(
                        warm_up(stack.base_url[path], model, warm, requests=settings.warm_up, within_s=120)
                    )
                cells += _measure_path(stack, settings, model, path, concurrency, workload, media, progress)
                progress.end_cell()
    return cells


def _measure_path(
    stack: Any,
    settings: Any,
    model: str,
    path: str,
    concurrency: int,
    workload: str,
    media: Screenshots | Videos,
    progress: Any,
) -> list[dict[str, Any]]:
    vllm, frontend = stack.servers[path]
    outcomes: dict[int, list[Outcome]] = {}
    totals: dict[int, dict[str, float]] = {}

    def on_turn(turn: int, done: list[Outcome], used: dict[str, float]) -> None:
        outcomes.setdefault(turn, []).extend(done)
        kept = totals.setdefault(turn, {})
        for key, value in used.items():
            kept[key] = kept.get(key, 0.0) + value
        for outcome in done:
            progress.request_done(outcome)

    def measure(opening: bool) -> dict[str, Any]:
        return usage(vllm, frontend, opening=opening)

    made: list[Conversation] = []
    for _ in range(settings.rounds):
        # Made before the round: not in any turn's window.
        conversations = [media.conversation(settings.turns) for _ in range(concurrency)]
        made += conversations
        asyncio.run(
            run_round(
                stack.base_url[path],
                model,
                conversations,
                max_tokens=settings.max_tokens,
                measure=measure,
                on_turn=on_turn,
                floor=frontend is not None,
            )
        )
    return [
        turn_cell(
            path=path,
            concurrency=concurrency,
            turn=turn,
            outcomes=outcomes[turn],
            usage=totals[turn],
            has_frontend=frontend is not None,
            workload=workload,
            media=made[0].media_in(turn),
        )
        for turn in sorted(outcomes)
    ]
