"""Where a request body carries media, as vLLM 0.32 reads it: pure functions
over parsed JSON, with no I/O, for the frontend to guard what vLLM would load.

vLLM's chat parser (``vllm/renderers/chat_utils.py``,
``_parse_chat_message_content_mm_part``) reads one medium from each content
part of ``messages``: by its ``type`` when the type is known and the part has
no ``uuid``; otherwise from the first of its keys in :data:`_UNTYPED_KEYS`.
:func:`media_parts` finds every part vLLM would fetch a URL for (images,
videos, audio) after taking out what no client may choose: a part's ``uuid``
is vLLM's cache key for it, used as given, so a client could name another
client's cached image (see SECURITY.md). :func:`foreign_media` finds media
anywhere else in a body, for routes and keys the frontend does not rewrite.

Both walks do work and memory linear in the body: a value's path is only
spelt out when something is found there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pixelwire.signing import is_reference

MediaKind = Literal["image", "video", "audio"]


class MediaPartRefused(ValueError):
    """A part of the request the frontend will not hand to vLLM; ``where``
    names it (``messages[0].content[1]``, a path into the body)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass
class MediaPart:
    """One medium vLLM would load from a URL."""

    where: str  # messages[i].content[j], for error messages
    kind: MediaKind
    holder: dict[str, Any]  # the dict whose [key] holds the URL
    key: str
    url: str


# Part types vLLM loads from a URL, and the key that holds it (a {"url": ...}
# object, or for input_image the URL string itself).
_TYPED: dict[str, tuple[str, MediaKind]] = {
    "image_url": ("image_url", "image"),
    "input_image": ("image_url", "image"),
    "video_url": ("video_url", "video"),
    "audio_url": ("audio_url", "audio"),
}
# Keys an untyped part (or any part with a uuid) is read from, in vLLM's
# order: the first one present is the part's medium.
_UNTYPED_KEYS = (
    "image_url",
    "image_pil",
    "image_embeds",
    "audio_embeds",
    "video_embeds",
    "prompt_embeds",
    "audio_url",
    "input_audio",
    "video_url",
)
_URL_KINDS: dict[str, MediaKind] = {"image_url": "image", "video_url": "video", "audio_url": "audio"}
# Part types that carry no medium (vLLM reads only their text).
_TEXT_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"})
# Part types vLLM makes media items of, whatever holds them (chat_utils'
# MM_PARSER_MAP, Anthropic's and Cohere's image blocks, the Responses API).
_MEDIA_TYPES = frozenset(
    {
        "image_url",
        "input_image",
        "image",
        "image_pil",
        "image_file",
        "image_embeds",
        "video_url",
        "video",
        "video_embeds",
        "audio_url",
        "input_audio",
        "audio",
        "audio_embeds",
        "input_file",
        "file",
    }
)
_MEDIA_KEYS = frozenset(_UNTYPED_KEYS) - {"prompt_embeds"}


def _url_of(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("url"), str):
        return str(value["url"])
    return None


def _holds_reference(value: Any) -> bool:
    """Whether a descriptor reference sits anywhere in ``value`` (iterative)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if is_reference(item.lstrip()):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _part_medium(part: dict[str, Any], *, had_uuid: bool) -> tuple[str, MediaKind | None, Any] | None:
    """(key, kind, value) of the medium vLLM reads from a part: kind None
    for media it does not fetch (embeddings, inline audio); None for a text
    part or a type vLLM does not load. A part that had a ``uuid`` is read as
    vLLM reads it then (the untyped branch, whatever its type)."""
    kind = part.get("type")
    if not had_uuid and isinstance(kind, str) and kind in _TYPED:
        key, medium = _TYPED[kind]
        return key, medium, part.get(key)
    if kind is None or had_uuid:
        for key in _UNTYPED_KEYS:
            if key in part:
                return key, _URL_KINDS.get(key), part[key]
        return None
    if kind == "input_audio" or (isinstance(kind, str) and kind.endswith("_embeds")):
        return kind, None, part.get(kind)
    return None


def _as_typed(part: dict[str, Any], key: str, url: str | None) -> None:
    """Rewrites a part vLLM read through its untyped branch (it had a uuid)
    so that, without the uuid, vLLM reads the same medium by its type."""
    if key == "prompt_embeds":
        part["type"], part["data"] = key, part[key]
        return
    part["type"] = key
    if url is not None:
        part[key] = {"url": url}


def _input_audio_url(value: Any) -> str | None:
    """The ``data:`` URL vLLM makes of an ``input_audio`` object (its
    ``parse_input_audio``), spelt as vLLM spells it; None when it makes none."""
    if not value:
        return None
    if not isinstance(value, dict):
        raise TypeError("input_audio must be an object with data and format")
    data, audio_format = value.get("data", ""), value.get("format", "")
    return f"data:audio/{audio_format};base64,{data}" if data else None


def media_parts(body: dict[str, Any]) -> list[MediaPart]:
    """Every medium vLLM would fetch for ``body["messages"]``, with each
    content part's ``uuid`` removed first (in place), so the parts are read
    as vLLM will read them once forwarded. Raises :class:`MediaPartRefused`
    for a descriptor reference in a non-text part (only the frontend mints
    them) and for a media part with no medium (with its uuid gone, it would
    name nothing; with it, it named a cached item of anyone's)."""
    parts: list[MediaPart] = []
    messages = body.get("messages")
    if not isinstance(messages, list):
        return parts  # upstream validates the request's shape
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            where = f"messages[{i}].content[{j}]"
            kind = part.get("type")
            if kind in _TEXT_TYPES and "uuid" not in part:
                continue
            if _holds_reference(part):
                raise MediaPartRefused(
                    where, "pixelwire descriptors are minted by the frontend, not sent by clients"
                )
            had_uuid = part.pop("uuid", None) is not None
            medium = _part_medium(part, had_uuid=had_uuid)
            if medium is None:
                if had_uuid:
                    raise MediaPartRefused(
                        where, "a part with a uuid must carry its medium (uuid-only parts are not accepted)"
                    )
                continue
            key, medium_kind, value = medium
            if key == "input_audio" and value is not None:
                # vLLM loads inline audio as the data: URL it makes of it:
                # the part becomes that URL's audio_url part, to be checked
                # and handed on as every audio URL is.
                try:
                    audio_url = _input_audio_url(value)
                except TypeError as error:
                    raise MediaPartRefused(where, str(error)) from error
                if audio_url is None and not had_uuid:
                    continue  # vLLM loads nothing for it
                if audio_url is None:
                    value = None
                else:
                    del part[key]
                    part["type"], part["audio_url"] = "audio_url", {"url": audio_url}
                    key, medium_kind, value = "audio_url", "audio", part["audio_url"]
            if value is None:
                raise MediaPartRefused(
                    where,
                    f"{key} is missing or null: a medium is sent by URL or data, not named by a uuid "
                    "(uuids are not accepted through the frontend)",
                )
            url = _url_of(value) if medium_kind is not None else None
            if had_uuid:
                _as_typed(part, key, url)
                value = part[key] if key != "prompt_embeds" else value
            if medium_kind is None or url is None:
                continue  # not fetched, or not a URL vLLM could load (it refuses the shape itself)
            holder, url_key = (value, "url") if isinstance(value, dict) else (part, key)
            parts.append(MediaPart(where, medium_kind, holder, url_key, url))
    return parts


def _walk(value: Any) -> Iterator[tuple[Any, Any]]:
    """(node, value) for every value in a JSON document, iteratively (a
    deeply nested body cannot exhaust the stack). A node is (parent node,
    key) or None for the root: :func:`_path` spells it out only when asked,
    so the walk's work and memory stay linear in the body."""
    stack: list[tuple[Any, Any]] = [(None, value)]
    while stack:
        node, item = stack.pop()
        yield node, item
        if isinstance(item, dict):
            stack.extend(((node, k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend(((node, n), v) for n, v in enumerate(item))


def _path(node: Any, *keys: str) -> str:
    """The path of a node from :func:`_walk` (``a.b[2].c``), plus ``keys``."""
    steps: list[str] = list(reversed(keys))
    while node is not None:
        node, key = node
        steps.append(f"[{key}]" if isinstance(key, int) else str(key))
    text = ""
    for step in reversed(steps):
        text += step if step.startswith("[") or not text else f".{step}"
    return text or "body"


def foreign_media(body: Any) -> str | None:
    """Where in ``body`` a medium, a media part naming a cached item (a
    ``uuid``) or a descriptor reference sits; None when there is none. For
    bodies (and keys) the frontend does not rewrite: vLLM would load what is
    found there itself, past the frontend's guard."""
    for node, item in _walk(body):
        if isinstance(item, str):
            if is_reference(item.lstrip()):
                return _path(node)
        elif isinstance(item, dict):
            kind = item.get("type")
            if isinstance(kind, str) and kind in _MEDIA_TYPES:
                return _path(node)
            if kind is None or "uuid" in item:
                # An untyped part holding a medium, or any part naming a
                # cached item (a JSON schema's "image_url" property,
                # {"type": "string"}, is neither).
                names_cached = isinstance(item.get("uuid"), str)
                for key in _MEDIA_KEYS & item.keys():
                    value = item[key]
                    if _url_of(value) is not None or (names_cached and value is None):
                        return _path(node, key)
            images = item.get("images")  # Cohere's embed request: a list of data: URIs
            if isinstance(images, list) and images and all(isinstance(i, str) for i in images):
                return _path(node, "images")
            mm_data = item.get("multi_modal_data")
            if isinstance(mm_data, dict) and mm_data:
                return _path(node, "multi_modal_data")
    return None


def data_url_bytes(url: str) -> int:
    """The bytes a base64 data: URL decodes to (an upper bound), without
    decoding it; 0 for other URLs."""
    if url[:5].lower() != "data:":
        return 0
    comma = url.find(",")
    if comma < 0:
        return 0
    payload = len(url) - comma - 1
    return payload // 4 * 3 + 3 if ";base64" in url[:comma].lower() else payload
