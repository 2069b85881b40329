"""What vLLM's multimodal caches key frontend-decoded media on: the bytes
its hasher reads in place of the encoded medium."""

from __future__ import annotations

import hashlib
import hmac

from pixelwire.config import secret_from_env


def keyed_identity(identity: str) -> bytes:
    """``identity`` (what the pixels are: the source digest and everything
    that shaped them), keyed with PIXELWIRE_SECRET when there is one, so
    nobody without the secret can compute it, and tagged, so it is no
    medium's encoded bytes either."""
    secret = secret_from_env()
    message = identity.encode()
    digest = (
        hmac.new(secret, message, hashlib.sha256).digest()
        if secret is not None
        else hashlib.sha256(message).digest()
    )
    return b"pixelwire-cache-identity:" + digest


def cache_identity(
    source_sha256: str, mode: str | None, background: tuple[int, int, int], policy: str
) -> bytes:
    """What vLLM's multimodal caches key a frontend-decoded image on: the
    signed identity of the pixels (source digest, mode, background, resize
    policy), keyed (:func:`pixelwire.vllm.identity.keyed_identity`)."""
    return keyed_identity(f"pixelwire-image:{source_sha256}:{mode}:{list(background)}:{policy}")
