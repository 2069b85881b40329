"""Video decoding shared among clients, seen through a real frontend: while
one client's video bombs decode (1,500 1080p frames each, claiming 1.5 ms),
another client's 5 s video and 640x480 image are served, not queued behind
them, whether the bomb's client waits for its answers or leaves."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import stack
import video_turns
from frontend_client import p99_ms, post_from, started_frontend, victim_rounds, video_chat
from loopback_servers import Upstream

# The victim connects from another loopback address: another client.
VICTIM_ADDRESS = "127.0.0.2"
BOMBS_AT_ONCE = 3


@pytest.fixture(scope="module")
def video_frontend(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.Service]:
    """A frontend that decodes videos as vLLM's opencv loader samples them
    (8 frames), with its defaults otherwise."""
    video_kwargs = json.dumps({"video": {"video_backend": "opencv", "num_frames": 8}})
    service = started_frontend(
        tmp_path_factory.mktemp("turns"), upstream.url, "--media-io-kwargs", video_kwargs
    )
    yield service
    service.stop()


class _Attack:
    """``BOMBS_AT_ONCE`` loops sending the bomb from 127.0.0.1, the n-th
    starting ``n * stagger`` seconds in, each request's (start, end) kept;
    with ``leave_after`` the client hangs up that many seconds into each
    request."""

    def __init__(
        self, service: stack.Service, bomb: bytes, leave_after: float | None, stagger: float = 0.0
    ) -> None:
        self.body = video_chat(bomb)
        self.service = service
        self.leave_after = leave_after
        self.stagger = stagger
        self.spans: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(n,)) for n in range(BOMBS_AT_ONCE)]

    def _loop(self, n: int) -> None:
        # Senders that start together end together (they take turns).
        if self.stop.wait(n * self.stagger):
            return
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                post_from(self.service, self.body, "127.0.0.1", self.leave_after or 120)
            except (TimeoutError, OSError):
                pass  # the attacker left
            self.spans.append((started, time.monotonic()))

    def __enter__(self) -> _Attack:
        for thread in self.threads:
            thread.start()
        # Every loop has a bomb decoding or waiting.
        time.sleep(1.0 + (BOMBS_AT_ONCE - 1) * self.stagger)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(180)


@pytest.mark.parametrize("attacker", ["waits", "leaves"])
def test_a_clients_video_bombs_do_not_queue_another_clients_video(
    video_frontend: stack.Service, video_bomb: dict[str, bytes], attacker: str, tmp_path: Path
) -> None:
    """A victim's video sent while some bomb had far more left to decode
    than the victim needs is answered before that bomb ends: it took its
    turns among them rather than queueing behind them (first come, first
    served, every bomb sent before it would end first; see
    :mod:`video_turns`); when the attacker waits (its senders a quiet bomb
    apart), at least two of six are judged. Its p99 against an unloaded run
    is printed."""
    victim_clip = video_bomb["h264_720p_5s.mp4"]
    victim_rounds(
        video_frontend, victim_clip, VICTIM_ADDRESS, rounds=1
    )  # the first READ sets up NIXL's connection
    quiet = victim_rounds(video_frontend, victim_clip, VICTIM_ADDRESS, rounds=4)
    bomb = video_bomb["h264_1080p_million_fps_bomb.mp4"]
    leave_after = 0.5 if attacker == "leaves" else None
    stagger = 0.0
    if attacker == "waits":
        started = time.monotonic()
        assert post_from(video_frontend, video_chat(bomb), "127.0.0.1", 120) == 201
        stagger = time.monotonic() - started
    with _Attack(video_frontend, bomb, leave_after, stagger) as attack:
        loaded = victim_rounds(video_frontend, victim_clip, VICTIM_ADDRESS, rounds=6 if stagger else 4)
    judged = video_turns.turns(quiet["video"], loaded["video"], attack.spans)
    if attacker == "waits":
        judged.check(2, attack.spans)
    assert attack.spans, "no bomb was sent"
    ratios = {kind: p99_ms(loaded[kind]) / p99_ms(quiet[kind]) for kind in quiet}
    print(
        f"\n  attacker {attacker}: victim p99 quiet/loaded "
        + ", ".join(f"{kind} {p99_ms(quiet[kind]):.0f}/{p99_ms(loaded[kind]):.0f} ms" for kind in quiet)
        + f" ({', '.join(f'{kind} {ratio:.2f}x' for kind, ratio in ratios.items())}); "
        f"{len(attack.spans)} bombs sent; {judged}"
    )
