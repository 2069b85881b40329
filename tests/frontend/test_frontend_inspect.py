"""What the frontend reads from a request (``pixelwire.frontend.inspect``),
seen through a real frontend: every spelling of a rewritten route, media
found where vLLM finds them and refused where it would load them unguarded,
client descriptors and uuids, the image settings a request asks for, and
bodies too large or too many-valued to parse on the event loop."""

from __future__ import annotations

import json
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from pixelwire.frontend.errors import OpenAIError
from pixelwire.frontend.inspect import dump_json, inspect_chat, json_value_bound, scan_body
from pixelwire.signing import encode_reference

import stack
from frontend_client import SECRET, chat, expected, post, send, user
from loopback_servers import Upstream


def test_request_media_io_kwargs_choose_mode_and_background(trusting_frontend: stack.Service) -> None:
    """With --trust-request-mm-kwargs, a request's media_io_kwargs set the
    image mode and background the frontend decodes with, as vLLM's would."""
    frontend = trusting_frontend
    body = chat(
        stack.data_url("transparent.png"), media_io_kwargs={"image": {"rgba_background_color": [0, 0, 0]}}
    )
    status, raw = post(frontend, body)
    assert status == 201
    assert json.loads(raw)["images"] == [expected("transparent.png", background=(0, 0, 0))]
    status, raw = post(
        frontend, chat(stack.data_url("transparent.png"), media_io_kwargs={"image": {"image_mode": "RGBA"}})
    )
    assert json.loads(raw)["images"] == [expected("transparent.png", mode="RGBA")]


def test_request_kwargs_are_refused_unless_the_frontend_trusts_them(
    frontend: stack.Service, upstream: Upstream
) -> None:
    """vLLM 0.32 refuses a request's own media_io_kwargs and
    mm_processor_kwargs unless started with --trust-request-mm-kwargs, and
    they steer the frontend's work (frames decoded, sizes): without the same
    flag the frontend answers vLLM's 400, naming the field, before any
    decode or forward. Empty ones are no override and pass."""
    calls = upstream.calls
    for name, value in (
        ("media_io_kwargs", {"video": {"num_frames": 100_000}}),
        ("media_io_kwargs", {"image": {"image_mode": "RGBA"}}),
        ("mm_processor_kwargs", {"max_pixels": 1 << 30}),
    ):
        status, answer = post(frontend, chat(stack.data_url("transparent.png"), **{name: value}))
        error = answer["error"]
        assert (status, error["param"]) == (400, name), answer
        assert "--trust-request-mm-kwargs" in error["message"]
    assert upstream.calls == calls, "nothing was forwarded"
    status, _ = post(frontend, chat(stack.data_url("transparent.png"), media_io_kwargs={}))
    assert status == 201


def test_client_supplied_descriptors_are_refused(frontend: stack.Service, upstream: Upstream) -> None:
    reference = encode_reference({"x": 1}, SECRET)
    calls = upstream.calls
    for body in (
        chat(reference),
        chat(" " + reference.upper()),
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "input_image", "image_url": reference}]}],
        },
    ):
        code, error = post(frontend, body)
        assert code == 400 and "minted by the frontend" in error["error"]["message"]
    assert upstream.calls == calls
    # Text that merely mentions the prefix is text.
    code, _ = post(
        frontend,
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": reference}]}]},
    )
    assert code == 201


def test_invalid_json_is_a_400(frontend: stack.Service) -> None:
    request = urllib.request.Request(f"{frontend.url}/v1/chat/completions", data=b"{nope", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    with caught.value as error:
        assert error.code == 400
        assert "not valid JSON" in json.loads(error.read())["error"]["message"]


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions/",
        "/v1//chat/completions",
        "//v1/chat/completions",
        "/v1/./chat/completions",
        "/v1/chat/../chat/completions",
        "/v1/chat/%63ompletions",
        "/v1/chat%2Fcompletions",
        "/v1/chat%252Fcompletions",
        "/v1/chat/completions?x=1",
    ],
)
def test_every_spelling_of_chat_completions_is_rewritten(
    frontend: stack.Service, upstream: Upstream, path: str
) -> None:
    status, _, raw = send(frontend, path, chat(stack.data_url("hopper.png")))
    assert status == 201, raw
    assert json.loads(raw)["images"] == [expected("hopper.png")]  # read over NIXL: rewritten
    # The upstream got the route the frontend inspected the body for.
    assert upstream.paths[-1].split("?")[0] == "/v1/chat/completions"


@pytest.mark.parametrize("path", ["/tokenize", "/pooling", "/v1/embeddings", "/classify", "/v1/embeddings/"])
def test_vllms_other_chat_shaped_routes_are_rewritten(
    frontend: stack.Service, upstream: Upstream, path: str
) -> None:
    status, _, raw = send(frontend, path, chat(stack.data_url("hopper.png")))
    assert status == 201, raw
    assert json.loads(raw)["images"] == [expected("hopper.png")]
    assert upstream.paths[-1] == path.rstrip("/")


def test_image_parts_vllm_loads_without_the_image_url_type_are_rewritten(frontend: stack.Service) -> None:
    url = stack.data_url("hopper.png")
    content = [
        {"type": "input_image", "image_url": url},  # the Responses spelling, which vLLM's chat parser takes
        {"image_url": {"url": url}},  # no type: vLLM's parser reads image_url
        {"type": "image_url", "image_url": {"url": url}, "uuid": "u1"},  # uuid: the untyped branch
        {"type": "text", "text": "hi"},
    ]
    status, raw = post(frontend, {"model": "m", "messages": [{"role": "user", "content": content}]})
    assert status == 201, raw
    assert json.loads(raw)["images"] == [expected("hopper.png")] * 3


_REF = encode_reference({"x": 1}, SECRET)
_URL = "https://images.test/a.png"
_PART = {"type": "image_url", "image_url": {"url": _URL}}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"model": "m", "input": user({"type": "input_image", "image_url": _URL})}),
        ("/v1/messages", {"model": "m", "messages": user({"type": "image", "source": {"url": _URL}})}),
        ("/v1/messages/count_tokens", {"model": "m", "messages": user({"type": "image", "source": {}})}),
        ("/v1/chat/completions/batch", {"model": "m", "messages": [user(_PART)]}),
        ("/v1/chat/completions/render", chat(_URL)),
        ("/v1/score", {"model": "m", "queries": "q", "documents": {"content": [_PART]}}),
        ("/rerank", {"model": "m", "query": "q", "documents": {"content": [_PART]}}),
        ("/v2/embed", {"model": "m", "images": ["data:image/png;base64,AA=="]}),
        ("/cohere/v2/chat", {"model": "m", "messages": user(_PART)}),
        ("/invocations", chat(_URL)),
        (
            "/invocations",
            {"model": "m", "messages": user({"type": "video_url", "video_url": {"url": _URL}})},
        ),
        ("/v1/chat/completions/batch", {"model": "m", "messages": [user({"video_url": _URL})]}),
        ("/v1/chat/completions/batch", {"model": "m", "messages": [user({"audio_url": {"url": _URL}})]}),
        ("/v1/chat/completions/batch", {"model": "m", "messages": [user({"image_url": None, "uuid": "u"})]}),
        ("/v1/chat/completions/batch", {"model": "m", "messages": [user({"type": "input_audio"})]}),
        ("/v1/completions", {"model": "m", "prompt": {"prompt": "x", "multi_modal_data": {"image": _URL}}}),
        ("/v1/completions", {"model": "m", "prompt": _REF}),
        ("/v1/responses", {"model": "m", "input": " " + _REF.upper()}),
        ("/v1/chat/completions", {"model": "m", "messages": [], "extra": {"url": _REF}}),
    ],
)
def test_other_routes_refuse_images_and_descriptors(
    frontend: stack.Service, upstream: Upstream, path: str, body: dict[str, Any]
) -> None:
    seen = len(upstream.paths)
    status, _, raw = send(frontend, path, body)
    assert status == 400, raw
    error = json.loads(raw)["error"]
    assert error["type"] == "BadRequestError" and error["param"]
    if path != "/v1/chat/completions":
        assert path in error["message"]  # names the route it refuses images on
    assert len(upstream.paths) == seen  # never forwarded


def test_text_only_bodies_on_other_routes_pass_untouched(frontend: stack.Service, upstream: Upstream) -> None:
    body = b'{"model": "m",  "prompt": "describe image_url", "n": 1}'
    status, _, _ = send(frontend, "/v1/completions", body)
    assert status == 404  # the test upstream has no such route: its answer, passed back
    assert upstream.paths[-1] == "/v1/completions"
    # A tool whose parameters name an image_url is not an image.
    schema = {"properties": {"image_url": {"type": "string"}, "images": {"type": "array"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    status, _, _ = send(frontend, "/v1/responses", {"model": "m", "input": "hi", "tools": [tool]})
    assert status == 404 and upstream.paths[-1] == "/v1/responses"
    status, _ = post(
        frontend, {"model": "m", "messages": user({"type": "text", "text": "x"}), "tools": [tool]}
    )
    assert status == 201
    status, _, _ = send(frontend, "/v1/audio/transcriptions", b"not json at all")
    assert status == 404 and upstream.paths[-1] == "/v1/audio/transcriptions"


def test_a_body_of_too_many_json_values_is_refused_before_parsing(frontend: stack.Service) -> None:
    # 64 MiB of `{},` would take the Python scanner ~45 s of CPU; the bound
    # (1 + every `{`, `[` and `,`) refuses it unread, naming the limit.
    body = b"[" + b"{}," * 3_000_000 + b"{}]"
    status, _, raw = send(frontend, "/v1/chat/completions", body)
    message = json.loads(raw)["error"]["message"]
    assert status == 400 and "max_json_values" in message and "500000" in message, message
    status, _, raw = send(frontend, "/v1/models", body, method="GET")
    assert status == 400 and "max_json_values" in json.loads(raw)["error"]["message"]  # every route
    # Just under the bound is parsed (and refused for what it is).
    body = b"[" + b"{}," * 249_998 + b"{}]"
    status, _, raw = send(frontend, "/v1/chat/completions", body)
    assert status == 400 and "JSON object" in json.loads(raw)["error"]["message"]


def _data_url(n: int, seed: int = 0) -> str:
    return "data:image/png;base64," + "".join("QUJDRA==+/09az"[(i * 7 + seed) % 14] for i in range(n))


def _conversation(images: int, tools: list[Any]) -> dict[str, Any]:
    """A chat body of ``images`` user turns, each one data: URL image, and
    ``tools`` (where large strings sit outside any content part)."""
    turns = [{"type": "image_url", "image_url": {"url": _data_url(9000, n)}} for n in range(images)]
    return {"model": "m", "messages": [{"role": "user", "content": [turn]} for turn in turns], "tools": tools}


def test_a_body_with_its_data_urls_cut_out_parses_to_the_same_document() -> None:
    """The frontend parses a skeleton of the body, its large data: URL
    strings cut out natively and put back after; the document is the one
    json.loads makes of the body, wherever such strings sit (keys, escaped,
    non-ASCII, text, the top level), and the values bound is json_value_bound's."""
    big = _data_url(6000)
    conversation = _conversation(8, [{"description": big, big: [big, {"x": big}]}])
    bodies = [
        json.dumps(conversation).encode(),
        json.dumps(conversation, indent=2).encode(),
        json.dumps(conversation, ensure_ascii=False).encode("utf-16"),
        ('{"a": "' + big + '", "a": "' + big[:-1] + '"}').encode(),  # a repeated key: the last one counts
        ('["' + big.replace("Q", "\\u0051", 1) + '", "' + big + 'é"]').encode(),
        ('"' + big + '"').encode(),
        (' \r\n["' + big + '" ,"' + big.upper() + '"]\t').encode(),
        b"\xef\xbb\xbf" + json.dumps([big]).encode(),  # a byte order mark
    ]
    for raw in bodies:
        read = scan_body(raw)
        assert read.values == json_value_bound(raw) <= 1 + raw.count(b"{") + raw.count(b"[") + raw.count(b",")
        want = json.loads(raw)
        if isinstance(want, dict):
            assert inspect_chat(read)[0] == want
    # Everything cut but the key (~100 KB to ~7 KB).
    assert len(scan_body(bodies[0]).skeleton or b"") < len(big) + 2000
    assert scan_body(bodies[2]).skeleton is None  # UTF-16: nothing is cut


def test_a_body_written_with_the_clients_own_strings_is_byte_for_byte_the_encoders() -> None:
    """The frontend writes a rewritten body's untouched data: URL strings
    as the client's own bytes (no escape scan of megabytes of base64): the
    same bytes the encoder writes, whatever was changed around them, and a
    string put in a kept one's place is written as itself."""
    big = _data_url(6000)
    conversation = _conversation(6, [{"description": big, big: [big, {"x": big, "y": 'é "q" \u0000'}]}])
    for raw in (json.dumps(conversation).encode(), json.dumps(conversation, indent=1).encode()):
        read = scan_body(raw)
        body, parts = inspect_chat(read)
        assert len(parts) == 6 and read.restored
        assert dump_json(body, read) == dump_json(body)
        # Some replaced (as references replace them), one by another kept
        # string (written as that one), one by a new string equal to a kept one.
        parts[0].holder[parts[0].key] = "ref-0"
        parts[1].holder[parts[1].key] = parts[2].url
        parts[3].holder[parts[3].key] = "".join(parts[4].url)
        body["tools"][0]["description"] = {"now": "an object"}
        spliced = dump_json(body, read)
        assert spliced == dump_json(body)
        assert json.loads(spliced)["messages"][1]["content"][0]["image_url"]["url"] == _data_url(9000, 2)


@pytest.mark.parametrize(
    "raw",
    [
        '{"a": "DATA", "b": }',  # invalid after a cut string
        '{"a": "DATA" "b": 1}',  # a missing comma
        '{"a": ["DATA", "DATA\n"]}',  # a raw newline inside a string: not cut, and invalid
        '{"a": "DATA',  # unterminated
        '{"DATA": 1, "b": "DATA"}x',  # trailing bytes
    ],
)
def test_a_body_that_is_not_json_is_refused_as_its_own_bytes_say(raw: str) -> None:
    """Cutting strings out never makes invalid JSON valid, and the error
    names the client's bytes (its positions), not the skeleton's."""
    body = raw.replace("DATA", _data_url(5000)).encode()
    with pytest.raises(json.JSONDecodeError) as direct:
        json.loads(body)
    with pytest.raises(OpenAIError) as refused:
        inspect_chat(scan_body(body))
    assert refused.value.status == 400 and str(direct.value) in refused.value.message


def test_a_large_body_does_not_freeze_the_loop(upstream: Upstream, tmp_path: Path) -> None:
    # 6 MB of `{},` (4 million values; this frontend's max_json_values lets
    # them in): parsed on the event loop, every other request would wait for
    # it (for 1.1 s at 9 MB), so /metrics could not answer until the big
    # request had its answer. The body is large enough that its parse takes
    # well over a second even on a fast, idle machine, so the count of
    # answers meanwhile is far from the threshold either way.
    frontend = stack.start_frontend(
        "large-body", tmp_path, upstream.url, "--max-json-values", str(10_000_000),
        env={"PIXELWIRE_SECRET": SECRET.decode()},
    )  # fmt: skip
    frontend.wait_ready("/metrics", timeout=60)
    try:
        _answers_while_a_large_body_is_parsed(frontend)
    finally:
        frontend.stop()


def _answers_while_a_large_body_is_parsed(frontend: stack.Service) -> None:
    body = b"[" + b"{}," * 2_000_000 + b"{}]"
    sent, answered = threading.Event(), threading.Event()
    reply: list[bytes] = []

    def big() -> None:
        with socket.create_connection(("127.0.0.1", frontend.port)) as sock:
            head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
            sock.sendall(head.encode() + body)
            sent.set()
            sock.settimeout(60)
            reply.append(sock.recv(65536))
            answered.set()

    thread = threading.Thread(target=big)
    thread.start()
    assert sent.wait(60)
    before = 0  # /metrics answers that came while the big body was still being parsed
    while not answered.is_set():
        frontend.get("/metrics")
        before += not answered.is_set()
    thread.join(60)
    assert reply and b" 400 " in reply[0].split(b"\r\n")[0] and b"JSON object" in reply[0]
    assert before >= 10, before
    print(f"{before} /metrics answers while the body was parsed")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_body_of_one_long_key_and_many_values_costs_memory_linear_in_it(
    frontend: stack.Service, path: str
) -> None:
    """A 251 KiB body: a 125,000-character key holding 42,000 empty lists.
    Spelling every value's path before looking at it took the frontend to
    5.6 GB of memory and blocked its loop for 4.7 s; the walk spells a path
    only for a hit, and a body of many values is walked off the loop."""
    key = "k" * 125_000
    raw = json.dumps({"model": "m", "messages": [], key: [[] for _ in range(42_000)]}).encode()
    before = stack.peak_rss(frontend) / 2**20
    answers = []
    for _ in range(3):
        status, _, _ = send(frontend, path, raw)
        answers.append(status)
    grown = stack.peak_rss(frontend) / 2**20 - before
    print(f"\n  {len(raw) >> 10} KiB body x3 on {path}: peak RSS grew {grown:.0f} MiB; answers {answers}")
    assert all(status in (201, 404) for status in answers), answers  # forwarded: the upstream's answer
    assert grown < 200


def test_client_uuids_never_reach_vllm(frontend: stack.Service, upstream: Upstream) -> None:
    """vLLM uses a part's uuid as its cache key as given: one client could
    have another's cached image answered for its own. The frontend takes
    every uuid out; a part that only names a cached item is refused."""
    url = stack.data_url("hopper.png")
    content = [
        {"type": "image_url", "image_url": {"url": url}, "uuid": "victims-key"},
        {"image_url": url, "uuid": "other-key"},
        {"type": "image_url", "image_url": url, "uuid": "string-url"},  # read untyped with its uuid
    ]
    status, raw = post(frontend, {"model": "m", "messages": user(*content)})
    assert status == 201, raw
    assert "uuid" not in json.dumps(upstream.bodies[-1])
    assert json.loads(raw)["images"] == [expected("hopper.png")] * 3
    calls = upstream.calls
    for part in (
        {"type": "image_url", "image_url": None, "uuid": "victims-key"},
        {"image_url": None, "uuid": "victims-key"},
        {"type": "video_url", "video_url": None, "uuid": "victims-key"},
        {"type": "image_embeds", "uuid": "victims-key"},
        {"type": "text", "text": "hi", "uuid": "victims-key"},
    ):
        status, answer = post(frontend, {"model": "m", "messages": user(part)})
        assert status == 400, (part, answer)
        assert answer["error"]["param"] == "messages[0].content[0]", answer
    assert upstream.calls == calls
