"""Descriptor references: a published image's descriptor as one string that
rides in an OpenAI ``image_url.url``, so any OpenAI-compatible hop passes it
unchanged, optionally signed with HMAC-SHA256.

Form: ``pixelwire:1.<payload>.<signature>`` where ``payload`` is the
base64url (unpadded) canonical JSON of the descriptor (sorted keys, no
spaces) and ``signature`` the base64url HMAC-SHA256 of everything before the
last dot, empty when unsigned. The signed bytes are the exact text that
travels, so nothing has to be re-canonicalised to check it.

What the signature binds: the whole descriptor, every key of it, and nothing
is read from outside the signed text. That covers what the worker trusts
without being able to check it itself: ``pixelwire.expires_at`` (the lease),
``pixelwire.source_sha256`` (the identity vLLM's caches key on),
``pixelwire.resize`` (the policy and the source size) and ``content_hash``;
changing, adding or removing any key breaks the signature. Both parts are
strict base64url (unpadded, canonical), so one reference has one spelling.

Policy: :func:`decode_reference` checks what its caller asks (``secret=None``
checks nothing). The worker's policy is :func:`reference_secret`: it fails
closed, refusing every reference unless ``PIXELWIRE_SECRET`` is set (then a
matching signature is required) or ``PIXELWIRE_ALLOW_UNSIGNED=1`` says every
client that can reach the worker is trusted.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import re
from typing import Any

from pixelwire._native import DescriptorError
from pixelwire.config import allow_unsigned_from_env, secret_from_env

PREFIX = "pixelwire:"
VERSION = "1"
# A descriptor with its NIXL metadata is a few KiB; anything far larger is
# not one of ours and is refused before any parsing.
MAX_REFERENCE_CHARS = 64 * 1024


class SignatureError(DescriptorError):
    """A descriptor reference is unsigned where a signature is required, or
    its signature does not match (altered, or minted with another secret)."""


_REFUSED_UNSIGNED = (
    "pixelwire descriptor references are refused: this vLLM has no PIXELWIRE_SECRET to check "
    "their signatures with. Set PIXELWIRE_SECRET to the frontend's secret, or "
    "PIXELWIRE_ALLOW_UNSIGNED=1 if every client that can reach this vLLM is trusted"
)


def reference_secret() -> bytes | None:
    """The worker's signing policy, failing closed: the secret references
    must be signed with when ``PIXELWIRE_SECRET`` is set; None (accept
    unsigned) only when ``PIXELWIRE_ALLOW_UNSIGNED=1``; otherwise raises
    :class:`SignatureError` naming both settings (vLLM answers it with 400)."""
    secret = secret_from_env()
    if secret is None and not allow_unsigned_from_env():
        raise SignatureError(_REFUSED_UNSIGNED)
    return secret


def signing_policy() -> str:
    """The policy in words, for the worker's start-up log."""
    if secret_from_env() is not None:
        ignored = " (PIXELWIRE_ALLOW_UNSIGNED ignored)" if allow_unsigned_from_env() else ""
        return f"signatures required (PIXELWIRE_SECRET set){ignored}"
    if allow_unsigned_from_env():
        return "unsigned accepted, no signature checked (PIXELWIRE_ALLOW_UNSIGNED=1: trusted network only)"
    return "every reference refused (neither PIXELWIRE_SECRET nor PIXELWIRE_ALLOW_UNSIGNED=1 is set)"


# The secret fingerprint: PBKDF2-HMAC-SHA256 of the secret with a fixed salt,
# cut to 64 bits. One-way, and slow on purpose: a fingerprint is shown on
# vLLM's /metrics, so a guessable secret could be tested against it offline;
# each guess costs this many HMACs (about 0.1 s once per process here).
FINGERPRINT_SALT = b"pixelwire secret fingerprint"
FINGERPRINT_ITERATIONS = 100_000


@functools.cache
def secret_fingerprint(secret: bytes | None) -> str:
    """What both sides of the start-up handshake show for PIXELWIRE_SECRET:
    16 hex characters that are equal for equal secrets and reveal nothing
    of the secret itself, or ``"none"`` without one."""
    if not secret:
        return "none"
    digest = hashlib.pbkdf2_hmac("sha256", secret, FINGERPRINT_SALT, FINGERPRINT_ITERATIONS)
    return digest.hex()[:16]


def is_reference(url: object) -> bool:
    """Whether ``url`` is a pixelwire descriptor reference (any case)."""
    return isinstance(url, str) and url[: len(PREFIX)].lower() == PREFIX


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def _unb64(text: str) -> bytes:
    """Strict, canonical base64url: the alphabet only, no padding, no spare
    bits set; so the decoded bytes have exactly one spelling."""
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise DescriptorError("descriptor reference is not valid base64url (unpadded, canonical)")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise DescriptorError("descriptor reference is not valid base64url (unpadded, canonical)") from None
    if _b64(data) != text:
        raise DescriptorError("descriptor reference is not valid base64url (unpadded, canonical)")
    return data


def _mac(secret: bytes, signed: str) -> bytes:
    # One-shot: OpenSSL's HMAC in one call, without an HMAC object per reference.
    return hmac.digest(secret, signed.encode("ascii"), "sha256")


def encode_reference(descriptor: dict[str, Any], secret: bytes | None = None) -> str:
    """The reference string for a descriptor dict, signed when ``secret`` is given."""
    canonical = json.dumps(descriptor, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    signed = f"{PREFIX}{VERSION}.{_b64(canonical.encode('ascii'))}"
    signature = _b64(_mac(secret, signed)) if secret else ""
    return f"{signed}.{signature}"


def decode_reference(reference: str, secret: bytes | None) -> dict[str, Any]:
    """The descriptor a reference carries. With a ``secret`` the signature
    must be present and match, checked before the payload is parsed.
    ``secret=None`` is the caller's explicit choice not to check: signed and
    unsigned references are then both accepted. A worker gets its secret
    from :func:`reference_secret`, which refuses unless one is set or
    ``PIXELWIRE_ALLOW_UNSIGNED=1``."""
    if not is_reference(reference):
        raise DescriptorError("not a pixelwire descriptor reference")
    if len(reference) > MAX_REFERENCE_CHARS:
        raise DescriptorError(f"descriptor reference is over {MAX_REFERENCE_CHARS} characters")
    body = reference[len(PREFIX) :]
    version, _, rest = body.partition(".")
    if version != VERSION:
        raise DescriptorError(f"unsupported descriptor reference version {version[:8]!r}")
    payload, dot, signature = rest.rpartition(".")
    if not dot or not payload or not reference.isascii():
        raise DescriptorError("malformed descriptor reference")
    if not _B64URL.fullmatch(payload):
        raise DescriptorError("descriptor reference is not valid base64url (unpadded, canonical)")
    mac = _unb64(signature)  # its form is checked even where it is not
    if secret:
        if not signature:
            raise SignatureError("descriptor reference is unsigned but PIXELWIRE_SECRET is set")
        expected = _mac(secret, reference[: len(reference) - len(signature) - 1])
        if not hmac.compare_digest(expected, mac):
            raise SignatureError("descriptor reference signature does not match")
    try:
        descriptor = json.loads(_unb64(payload))
    except (ValueError, RecursionError) as e:
        # ValueError: not UTF-8, not JSON, or an integer of thousands of
        # digits; RecursionError: nesting no descriptor has.
        raise DescriptorError(f"descriptor reference payload is not a descriptor's JSON: {e}") from None
    if not isinstance(descriptor, dict):
        raise DescriptorError("descriptor reference payload is not a JSON object")
    return descriptor
