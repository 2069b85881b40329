"""pixelwire.media_parts: which parts of a request body vLLM would load
media for, with the client's cache keys taken out, in work and memory
linear in the body."""

from __future__ import annotations

import json
import time
import tracemalloc
from typing import Any

import pytest

from pixelwire.media_parts import MediaPartRefused, foreign_media, media_parts
from pixelwire.signing import encode_reference


def _body(*content: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": list(content)}]}


def test_every_url_medium_is_found_as_vllm_reads_it() -> None:
    body = _body(
        {"type": "image_url", "image_url": {"url": "https://a/1.png"}},
        {"type": "input_image", "image_url": "https://a/2.png"},
        {"type": "video_url", "video_url": {"url": "https://a/3.mp4"}},
        {"type": "audio_url", "audio_url": {"url": "https://a/4.wav"}},
        {"video_url": "https://a/5.mp4"},  # untyped: vLLM reads the first media key
        {"audio_url": {"url": "https://a/6.wav"}},
        # Inline audio: the data: URL vLLM makes of it, as an audio_url part.
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
        {"type": "text", "text": "hi", "video_url": {"url": "https://b/never.mp4"}},  # read as text
    )
    found = [(p.where, p.kind, p.url) for p in media_parts(body)]
    assert found == [
        ("messages[0].content[0]", "image", "https://a/1.png"),
        ("messages[0].content[1]", "image", "https://a/2.png"),
        ("messages[0].content[2]", "video", "https://a/3.mp4"),
        ("messages[0].content[3]", "audio", "https://a/4.wav"),
        ("messages[0].content[4]", "video", "https://a/5.mp4"),
        ("messages[0].content[5]", "audio", "https://a/6.wav"),
        ("messages[0].content[6]", "audio", "data:audio/wav;base64,AAAA"),
    ]
    assert body["messages"][0]["content"][6] == {
        "type": "audio_url",
        "audio_url": {"url": "data:audio/wav;base64,AAAA"},
    }
    # Each part's holder and key are where the new URL goes.
    for part in media_parts(body):
        part.holder[part.key] = "data:,x"
    assert "https://a/" not in json.dumps(body) and "AAAA" not in json.dumps(body)


def test_uuids_are_taken_out_and_parts_read_as_vllm_read_them_with_one() -> None:
    """With a uuid, vLLM reads a part through its untyped branch (image_url
    first, whatever the type); the part is rewritten so that, without the
    uuid, vLLM reads the same medium by its type."""
    body = _body(
        {
            "type": "video_url",
            "image_url": "https://a/i",
            "video_url": {"url": "https://a/v.mp4"},
            "uuid": "u",
        },
        {
            "type": "image_url",
            "image_url": "https://a/s.png",
            "uuid": "u",
        },  # a string: typed, it would be refused
        {"type": "video_url", "video_url": {"url": "https://a/w.mp4"}, "uuid": None},  # None: no uuid
    )
    found = [(p.kind, p.url) for p in media_parts(body)]
    assert found == [("image", "https://a/i"), ("image", "https://a/s.png"), ("video", "https://a/w.mp4")]
    content = body["messages"][0]["content"]
    assert "uuid" not in json.dumps(body)
    assert content[0]["type"] == "image_url" and content[0]["image_url"] == {"url": "https://a/i"}
    assert content[1] == {"type": "image_url", "image_url": {"url": "https://a/s.png"}}


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": None, "uuid": "someone-elses"},
        {"image_url": None, "uuid": "someone-elses"},
        {"type": "video_url", "uuid": "someone-elses"},
        {"type": "image_embeds", "uuid": "someone-elses"},
        {"type": "input_audio", "input_audio": None},
        {"type": "text", "text": "hi", "uuid": "t"},  # vLLM reads it as a medium too, and finds none
        {"type": "image_url", "image_url": {"url": encode_reference({"x": 1}, None)}},
    ],
)
def test_parts_naming_cached_items_or_holding_references_are_refused(part: dict[str, Any]) -> None:
    with pytest.raises(MediaPartRefused) as refused:
        media_parts(_body({"type": "text", "text": "hi"}, part))
    assert refused.value.where == "messages[0].content[1]"


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"a": [{"type": "video_url", "video_url": {"url": "x"}}]}, "a[0]"),
        ({"a": {"b": {"audio_url": "https://x/y.wav"}}}, "a.b.audio_url"),
        ({"a": {"image_url": None, "uuid": "u"}}, "a.image_url"),
        ({"a": [1, {"multi_modal_data": {"video": "x"}}]}, "a[1].multi_modal_data"),
        ({"prompt": encode_reference({"x": 1}, None)}, "prompt"),
        (encode_reference({"x": 1}, None), "body"),
    ],
)
def test_foreign_media_names_where_it_is(body: Any, where: str) -> None:
    assert foreign_media(body) == where


def test_json_schemas_that_name_media_keys_are_not_media() -> None:
    schema = {"properties": {"image_url": {"type": "string"}, "uuid": {"type": "string"}, "video_url": {}}}
    assert foreign_media({"tools": [{"function": {"parameters": schema}}]}) is None


def test_the_walk_is_linear_in_the_body() -> None:
    """A long key holding many empty lists: a walk that spelt every value's
    path before looking at it allocated key length x values (100 MB here,
    and 5.6 GB for a 251 KiB body); paths are now spelt only for a hit."""
    values = 20_000
    body = {"k" * 5_000: [[] for _ in range(values)]}
    raw_size = len(json.dumps(body))
    tracemalloc.start()
    try:
        started = time.perf_counter()
        assert foreign_media(body) is None
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\n  {raw_size} byte body: peak {peak / 1e6:.1f} MB, {elapsed * 1e3:.0f} ms")
    assert peak < 8_000_000, f"peak {peak} bytes for a {raw_size}-byte body"
    body[next(iter(body))].append({"video_url": "https://x/y.mp4"})
    assert foreign_media(body) == f"{'k' * 5_000}[{values}].video_url"
