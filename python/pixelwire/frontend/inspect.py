"""What a request asks for, read from its path and body: pure functions, no
I/O and no event loop. Each refusal is an :class:`OpenAIError` (400) naming
the part or the limit; the application decides what runs off the loop
(:attr:`RequestBody.off_loop`)."""

from __future__ import annotations

import json
import json.scanner
import posixpath
import re
import secrets
import sys
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from pixelwire import _native
from pixelwire.frontend.errors import OpenAIError
from pixelwire.frontend.settings import FrontendConfig
from pixelwire.media_parts import MediaPart, MediaPartRefused, data_url_bytes, foreign_media, media_parts
from pixelwire.video.sampling import NotReproduced, VideoSampling

# vLLM 0.32's routes whose body is a chat request (`messages`, parsed by
# chat_utils): rewritten and guarded like chat completions.
REWRITTEN_ROUTES = {
    "/v1/chat/completions": "chat",
    "/tokenize": "tokenize",
    "/pooling": "pooling",
    "/v1/embeddings": "embeddings",
    "/classify": "classify",
}

# Bodies up to this size are parsed by the C scanner on the loop (a few ms
# at worst); larger ones off it, by the Python scanner (see _loads).
_C_PARSE_BYTES = 256 * 1024
# Bodies with more JSON values than this (an upper bound, counted before
# parsing) are parsed, walked for media and written off the loop even when
# small: the walk is Python, ~1 us a value. A chat body of a few turns has
# hundreds.
_LOOP_VALUES = 4096
# data: URL string values at least this long are cut out of a body before it
# is parsed (scan_body): a resent conversation's images are most of its bytes.
_CUT_DATA_URL_CHARS = 4096


@dataclass(frozen=True)
class RequestBody:
    """A request's raw body, the bound on its JSON values and, when its large
    ``data:`` URLs were cut out (:func:`scan_body`), the skeleton to parse
    in its place: ``cut`` holds each one's byte range in ``raw``, and the
    skeleton the string ``placeholder + str(n)`` for the n-th."""

    raw: bytes
    values: int
    skeleton: bytes | None = None
    cut: list[tuple[int, int]] = field(default_factory=list)
    placeholder: str = ""
    # The strings put back into the last document parsed from the skeleton,
    # by id, each with its number: held here, so that no other string can
    # take one's id while the document is written (dump_json).
    restored: dict[int, tuple[str, int]] = field(default_factory=dict)

    @property
    def off_loop(self) -> bool:
        """Whether parsing, walking or writing this body belongs in a thread:
        on the event loop, a large body or one of many values would stall
        every request."""
        return len(self.raw) > _C_PARSE_BYTES or self.values > _LOOP_VALUES


def canonical_path(raw_path: str) -> str:
    """The route a path names, whatever its spelling: percent-decoded (as
    uvicorn does, %2F included, repeatedly so that no layer decodes more),
    dot segments removed and slashes merged (as some clients and proxies do),
    no trailing slash (FastAPI redirects there)."""
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    for _ in range(4):
        decoded = unquote(path)
        if decoded == path:
            break
        path = decoded
    path = posixpath.normpath("/" + re.sub(r"/+", "/", path))
    return re.sub(r"/+", "/", path)


def json_value_bound(raw: bytes) -> int:
    """An upper bound on the JSON values in ``raw``, without parsing it:
    every value but the outermost is an array element or an object member,
    and a container holds one more of those than its commas (counted
    outside strings, natively)."""
    return _native.scan_json_body(raw, sys.maxsize, "")[1]


def scan_body(raw: bytes) -> RequestBody:
    """``raw`` with the bound on its values and its large ``data:`` URL
    string values cut out, in one native pass: parsing the skeleton and
    putting those strings back (:func:`inspect_chat`) gives the document
    ``raw`` parses to, without a byte-by-byte scan of megabytes of base64
    in Python. The placeholder carries a random nonce, so that no string a
    client sends can stand for one."""
    nonce = secrets.token_hex(8)
    # Written into the skeleton as JSON text: it parses to "\x00pw:<nonce>:".
    skeleton, values, cut = _native.scan_json_body(raw, _CUT_DATA_URL_CHARS, f"\\u0000pw:{nonce}:")
    return RequestBody(raw, values, skeleton, cut, f"\x00pw:{nonce}:")


def _loads(raw: bytes) -> Any:
    """``json.loads(raw)``, with the pure-Python scanner for a large body:
    the C scanner never lets go of the GIL, so even in a thread a body of
    millions of tiny values would stall the event loop for seconds; the
    Python one does (strings, the bulk of a real body, are still scanned in C)."""
    if len(raw) <= _C_PARSE_BYTES:
        return json.loads(raw)
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    decoder = json.JSONDecoder()
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # type: ignore[attr-defined]
    return decoder.decode(text)


def _parse(raw: bytes) -> Any:
    try:
        return _loads(raw)
    except (ValueError, RecursionError) as e:
        raise OpenAIError(400, f"request body is not valid JSON: {e}") from None


def _restored(read: RequestBody) -> Any:
    """The document ``read.raw`` holds, parsed from its skeleton when it has
    one: each placeholder string replaced by the string it stands for."""
    if read.skeleton is None:
        return _parse(read.raw)
    try:
        document = _loads(read.skeleton)
    except (ValueError, RecursionError):
        _parse(read.raw)  # the error as the client's bytes give it
        raise AssertionError("a skeleton parses as its body does") from None
    view = memoryview(read.raw)
    strings = {f"{read.placeholder}{n}": n for n in range(len(read.cut))}
    read.restored.clear()

    def restore(value: str) -> str:
        n = strings[value]
        start, end = read.cut[n]
        text = str(view[start:end], "ascii")
        read.restored[id(text)] = (text, n)
        return text

    # Each placeholder appears once: the walk ends when all are back.
    left = len(strings)
    stack: list[Any] = [document]
    while stack and left:
        item = stack.pop()
        slots = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        for key, value in slots:
            if isinstance(value, str) and value in strings:
                item[key] = restore(value)
                left -= 1
            elif isinstance(value, (dict, list)):
                stack.append(value)
    if isinstance(document, str) and document in strings:
        return restore(document)
    return document


def inspect_chat(read: RequestBody) -> tuple[dict[str, Any], list[MediaPart]]:
    """A chat-shaped body and its media parts, client uuids taken out (run
    off the loop when large). A medium or a descriptor outside ``messages``
    is refused: only the parts found here are guarded."""
    body = _restored(read)
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    try:
        parts = media_parts(body)
    except MediaPartRefused as refused:
        raise OpenAIError(400, str(refused), param=refused.where) from None
    where = foreign_media({k: v for k, v in body.items() if k != "messages"})
    if where is not None:
        raise OpenAIError(
            400,
            f"{where}: media are accepted in messages[].content only; pixelwire descriptors are "
            "minted by the frontend, not sent by clients",
            param=where,
        )
    return body, parts


def inspect_foreign(raw: bytes) -> str | None:
    """Where a passed-through JSON body holds a medium or a descriptor. A
    body that is not JSON passes untouched: vLLM parses JSON with the same
    json.loads, so it cannot read media out of it either."""
    if not raw.strip():
        return None
    try:
        body = _loads(raw)
    except RecursionError:
        # vLLM's parser might still take it: refuse what cannot be inspected.
        return "body (nested too deeply to inspect)"
    except ValueError:
        return None
    return foreign_media(body)


def _encode(document: Any) -> str:
    # Not one-shot: the Python encoder, which lets go of the GIL (see _loads).
    return "".join(json.JSONEncoder(separators=(",", ":")).iterencode(document))


def dump_json(body: dict[str, Any], read: RequestBody | None = None) -> bytes:
    """The rewritten body, compact. With the :class:`RequestBody` it was
    parsed from, each string that :func:`inspect_chat` put back and that is
    still there (the same object: a worker-mode request's ``data:`` URLs)
    is written as the client's own bytes instead of being encoded again:
    megabytes of base64 cost a copy, not an escape scan. The bytes are the
    same either way, since those strings are printable ASCII without ``\\``
    or ``"``, which JSON writes as they are."""
    if read is None or not read.restored:
        return _encode(body).encode()
    restored = read.restored

    def kept(value: Any) -> int | None:
        if isinstance(value, str):
            entry = restored.get(id(value))
            if entry is not None and entry[0] is value:
                return entry[1]
        return None

    def marked(value: Any) -> Any:
        """`value` with each kept string as its placeholder (a copy of the
        containers on the way; the body itself is left as it is)."""
        if isinstance(value, dict):
            return {key: marked(item) for key, item in value.items()}
        if isinstance(value, list):
            return [marked(item) for item in value]
        n = kept(value)
        return value if n is None else f"{read.placeholder}{n}"

    text = _encode(marked(body))
    # The placeholder as the encoder writes it: its NUL escaped.
    prefix = '"' + json.dumps(read.placeholder)[1:-1]
    pieces: list[bytes] = []
    at = 0
    while (found := text.find(prefix, at)) >= 0:
        end = text.index('"', found + len(prefix))
        pieces.append(text[at:found].encode())
        start, stop = read.cut[int(text[found + len(prefix) : end])]
        pieces += [b'"', read.raw[start:stop], b'"']
        at = end + 1
    pieces.append(text[at:].encode())
    return b"".join(pieces)


def check_request_kwargs(config: FrontendConfig, body: dict[str, Any]) -> None:
    """A request's own ``mm_processor_kwargs`` or ``media_io_kwargs`` are
    refused unless the frontend trusts them (``--trust-request-mm-kwargs``,
    vLLM's flag): vLLM 0.32 refuses them by default, and they steer what the
    frontend does (how many frames it decodes, at what size), so an
    untrusted client gets vLLM's 400 before any fetch or decode."""
    if config.trust_request_mm_kwargs:
        return
    for name in ("mm_processor_kwargs", "media_io_kwargs"):
        if body.get(name):
            raise OpenAIError(
                400,
                f"Per-request {name} are disabled by default because they can change multimodal "
                "preprocessing resource usage: start the frontend (and vLLM) with "
                "--trust-request-mm-kwargs only when clients are trusted",
                param=name,
            )


def check_caps(config: FrontendConfig, parts: list[MediaPart]) -> None:
    """The per-request caps that can be checked before any work."""
    limit = config.max_media_per_request
    if len(parts) > limit:
        raise OpenAIError(
            400,
            f"the request has {len(parts)} media parts, over the limit of {limit} per request "
            "(max_media_per_request, also spelt max_images_per_request)",
            param="messages",
        )
    encoded = sum(data_url_bytes(p.url) for p in parts)
    limit = config.max_image_bytes_per_request
    if encoded > limit:
        raise OpenAIError(
            400,
            f"the request's data: URLs hold {encoded} bytes of media, over the limit of {limit} "
            "bytes per request (max_image_bytes_per_request)",
            param="messages",
        )


def image_settings(defaults: dict[str, Any], body: dict[str, Any]) -> tuple[Any, tuple[int, int, int]]:
    """(image_mode, rgba_background_color) the worker's vLLM will ask for:
    the server-wide defaults overridden by the request's media_io_kwargs."""
    settings = {"image_mode": "RGB", "rgba_background_color": [255, 255, 255], **defaults}
    kwargs = body.get("media_io_kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("image"), dict):
        settings.update(kwargs["image"])
    background = settings["rgba_background_color"]
    if not (
        isinstance(background, (list, tuple))
        and len(background) == 3
        and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in background)
    ):
        raise OpenAIError(
            400, "rgba_background_color must be a list of 3 integers in [0, 255]", param="media_io_kwargs"
        )
    return settings["image_mode"], (background[0], background[1], background[2])


# Runtime video options vLLM drops (startup-only), as VideoMediaIO.merge_kwargs.
_STARTUP_ONLY_VIDEO = ("hw_decoders", "pool_size", "device")


def video_sampling(config: FrontendConfig, body: dict[str, Any]) -> VideoSampling | None:
    """How the worker's vLLM will sample the request's videos: the
    server-wide video kwargs merged with the request's ``media_io_kwargs``
    as vLLM's ``VideoMediaIO.merge_kwargs`` merges them (a request that sets
    only one of ``num_frames`` and ``fps`` drops the other default), with
    the loader of ``video_backend`` or the model's. None when the frontend
    cannot tell or pixelwire does not reproduce it: the video is passed on."""
    merged = dict(config.video_kwargs)
    kwargs = body.get("media_io_kwargs")
    runtime = kwargs.get("video") if isinstance(kwargs, dict) else None
    if isinstance(runtime, dict) and runtime:
        runtime = {key: value for key, value in runtime.items() if key not in _STARTUP_ONLY_VIDEO}
        merged.update(runtime)
        if "num_frames" in runtime and "fps" not in runtime:
            merged.pop("fps", None)
        elif "fps" in runtime and "num_frames" not in runtime:
            merged.pop("num_frames", None)
    loader = merged.get("video_backend") or config.video_loader
    if loader is None:
        return None
    try:
        return VideoSampling.from_video_kwargs(merged, loader)
    except NotReproduced:
        return None
