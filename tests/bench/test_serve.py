"""`pixelwire bench serve`'s settings (`python/pixelwire/bench/serve.py`),
as parsed from its command line: the multi-turn workload's defaults, what
it refuses, and which vLLM flags each set of servers gets. No servers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pixelwire import cli
from pixelwire.bench.serve_settings import Settings
from pixelwire.bench.serve_stack import vllm_flags


def _settings(*argv: str) -> Settings:
    args = cli.build_parser(["bench", "serve"]).parse_args(["bench", "serve", "--model", "m", *argv])
    return Settings.from_args(args)


def test_the_multi_turn_defaults_are_8_turns_1_and_4_conversations_3_rounds_caches_on() -> None:
    """As the issue asks; --quick runs one round."""
    settings = _settings()
    assert (settings.turns, settings.conversations, settings.rounds) == (8, [1, 4], 3)
    assert settings.multi_turn_caches
    assert _settings("--quick").rounds == 1
    assert _settings("--conversations", "4", "1", "4", "--multi-turn-caches", "off").conversations == [1, 4]
    assert not _settings("--multi-turn-caches", "off").multi_turn_caches


def test_the_multi_turn_workloads_run_screenshots_first_whatever_the_order_asked() -> None:
    """--workloads picks the multi-turn ones among the others; they run in one order."""
    picked = _settings("--workloads", "multi-turn-video", "jpeg-4k-data", "multi-turn")
    assert picked.turn_workloads() == ["multi-turn", "multi-turn-video"]
    assert _settings("--workloads", "video-data", "multi-turn-video").turn_workloads() == ["multi-turn-video"]
    assert _settings("--workloads", "mixed").turn_workloads() == []


@pytest.mark.parametrize("argv", [["--turns", "0"], ["--rounds", "-1"], ["--conversations", "1", "x"]])
def test_a_count_below_one_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Not a conversation of no turns (which would fail once the servers are up): exit 2 at once."""
    with pytest.raises(SystemExit) as exited:
        _settings(*argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err and ("less than 1" in err or "not a whole number" in err), err


def test_the_image_servers_turn_vllms_caches_off_and_the_multi_turn_ones_leave_them_on() -> None:
    """The image workloads: one image (and a video) a request, processor and
    prefix caches off; the multi-turn servers: as many images as turns, no
    video, vLLM's caches as they come."""
    off = vllm_flags(caches=False, images=1)
    assert json.loads(off[off.index("--limit-mm-per-prompt") + 1]) == {"image": 1, "video": 1}
    assert "--no-enable-prefix-caching" in off and off[off.index("--mm-processor-cache-gb") + 1] == "0"
    on = vllm_flags(caches=True, images=8)
    assert json.loads(on[on.index("--limit-mm-per-prompt") + 1]) == {"image": 8, "video": 0}
    assert not any("cach" in flag for flag in on)
    # The multi-turn video chats' servers: one video a request, caches as they come.
    video = vllm_flags(caches=True, images=8, videos=1)
    assert json.loads(video[video.index("--limit-mm-per-prompt") + 1]) == {"image": 8, "video": 1}
    assert not any("cach" in flag for flag in video)


def test_the_approximate_resize_is_off_unless_asked_for() -> None:
    """--resize-approximate (the resizing frontend's flag, and the plug-in's
    variable) is off by default, as in the frontend."""
    assert not _settings().resize_approximate
    assert _settings("--resize-approximate").resize_approximate


@pytest.mark.parametrize(
    ("workloads", "videos"), [(["multi-turn"], 0), (["multi-turn", "multi-turn-video"], 1)]
)
def test_the_multi_turn_paths_run_one_at_a_time_on_servers_of_their_own(
    monkeypatch: pytest.MonkeyPatch, workloads: list[str], videos: int
) -> None:
    """Each path's servers are started for its own turns and stopped before
    the next path's start: while a path is measured, no other path's
    servers are up (their idle threads would share the machine with it).
    They take a video a request only where the video chats run."""
    from pixelwire.bench import multiturn, serve

    running: list[list[str]] = []
    measured: list[tuple[str, list[list[str]]]] = []

    class FakeStack:
        def __init__(self, settings: Settings, *args: object, caches: bool, images: int, videos: int) -> None:
            assert caches and images == settings.turns
            self.videos = videos
            self.paths = list(settings.paths)
            self.services = self.paths

        def wait_ready(self, timeout: float) -> None:
            running.append(self.paths)

        def stop(self) -> None:
            running.remove(self.paths)

    def fake_measure(stack: FakeStack, settings: Settings, *rest: object) -> list[dict[str, Any]]:
        assert stack.videos == videos and settings.turn_workloads() == workloads
        measured.append((settings.paths[0], [list(p) for p in running]))
        return [{"path": settings.paths[0]}]

    monkeypatch.setattr(serve, "Stack", FakeStack)
    monkeypatch.setattr(multiturn, "measure_turns", fake_measure)
    settings = _settings(
        "--paths", "loader", "frontend-resize", "worker", "--workloads", *reversed(workloads)
    )
    network = type("Network", (), {"host_address": "127.0.0.1"})()
    environment: dict[str, object] = {}
    cells = serve.measure_multi_turn(settings, network, None, 1.0, environment)
    assert [c["path"] for c in cells] == ["loader", "frontend-resize", "worker"]
    assert measured == [(p, [[p]]) for p in ("loader", "frontend-resize", "worker")]
    assert running == [] and "multi_turn_startup_s" in environment
