"""The load generator: streaming chat completions with one image each, from
``concurrency`` clients of the official ``openai`` async client, until a
time bound or a request count is reached (requests in flight at the time
bound finish and count); and one streamed chat of any messages (the
multi-turn workload's turns)."""

from __future__ import annotations

import asyncio
import importlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

PROMPT = "Describe the image in one short sentence."


@dataclass(frozen=True)
class Outcome:
    latency_s: float
    # The first streamed chunk: vLLM sends it once the first token is out.
    ttft_s: float | None
    error: str | None  # None: a streamed answer with at least one chunk


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """Nearest-rank p50/p90/p99 of seconds, in milliseconds; None without values."""
    ordered = sorted(values)
    out: dict[str, float | None] = {}
    for name, q in (("p50", 0.50), ("p90", 0.90), ("p99", 0.99)):
        if not ordered:
            out[name] = None
        else:
            rank = max(1, -(-len(ordered) * q // 1))  # ceil(n * q)
            out[name] = ordered[int(rank) - 1] * 1e3
    return out


def openai_module() -> Any:
    """The ``openai`` package (the vLLM environment has it)."""
    try:
        return importlib.import_module("openai")
    except ImportError as error:
        raise SystemExit(
            "pixelwire bench serve needs the `openai` package (pip install openai); "
            "run it in vLLM's environment"
        ) from error


def new_client(base_url: str) -> Any:
    return openai_module().AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)


async def one_request(client: Any, model: str, medium: tuple[str, str], max_tokens: int) -> Outcome:
    """One streamed completion about ``medium``: (kind, URL), kind "image" or "video"."""
    kind, url = medium
    part = f"{kind}_url"
    content = [{"type": part, part: {"url": url}}, {"type": "text", "text": PROMPT}]
    outcome, _reply = await stream_chat(client, model, [{"role": "user", "content": content}], max_tokens)
    return outcome


async def stream_chat(
    client: Any, model: str, messages: list[dict[str, Any]], max_tokens: int
) -> tuple[Outcome, str]:
    """One streamed completion of ``messages``: its outcome and the text
    it streamed (what a chat client appends as the assistant's turn)."""
    openai = openai_module()
    started = time.perf_counter()
    first: float | None = None
    reply: list[str] = []
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            # Every request generates max_tokens tokens, whatever the model says.
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            if first is None:
                first = time.perf_counter()
            if chunk.choices and chunk.choices[0].delta.content:
                reply.append(chunk.choices[0].delta.content)
    except openai.APIStatusError as error:
        body = error.body.get("message") if isinstance(error.body, dict) else None
        return Outcome(time.perf_counter() - started, None, f"HTTP {error.status_code}: {body or error}"), ""
    except openai.APIError as error:
        return Outcome(time.perf_counter() - started, None, f"{type(error).__name__}: {error}"), ""
    ended = time.perf_counter()
    if first is None:
        return Outcome(ended - started, None, "empty stream"), ""
    return Outcome(ended - started, first - started, None), "".join(reply)


async def run_load(
    base_url: str,
    model: str,
    media: list[tuple[str, str]],
    *,
    concurrency: int,
    duration_s: float,
    max_requests: int,
    max_tokens: int,
    on_done: Callable[[Outcome], None] = lambda _: None,
) -> tuple[list[Outcome], float]:
    """Runs ``concurrency`` clients, each sending the next medium (kind, URL)
    in turn (they cycle) until ``duration_s`` has passed or ``max_requests`` were
    sent; returns the outcomes and the wall time from the first request to
    the last answer."""
    turns = itertools.count()
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    deadline = started + duration_s

    async def client_loop() -> None:
        async with new_client(base_url) as client:
            while time.perf_counter() < deadline:
                turn = next(turns)
                if turn >= max_requests:
                    return
                outcome = await one_request(client, model, media[turn % len(media)], max_tokens)
                outcomes.append(outcome)
                on_done(outcome)

    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    return outcomes, time.perf_counter() - started


async def warm_up(
    base_url: str, model: str, media: list[tuple[str, str]], *, requests: int, within_s: float
) -> None:
    """Sends ``requests`` requests one by one; retries failures (a frontend
    answers 502 until it has seen vLLM's plug-in) until ``within_s``."""
    deadline = time.monotonic() + within_s
    async with new_client(base_url) as client:
        done = 0
        last_error = ""
        while done < requests:
            outcome = await one_request(client, model, media[done % len(media)], max_tokens=1)
            if outcome.error is None:
                done += 1
                continue
            last_error = outcome.error
            if time.monotonic() > deadline:
                raise RuntimeError(f"warm-up requests to {base_url} keep failing: {last_error}")
            await asyncio.sleep(1.0)
