"""A resent image's reference (pixelwire.resent_reference): what it names
survives signing and parsing, anything else under its key is refused, an
expired one is refused, and the digest a frontend notes for a data: URL is
that of the bytes vLLM's grammar decodes it to (None where vLLM would
refuse the URL)."""

from __future__ import annotations

import base64
import hashlib
import time

import pytest

import pixelwire
from pixelwire.resent_reference import KEY, data_url_digest, encode_resent, resent_image
from pixelwire.signing import SignatureError, decode_reference, encode_reference
from pixelwire.vllm.data_urls import decode_data_url

SECRET = b"resent-secret"
DIGEST = hashlib.sha256(b"x").hexdigest()


def test_a_reference_names_the_digest_size_and_expiry_signed() -> None:
    reference = encode_resent(DIGEST, 1234, SECRET, 30)
    resent = resent_image(decode_reference(reference, SECRET))
    assert resent is not None
    assert (resent.sha256, resent.nbytes) == (DIGEST, 1234)
    assert time.time() + 25 < resent.expires_at <= time.time() + 30
    resent.check(time.time())
    with pytest.raises(pixelwire.DescriptorError, match="expired"):
        resent.check(resent.expires_at + 1)
    with pytest.raises(SignatureError):
        decode_reference(reference, b"another secret")


def test_other_descriptors_are_not_resent_images() -> None:
    assert resent_image({"pixelwire": {"slot": 1}}) is None


@pytest.mark.parametrize(
    "payload",
    [
        "x",
        {"sha256": DIGEST, "bytes": 1},
        {"sha256": DIGEST.upper(), "bytes": 1, "expires_at": 1.0},
        {"sha256": DIGEST[:-1], "bytes": 1, "expires_at": 1.0},
        {"sha256": DIGEST, "bytes": -1, "expires_at": 1.0},
        {"sha256": DIGEST, "bytes": True, "expires_at": 1.0},
        {"sha256": DIGEST, "bytes": 1, "expires_at": "soon"},
        {"sha256": DIGEST, "bytes": 1, "expires_at": 1.0, "extra": 1},
    ],
)
def test_a_malformed_reference_is_refused(payload: object) -> None:
    descriptor = decode_reference(encode_reference({KEY: payload}, SECRET), SECRET)
    with pytest.raises(pixelwire.DescriptorError, match="malformed resent image reference"):
        resent_image(descriptor)
    with pytest.raises(pixelwire.DescriptorError, match="malformed"):
        resent_image({KEY: {"sha256": DIGEST, "bytes": 1, "expires_at": 1.0}, "pixelwire": {}})


@pytest.mark.parametrize(
    "url",
    [
        "data:image/png;base64," + base64.b64encode(b"\x89PNG" + bytes(300)).decode(),
        "data:;base64," + base64.b64encode(b"abc").decode(),
        "data:image/png;base64,YWJj\nZGVm",  # a line break
        "data:image/png;base64,YWJjZA",  # unpadded
        "data:image/png;base64,YW*j",
        "data:image/png,abc",  # not base64
        "data:image/png;BASE64,YWJj",
        "data:image/png;base64 ,YWJj",
        "data:image/png;base64",  # no comma
    ],
)
def test_the_noted_digest_is_of_what_vllms_grammar_decodes(url: str) -> None:
    try:
        data: bytes | None = decode_data_url(url)
    except (ValueError, NotImplementedError):
        data = None
    expected = None if data is None else (hashlib.sha256(data).hexdigest(), len(data))
    assert data_url_digest(url) == expected
