"""A resent image as a reference to bytes the worker already holds.

An agent's conversation resends every earlier screenshot as a ``data:`` URL
on every turn. In worker mode the frontend passes images on for the
plug-in to decode, so vLLM's API server would take in, parse and validate
half a megabyte of base64 per screenshot per turn before the plug-in's memo
(:mod:`pixelwire.caches.data_urls`) even saw it. Instead, a frontend sends a
``data:`` URL its worker was sent (and answered) before as this reference:
the SHA-256 and size of the bytes the URL decodes to, with an expiry, in a
signed descriptor reference (:mod:`pixelwire.signing`).

The frontend mints one only for a URL the same request carries in full
(compared whole with the one it remembers, under the same ``cache_salt``),
so a reference names nothing its client did not send; clients cannot send
references themselves (the frontend refuses any), and the worker checks
the signature. The plug-in serves it from the bytes it remembered under
that digest, exactly as if the URL had come; when it holds none, it
answers :data:`pixelwire.resend.NOT_HELD` and the frontend sends the
request again with the URLs in full.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import time
from dataclasses import dataclass
from typing import Any

from pixelwire._native import DescriptorError
from pixelwire.signing import encode_reference

# The descriptor's one key: no image or video descriptor has it.
KEY = "pixelwire_resent"
# data: URLs shorter than this are sent on as they are: a reference is a few
# hundred characters, and a small image costs vLLM little to take in.
MIN_URL_CHARS = 4096
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ResentImage:
    """What a resent image's reference names: the SHA-256 (hex) and size of
    the bytes its ``data:`` URL decodes to, and when the reference expires."""

    sha256: str
    nbytes: int
    expires_at: float

    def check(self, now: float) -> None:
        """Refuses an expired reference."""
        if now > self.expires_at:
            raise DescriptorError("this resent image's reference has expired")


def encode_resent(sha256: str, nbytes: int, secret: bytes, lease_seconds: float) -> str:
    """The signed reference to bytes of ``sha256`` and ``nbytes``, valid
    for ``lease_seconds``."""
    payload = {"sha256": sha256, "bytes": nbytes, "expires_at": time.time() + lease_seconds}
    return encode_reference({KEY: payload}, secret)


def resent_image(descriptor: dict[str, Any]) -> ResentImage | None:
    """The resent image a decoded reference names; None for any other
    descriptor. A malformed one is refused."""
    payload = descriptor.get(KEY)
    if payload is None:
        return None
    if not (
        isinstance(payload, dict)
        and len(descriptor) == 1
        and set(payload) == {"sha256", "bytes", "expires_at"}
    ):
        raise DescriptorError("malformed resent image reference")
    sha256, nbytes, expires_at = payload["sha256"], payload["bytes"], payload["expires_at"]
    if not (
        isinstance(sha256, str)
        and _SHA256.fullmatch(sha256)
        and isinstance(nbytes, int)
        and not isinstance(nbytes, bool)
        and nbytes >= 0
        and isinstance(expires_at, (int, float))
        and not isinstance(expires_at, bool)
    ):
        raise DescriptorError("malformed resent image reference")
    return ResentImage(sha256, nbytes, float(expires_at))


def data_url_digest(url: str) -> tuple[str, int] | None:
    """The SHA-256 (hex) and size of the bytes a ``data:`` URL holds, read
    with vLLM's grammar (``pixelwire.vllm.data_urls``: a ``;base64`` header,
    strict padded base64); None for a URL vLLM would not decode. A frontend
    notes it for a URL its worker was sent in a request answered 2xx."""
    header, comma, payload = url[5:].partition(",")
    if url[:5].lower() != "data:" or not comma or not header.endswith(";base64"):
        return None
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return None
    return hashlib.sha256(data).hexdigest(), len(data)
