"""What the multi-turn workloads' conversations send
(`python/pixelwire/bench/multiturn.py`): a video of bytes of its own for
every conversation, and a typed error for a workload it cannot make. No
servers."""

from __future__ import annotations

import base64

import pytest

from pixelwire.bench.multiturn import Screenshots, Videos, media_for

# The first box of an MP4: all that distinct_video looks at.
MP4 = (16).to_bytes(4, "big") + b"ftypisom" + bytes(4)


def test_every_video_conversation_sends_the_video_with_bytes_of_its_own() -> None:
    """Two conversations: two data: URLs, each the MP4 with something
    appended, neither the other's; each resends its own with every turn."""
    videos = media_for("multi-turn-video", MP4)
    assert isinstance(videos, Videos) and videos.kind == "video"
    chats = [videos.conversation(3), videos.conversation(3)]
    urls = [chat.media[0] for chat in chats]
    assert all(url is not None and url.startswith("data:video/mp4;base64,") for url in urls)
    sent = [base64.b64decode(url.split(",", 1)[1]) for url in urls if url is not None]
    assert sent[0] != sent[1] and all(data.startswith(MP4) and data != MP4 for data in sent)
    assert all(chat.media[1:] == [None, None] for chat in chats)


def test_the_screenshots_workload_sends_a_new_screenshot_a_turn() -> None:
    screenshots = media_for("multi-turn", None)
    assert isinstance(screenshots, Screenshots) and screenshots.kind == "image"


def test_a_workload_that_cannot_be_made_is_a_value_error() -> None:
    """The video chats without a video, or a workload that is not multi-turn."""
    with pytest.raises(ValueError, match="needs a video"):
        media_for("multi-turn-video", None)
    with pytest.raises(ValueError, match="not a multi-turn workload"):
        media_for("mixed", MP4)
