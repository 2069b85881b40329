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
