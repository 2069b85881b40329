"""Descriptor references and descriptor validation: what the
signature binds, the worker's fail-closed policy, strict base64url, bounded
numbers, and no computed content hash in any message."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

import pixelwire
from pixelwire import signing
from pixelwire.descriptor import parse_descriptor
from pixelwire.signing import SignatureError, decode_reference, encode_reference, is_reference

SECRET = b"signing-test-secret"


def _descriptor() -> dict[str, Any]:
    """A well-formed descriptor (as Decoded.to_dict makes it), resized."""
    return {
        "nixl_metadata": "b64:AAAA",
        "nixl_descriptor": {"addr": 1 << 20, "size": 4 * 6 * 3, "mem_type": "Dram", "device_id": 0},
        "shape": [4, 6, 3],
        "dtype": "UINT8",
        "metadata": {"format": "PNG", "color_type": "RGB", "layout": "HWC"},
        "content_hash": "xxh3-256k:0123456789abcdef",
        "pixelwire": {
            "agent": "pixelwire-frontend-1",
            "slot": 3,
            "generation": 7,
            "expires_at": 1_900_000_000.5,
            "notification": "pw1:3:7",
            "background": [255, 255, 255],
            "published_at": 1_899_999_990.0,
            "source_sha256": "ab" * 32,
            "metadata_version": 2,
            "resize": {"policy": "qwen2_vl:factor=28", "source": [8, 12]},
        },
    }


def _reencoded(reference: str, change: Callable[[dict[str, Any]], None]) -> str:
    """The same reference and signature around a changed payload."""
    signed, _, signature = reference.rpartition(".")
    head, _, payload = signed.rpartition(".")
    descriptor = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    change(descriptor)
    text = json.dumps(descriptor, sort_keys=True, separators=(",", ":")).encode()
    return f"{head}.{base64.urlsafe_b64encode(text).rstrip(b'=').decode()}.{signature}"


# -- 1. what the signature binds, and the worker's policy ----------------------


def test_signing_round_trip_and_refusals() -> None:
    descriptor = {"b": [1, 2], "a": {"z": "ü"}}
    signed = encode_reference(descriptor, SECRET)
    assert signed.startswith("pixelwire:1.") and is_reference(signed)
    assert decode_reference(signed, SECRET) == descriptor
    assert decode_reference(signed, None) == descriptor  # no secret here: signature not required
    unsigned = encode_reference(descriptor)
    assert unsigned.endswith(".")
    with pytest.raises(SignatureError, match="unsigned"):
        decode_reference(unsigned, SECRET)
    with pytest.raises(SignatureError, match="does not match"):
        decode_reference(encode_reference(descriptor, b"other"), SECRET)
    head, payload, signature = signed.rsplit(".", 2)
    flipped = payload[:-1] + ("A" if payload[-1] != "A" else "B")
    with pytest.raises(SignatureError):
        decode_reference(f"{head}.{flipped}.{signature}", SECRET)
    for bad in ("pixelwire:2.e30.", "pixelwire:1", "pixelwire:1.!!!.", "pixelwire:1.W10.", "http://x"):
        with pytest.raises(pixelwire.DescriptorError):
            decode_reference(bad, None)
    with pytest.raises(pixelwire.DescriptorError, match="over"):
        decode_reference("pixelwire:1." + "A" * 70000 + ".", None)
    assert issubclass(SignatureError, pixelwire.PixelwireError)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["pixelwire"].__setitem__("expires_at", d["pixelwire"]["expires_at"] + 3600),
        lambda d: d["pixelwire"].__setitem__("source_sha256", "cd" * 32),
        lambda d: d["pixelwire"]["resize"].__setitem__("policy", "qwen2_vl:factor=14"),
        lambda d: d["pixelwire"]["resize"].__setitem__("source", [16, 24]),
        lambda d: d["pixelwire"].pop("resize"),
        lambda d: d.__setitem__("content_hash", "xxh3-256k:fedcba9876543210"),
        lambda d: d["nixl_descriptor"].__setitem__("addr", 1 << 21),
        lambda d: d["pixelwire"].__setitem__("extra", 1),
    ],
    ids=[
        "expires_at",
        "source_sha256",
        "resize.policy",
        "resize.source",
        "resize-removed",
        "hash",
        "addr",
        "added",
    ],
)
def test_signature_binds_expiry_cache_identity_and_resize(change: Callable[[dict[str, Any]], None]) -> None:
    reference = encode_reference(_descriptor(), SECRET)
    assert decode_reference(reference, SECRET) == _descriptor()
    with pytest.raises(SignatureError, match="does not match"):
        decode_reference(_reencoded(reference, change), SECRET)


def test_a_worker_without_a_secret_refuses_references_unless_told_the_network_is_trusted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PIXELWIRE_SECRET", raising=False)
    monkeypatch.delenv("PIXELWIRE_ALLOW_UNSIGNED", raising=False)
    for typo in (None, "", "on", "Yes", "2"):
        if typo is not None:
            monkeypatch.setenv("PIXELWIRE_ALLOW_UNSIGNED", typo)
        with pytest.raises(SignatureError, match=r"PIXELWIRE_SECRET.*PIXELWIRE_ALLOW_UNSIGNED=1"):
            signing.reference_secret()
        assert "refused" in signing.signing_policy()
    monkeypatch.setenv("PIXELWIRE_ALLOW_UNSIGNED", "1")
    assert signing.reference_secret() is None
    assert "unsigned accepted" in signing.signing_policy()
    # A secret always wins: signatures are then required.
    monkeypatch.setenv("PIXELWIRE_SECRET", SECRET.decode())
    assert signing.reference_secret() == SECRET
    assert "required" in signing.signing_policy() and "ignored" in signing.signing_policy()
    with pytest.raises(SignatureError, match="unsigned"):
        decode_reference(encode_reference(_descriptor()), signing.reference_secret())


# -- 5. strict base64url, bounded numbers -------------------------------------


def test_non_canonical_base64url_is_refused() -> None:
    reference = encode_reference(_descriptor(), SECRET)
    signed, _, signature = reference.rpartition(".")
    head, _, payload = signed.rpartition(".")
    assert len(signature) == 43  # 32 bytes: the last character carries 2 spare bits
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    spare_bits = alphabet[alphabet.index(signature[-1]) ^ 1]
    bad_signatures = [
        signature + "=",  # padding
        signature[:10] + "!" + signature[10:],  # outside the alphabet (dropped by a lax decoder)
        signature[:10] + "\n" + signature[10:],
        signature[:-1] + spare_bits,  # same bytes, other text
        signature.replace("-", "+").replace("_", "/"),  # the standard alphabet
    ]
    for bad in bad_signatures:
        if bad == signature:
            continue
        with pytest.raises(pixelwire.DescriptorError, match="base64url"):
            decode_reference(f"{signed}.{bad}", SECRET)
    # "e30" is "{}" with its 2 spare bits clear; "e31" the same bytes with one set.
    assert decode_reference(f"{head}.e30.", None) == {}
    for bad_payload in (payload + "==", payload[:5] + " " + payload[5:], "+" + payload[1:], "e31"):
        with pytest.raises(pixelwire.DescriptorError, match="base64url"):
            decode_reference(f"{head}.{bad_payload}.", None)


@pytest.mark.parametrize(
    "payload",
    [b"[" * 40000, b'{"a":' * 5000 + b"1" + b"}" * 5000, b'{"n":' + b"9" * 5000 + b"}"],
    ids=["deep-list", "deep-object", "huge-int"],
)
def test_hostile_payloads_are_descriptor_errors(payload: bytes) -> None:
    reference = f"pixelwire:1.{base64.urlsafe_b64encode(payload).rstrip(b'=').decode()}."
    with pytest.raises(pixelwire.DescriptorError):
        decode_reference(reference, None)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    *parents, key = path.split(".")

    def change(d: dict[str, Any]) -> None:
        for parent in parents:
            d = d[parent]
        d[key] = value

    return change


@pytest.mark.parametrize(
    "change",
    [
        _set("nixl_descriptor.addr", 2**64),
        _set("nixl_descriptor.addr", 2**64 - 8),  # addr + size past the address space
        _set("nixl_descriptor.addr", 10**30),
        _set("nixl_descriptor.size", 2**64),
        _set("nixl_descriptor.size", 2**63),
        _set("pixelwire.slot", 2**64),
        _set("pixelwire.generation", 2**64),
        _set("pixelwire.metadata_version", 2**64),
        _set("pixelwire.metadata_pruned", 2**64),
        _set("pixelwire.metadata_pruned", "0"),
        _set("shape", [2**40, 2**40, 3]),
        _set("nixl_descriptor.addr", 1.5),
        _set("nixl_descriptor.addr", True),
        _set("pixelwire.slot", -1),
    ],
    ids=[
        "addr-2^64",
        "addr+size",
        "addr-10^30",
        "size-2^64",
        "size-2^63",
        "slot",
        "generation",
        "metadata_version",
        "metadata_pruned",
        "metadata_pruned-str",
        "shape",
        "float",
        "bool",
        "negative",
    ],
)
def test_out_of_range_numbers_are_descriptor_errors(change: Callable[[dict[str, Any]], None]) -> None:
    bad = _descriptor()
    change(bad)
    with pytest.raises(pixelwire.DescriptorError):
        parse_descriptor(bad, None)


def test_the_largest_native_values_still_parse() -> None:
    edge = _descriptor()
    top = 2**64 - 1
    edge["pixelwire"].update(
        slot=top, generation=top, metadata_version=top, metadata_pruned=top, notification=f"pw1:{top}:{top}"
    )
    source = parse_descriptor(edge, None)
    assert (source.slot, source.generation, source.metadata_version, source.metadata_pruned) == (top,) * 4


# -- over real NIXL ------------------------------------------------------------

try:
    pixelwire.transfer.nixl_library_path()
    HAVE_NIXL = True
except pixelwire.TransferError:  # pragma: no cover - CI installs it
    HAVE_NIXL = False
needs_nixl = pytest.mark.skipif(not HAVE_NIXL, reason="NIXL runtime not installed")


@needs_nixl
def test_an_addr_past_u64_is_a_descriptor_error_not_an_overflow() -> None:
    """A 2^64 addr reached the native reader as an OverflowError (a 500)."""
    bad = _descriptor()
    bad["nixl_descriptor"]["addr"] = 2**64
    bad["pixelwire"]["expires_at"] = time.time() + 60

    async def main() -> None:
        async with pixelwire.Reader(timeout=5) as reader:
            await reader.read_decoded(bad, output="numpy")

    with pytest.raises(pixelwire.DescriptorError, match="addr"):
        asyncio.run(main())


# -- 4. no computed hash in messages ------------------------------------------


@needs_nixl
def test_a_wrong_content_hash_error_never_carries_the_hash_the_reader_computed(
    random_png: Callable[..., bytes],
) -> None:
    from pixelwire.publisher_process import PublisherProcess

    data = random_png(48, 32, seed=11)
    expected = pixelwire.decode_image(data)
    real_hash = pixelwire.content_hash(expected.tobytes())
    publisher = PublisherProcess(pool_bytes=16 << 20, lease=60.0, acquire=5.0)
    try:
        descriptor = publisher.publish(data)["desc"]
        assert descriptor["content_hash"] == real_hash
        forged = copy.deepcopy(descriptor)
        forged["content_hash"] = (
            "xxh3-256k:0123456789abcdef"
            if real_hash != "xxh3-256k:0123456789abcdef"
            else "xxh3-256k:fedcba9876543210"
        )

        async def main() -> str:
            async with pixelwire.Reader(timeout=10) as reader:
                with pytest.raises(pixelwire.TransferError) as caught:
                    await reader.read_decoded(forged, output="numpy")
                return str(caught.value)

        message = asyncio.run(main())
    finally:
        publisher.close()
    assert "content hash" in message
    assert real_hash not in message and real_hash.upper() not in message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("notification", "pw1:1:2\n"),
        ("notification", "pw1:\u0661:\u0662"),
        ("content_hash", "xxh3-256k:0123456789abcdef\n"),
    ],
)
def test_descriptor_formats_are_whole_ascii_matches(field: str, value: str) -> None:
    """A trailing newline or non-ASCII digits are not a notification or a hash
    (the native side would read them otherwise)."""
    desc = _descriptor()
    if field == "notification":
        desc["pixelwire"]["notification"] = value
    else:
        desc["content_hash"] = value
    with pytest.raises(pixelwire.DescriptorError):
        parse_descriptor(desc, None)


def test_the_secret_fingerprint_tells_secrets_apart_and_reveals_none() -> None:
    """Both sides of the handshake show it; it is 16 hex characters, equal
    for equal secrets, and not the secret, nor a plain hash of it."""
    import hashlib

    from pixelwire.signing import secret_fingerprint

    one, other = secret_fingerprint(b"s3cret-one"), secret_fingerprint(b"s3cret-two")
    assert len(one) == 16 and int(one, 16) >= 0
    assert one == secret_fingerprint(b"s3cret-one") and one != other
    assert "s3cret" not in one and one not in hashlib.sha256(b"s3cret-one").hexdigest()
    assert secret_fingerprint(None) == secret_fingerprint(b"") == "none"
