"""The multi-turn workloads' conversations and per-turn figures
(`python/pixelwire/bench/conversation.py`): what turn k sends (screenshots,
or one video resent), and what a turn's cell and the last-over-first
ratios are made of. No servers."""

from __future__ import annotations

from typing import Any

import pytest

from pixelwire.bench.conversation import Conversation, turn_cell, turn_ratios, video_conversation
from pixelwire.bench.load import Outcome

SCREENS = ["data:image/png;base64,AAAA", "data:image/png;base64,BBBB", "data:image/png;base64,CCCC"]
VIDEO = "data:video/mp4;base64,AAAAIGZ0eXA="


def _media(messages: list[dict[str, Any]], kind: str = "image") -> list[str]:
    """The URLs of ``kind`` the user messages carry, in order."""
    return [
        part[f"{kind}_url"]["url"]
        for message in messages
        if message["role"] == "user"
        for part in message["content"]
        if part["type"] == f"{kind}_url"
    ]


def _images(messages: list[dict[str, Any]]) -> list[str]:
    return _media(messages, "image")


def test_turn_k_resends_every_earlier_screenshot_and_answer_with_one_new() -> None:
    """Turn k: k user messages (screenshots 1..k, in order, the same URLs
    each time) with the k - 1 answers between them, ending on a user turn."""
    conversation = Conversation(SCREENS)
    for turn in (1, 2, 3):
        messages = conversation.messages()
        assert conversation.next_turn == turn
        assert _images(messages) == SCREENS[:turn]
        assert [m["role"] for m in messages] == ["user", "assistant"] * (turn - 1) + ["user"]
        assert [m["content"] for m in messages if m["role"] == "assistant"] == [
            f"answer {n}" for n in range(1, turn)
        ]
        assert conversation.media_in(turn) == {"image": turn}
        conversation.answered(f"answer {turn}")
    assert conversation.next_turn == 4


def test_a_video_chat_sends_its_video_with_turn_1_and_resends_it_with_every_turn() -> None:
    """Turn k of a chat about one video: k user messages, the first with
    the video (the same URL each turn) and a question, the others a
    question each, with the k - 1 answers between them; no image at all."""
    conversation = video_conversation(VIDEO, 4)
    assert conversation.turns == 4
    for turn in range(1, 5):
        messages = conversation.messages()
        assert _media(messages, "video") == [VIDEO] and _images(messages) == []
        users = [m for m in messages if m["role"] == "user"]
        assert len(users) == turn
        assert users[0]["content"][0] == {"type": "video_url", "video_url": {"url": VIDEO}}
        texts = [part["text"] for m in users for part in m["content"] if part["type"] == "text"]
        assert len(texts) == turn and len(set(texts)) == turn
        assert [m["content"] for m in messages if m["role"] == "assistant"] == [
            f"answer {n}" for n in range(1, turn)
        ]
        assert conversation.media_in(turn) == {"video": 1}
        conversation.answered(f"answer {turn}")


def test_a_conversation_refuses_a_turn_past_its_last_and_an_empty_start() -> None:
    """Past its screenshots a conversation has no next request; it needs at least one."""
    conversation = Conversation(SCREENS[:1])
    conversation.messages()
    conversation.answered("done")
    with pytest.raises(ValueError, match="over after 1 turns"):
        conversation.messages()
    with pytest.raises(ValueError, match="over after 1 turns"):
        conversation.answered("again")
    with pytest.raises(ValueError, match="at least one"):
        Conversation([])
    with pytest.raises(ValueError, match="images or videos"):
        Conversation(SCREENS, kind="audio")
    with pytest.raises(ValueError, match="not one of"):
        conversation.media_in(2)


def _usage(api: float, frontend: float, pixel_bytes: float, reads: float) -> dict[str, float]:
    return {
        "api_server": api,
        "vllm_all": api * 3,
        "frontend": frontend,
        "pixel_bytes": pixel_bytes,
        "nixl_reads": reads,
    }


def test_a_turn_cell_divides_the_turns_totals_by_its_successful_requests() -> None:
    """Turn 3 of 2 conversations, one request failed: CPU, bytes and READs
    per successful request; what crossed NIXL is READs times an image's
    bytes; latency percentiles over the successes; the failure sampled."""
    outcomes = [Outcome(0.2, 0.1, None), Outcome(0.4, 0.3, None), Outcome(9.0, None, "HTTP 500: x")]
    # 2 requests of 3 images, 6 images of 100 bytes referred to, 2 read.
    cell = turn_cell(
        path="frontend-resize",
        concurrency=2,
        turn=3,
        outcomes=outcomes,
        usage=_usage(0.05, 0.03, 600.0, 2.0),
        has_frontend=True,
    )
    assert (cell["requests"], cell["errors"], cell["error_samples"]) == (3, 1, ["HTTP 500: x"])
    assert cell["workload"] == "multi-turn"
    assert (cell["images_per_request"], cell["videos_per_request"]) == (3, 0)
    assert cell["cpu_ms_per_request"] == pytest.approx(
        {"api_server": 25.0, "vllm_all": 75.0, "frontend": 15.0}
    )
    assert cell["nixl_pixel_bytes_per_request"] == pytest.approx(300.0)
    assert cell["nixl_reads_per_request"] == pytest.approx(1.0)
    assert cell["nixl_read_bytes_per_request"] == pytest.approx(100.0)
    assert cell["latency_ms"]["p50"] == pytest.approx(200.0)
    assert cell["latency_ms"]["p99"] == pytest.approx(400.0)
    assert cell["ttft_ms"]["p50"] == pytest.approx(100.0)


def test_a_turn_cell_gives_the_frontends_floor_per_request_where_it_was_measured() -> None:
    """The frontend's CPU for taking in the turn's bodies once more (the
    floor under its own CPU), per successful request; None where the run
    measured none."""
    outcomes = [Outcome(0.2, 0.1, None), Outcome(0.4, 0.3, None)]
    measured = {**_usage(0.05, 0.03, 0.0, 0.0), "floor_frontend": 0.01}
    cell = turn_cell(
        path="worker", concurrency=2, turn=2, outcomes=outcomes, usage=measured, has_frontend=True
    )
    assert cell["frontend_floor_ms_per_request"] == pytest.approx(5.0)
    cell = turn_cell(
        path="worker", concurrency=2, turn=2, outcomes=outcomes, usage=_usage(0.05, 0.03, 0.0, 0.0),
        has_frontend=True,
    )  # fmt: skip
    assert cell["frontend_floor_ms_per_request"] is None


def test_a_video_turn_cell_counts_one_video_a_request_and_its_frames_once() -> None:
    """Turn 3 of the video chats, 2 requests: no image, one video a
    request; the frames crossed are READs times one video's frame bytes."""
    outcomes = [Outcome(0.2, 0.1, None), Outcome(0.4, 0.3, None)]
    # 2 requests, each referring to a video of 1000 frame bytes; 1 READ in all.
    cell = turn_cell(
        path="frontend",
        concurrency=2,
        turn=3,
        outcomes=outcomes,
        usage=_usage(0.05, 0.03, 2000.0, 1.0),
        has_frontend=True,
        workload="multi-turn-video",
        media={"video": 1},
    )
    assert cell["workload"] == "multi-turn-video"
    assert (cell["images_per_request"], cell["videos_per_request"]) == (0, 1)
    assert cell["nixl_pixel_bytes_per_request"] == pytest.approx(1000.0)
    assert cell["nixl_read_bytes_per_request"] == pytest.approx(500.0)
    assert cell["cpu_ms_per_request"]["frontend"] == pytest.approx(15.0)


def test_a_turn_cell_without_a_frontend_or_a_success_has_no_per_request_figures() -> None:
    """vLLM's loader has no frontend: its frontend and NIXL figures are
    None; a turn where every request failed has no per-request figure."""
    loader = turn_cell(
        path="loader",
        concurrency=1,
        turn=1,
        outcomes=[Outcome(0.1, 0.05, None)],
        usage=_usage(0.01, 0.0, 0.0, 0.0),
        has_frontend=False,
    )
    assert loader["cpu_ms_per_request"]["frontend"] is None
    assert loader["nixl_pixel_bytes_per_request"] is None and loader["nixl_read_bytes_per_request"] is None
    failed = turn_cell(
        path="worker",
        concurrency=1,
        turn=2,
        outcomes=[Outcome(1.0, None, "empty stream")],
        usage=_usage(0.01, 0.01, 0.0, 0.0),
        has_frontend=True,
    )
    assert failed["cpu_ms_per_request"] == {"api_server": None, "vllm_all": None, "frontend": None}
    assert failed["latency_ms"]["p50"] is None


def _cell(
    path: str,
    concurrency: int,
    turn: int,
    api: float | None,
    frontend: float | None,
    workload: str | None = None,
) -> dict[str, Any]:
    # No workload: a cell as the screenshots' workload wrote it before the video one.
    return {
        **({"workload": workload} if workload else {}),
        "path": path,
        "concurrency": concurrency,
        "turn": turn,
        "cpu_ms_per_request": {"api_server": api, "frontend": frontend},
    }


def test_turn_ratios_are_the_last_turn_over_the_first_per_path_and_concurrency() -> None:
    """Whatever the cells' order; None where a side has no figure or turn 1's is 0."""
    cells = [
        _cell("loader", 1, 8, 80.0, None),
        _cell("frontend-resize", 1, 1, 10.0, 20.0),
        _cell("loader", 1, 1, 10.0, None),
        _cell("frontend-resize", 1, 8, 12.0, 25.0),
        _cell("frontend-resize", 4, 1, 0.0, 20.0),
        _cell("frontend-resize", 4, 4, 5.0, 10.0),
    ]
    ratios = {(r["path"], r["concurrency"]): r for r in turn_ratios(cells)}
    assert ratios[("loader", 1)]["cpu_ratio"] == {"api_server": pytest.approx(8.0), "frontend": None}
    assert ratios[("frontend-resize", 1)]["cpu_ratio"] == pytest.approx({"api_server": 1.2, "frontend": 1.25})
    four = ratios[("frontend-resize", 4)]
    assert (four["first_turn"], four["last_turn"]) == (1, 4)
    assert four["cpu_ratio"] == {"api_server": None, "frontend": pytest.approx(0.5)}


def test_turn_ratios_keep_the_video_chats_apart_from_the_screenshots() -> None:
    """The same path and concurrency in both workloads: a ratio each, of
    its own cells (a cell without a workload is the screenshots')."""
    cells = [
        _cell("worker", 1, 1, 10.0, 4.0),
        _cell("worker", 1, 4, 12.0, 5.0),
        _cell("worker", 1, 1, 1000.0, 40.0, "multi-turn-video"),
        _cell("worker", 1, 4, 50.0, 2.0, "multi-turn-video"),
    ]
    ratios = {r["workload"]: r for r in turn_ratios(cells)}
    assert set(ratios) == {"multi-turn", "multi-turn-video"}
    assert ratios["multi-turn"]["cpu_ratio"] == pytest.approx({"api_server": 1.2, "frontend": 1.25})
    assert ratios["multi-turn-video"]["cpu_ratio"] == pytest.approx({"api_server": 0.05, "frontend": 0.05})
