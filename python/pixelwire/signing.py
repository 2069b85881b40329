"""Descriptor references: a published image's descriptor as one string that
rides in an OpenAI ``image_url.url``, so any OpenAI-compatible hop passes it
unchanged, optionally signed with HMAC-SHA256.

Form: ``pixelwire:1.<payload>.<signature>`` where ``payload`` is the
base64url (unpadded) canonical JSON of the descriptor (sorted keys, no
spaces) and ``signature`` the base64url HMAC-SHA256 of everything before the
last dot, empty when unsigned. The signed bytes are the exact text that
travels, so nothing has to be re-canonicalised to check it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
from typing import Any

from pixelwire._native import DescriptorError

PREFIX = "pixelwire:"
VERSION = "1"
# A descriptor with its NIXL metadata is a few KiB; anything far larger is
# not one of ours and is refused before any parsing.
MAX_REFERENCE_CHARS = 64 * 1024


class SignatureError(DescriptorError):
    """A descriptor reference is unsigned where a signature is required, or
    its signature does not match (altered, or minted with another secret)."""


def secret_from_env() -> bytes | None:
    """``PIXELWIRE_SECRET`` as bytes, or None when unset or empty."""
    value = os.environ.get("PIXELWIRE_SECRET", "")
    return value.encode() if value else None


def is_reference(url: object) -> bool:
    """Whether ``url`` is a pixelwire descriptor reference (any case)."""
    return isinstance(url, str) and url[: len(PREFIX)].lower() == PREFIX


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as e:
        raise DescriptorError(f"descriptor reference is not valid base64url: {e}") from None


def _mac(secret: bytes, signed: str) -> bytes:
    return hmac.new(secret, signed.encode("ascii"), hashlib.sha256).digest()


def encode_reference(descriptor: dict[str, Any], secret: bytes | None = None) -> str:
    """The reference string for a descriptor dict, signed when ``secret`` is given."""
    canonical = json.dumps(descriptor, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    signed = f"{PREFIX}{VERSION}.{_b64(canonical.encode('ascii'))}"
    signature = _b64(_mac(secret, signed)) if secret else ""
    return f"{signed}.{signature}"


def decode_reference(reference: str, secret: bytes | None = None) -> dict[str, Any]:
    """The descriptor a reference carries. With a ``secret`` the signature
    must be present and match, checked before the payload is parsed;
    without one, signed and unsigned references are both accepted."""
    if not is_reference(reference):
        raise DescriptorError("not a pixelwire descriptor reference")
    if len(reference) > MAX_REFERENCE_CHARS:
        raise DescriptorError(f"descriptor reference is over {MAX_REFERENCE_CHARS} characters")
    body = reference[len(PREFIX) :]
    version, _, rest = body.partition(".")
    if version != VERSION:
        raise DescriptorError(f"unsupported descriptor reference version {version[:8]!r}")
    payload, dot, signature = rest.rpartition(".")
    if not dot or not payload:
        raise DescriptorError("malformed descriptor reference")
    if secret:
        if not signature:
            raise SignatureError("descriptor reference is unsigned but PIXELWIRE_SECRET is set")
        expected = _mac(secret, reference[: len(reference) - len(signature) - 1])
        if not hmac.compare_digest(expected, _unb64(signature)):
            raise SignatureError("descriptor reference signature does not match")
    try:
        descriptor = json.loads(_unb64(payload))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DescriptorError(f"descriptor reference payload is not JSON: {e}") from None
    if not isinstance(descriptor, dict):
        raise DescriptorError("descriptor reference payload is not a JSON object")
    return descriptor
