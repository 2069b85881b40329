"""atheris harness for the Python descriptor and reference parsing
(pixelwire.signing.decode_reference, pixelwire.descriptor.parse_descriptor).

Optional; needs atheris (pip install atheris numpy in a throwaway venv) and
the built extension (python/pixelwire/_native.abi3.so, `make build-dev`):

    PYTHONPATH=python python fuzz/python/descriptors.py -atheris_runs=1000000

Invariants: only DescriptorError (SignatureError is one) escapes; what
_parse accepts is what the native side can use (ASCII-digit notification
the Rust parse_notification reads back, an `xxh3-256k:` content hash, u64
fields); encode_reference / decode_reference round-trip.
"""

from __future__ import annotations

import json
import math
import re
import sys

import atheris

with atheris.instrument_imports():
    from pixelwire import descriptor, signing
    from pixelwire._native import DescriptorError

_U64 = 1 << 64
_RUST_NOTE = re.compile(r"pw1:[0-9]+:[0-9]+(:[1-9][0-9]*)?")
_RUST_HASH = re.compile(r"xxh3-256k:[0-9a-f]{16}")

TEMPLATE = {
    "nixl_metadata": "b64:eJzLSM3JyVcozy/KSQEAGgsEXQ==",
    "dtype": "UINT8",
    "shape": [2, 3, 3],
    "content_hash": "xxh3-256k:0123456789abcdef",
    "nixl_descriptor": {"addr": 4096, "size": 18, "mem_type": "Dram"},
    "pixelwire": {
        "notification": "pw1:1:2",
        "agent": "front",
        "expires_at": 1.7e9,
        "slot": 1,
        "generation": 2,
        "metadata_version": 1,
    },
    "metadata": {"layout": "HWC"},
}
RDMA = {
    "nixl_metadata": "b64:eJzLSM3JyVcozy/KSQEAGgsEXQ==",
    "descriptors": [{"ptr": 4096, "size": 18, "device": "cpu"}],
    "notification_key": "k",
}
PATHS = [(), ("nixl_descriptor",), ("pixelwire",), ("metadata",)]


def value(fdp: atheris.FuzzedDataProvider, depth: int = 0):
    kind = fdp.ConsumeIntInRange(0, 11)
    if kind == 0:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 80))
    if kind == 1:
        return fdp.ConsumeIntInRange(-2, 20)
    if kind == 2:
        return fdp.ConsumeRegularFloat() if fdp.ConsumeBool() else fdp.PickValueInList([math.nan, math.inf, -0.0])
    if kind == 3:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 40))
    if kind == 4:
        return "pw1:" + fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))
    if kind == 5:
        return fdp.ConsumeBool()
    if kind == 6:
        return None
    if kind == 7 and depth < 2:
        return [value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    if kind == 8 and depth < 2:
        return {fdp.ConsumeUnicodeNoSurrogates(6): value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))}
    if kind == 9:
        return "b64:" + fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 30))
    if kind == 10:
        return fdp.PickValueInList(["Dram", "UINT8", "HWC", "RGBX", "cpu", "dram", "VRAM", "xxh3-256k:0123456789abcdef", "0123456789abcdef"])
    return fdp.ConsumeIntInRange(0, 1 << 66)


def mutate(fdp: atheris.FuzzedDataProvider) -> dict:
    desc = json.loads(json.dumps(RDMA if fdp.ConsumeIntInRange(0, 7) == 0 else TEMPLATE))
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        where = desc
        for key in fdp.PickValueInList(PATHS):
            if isinstance(where.get(key), dict):
                where = where[key]
        keys = list(where) + ["extra"]
        key = fdp.PickValueInList(keys)
        if fdp.ConsumeIntInRange(0, 9) == 0:
            where.pop(key, None)
        else:
            where[key] = value(fdp)
    return desc


def check_source(src) -> None:
    if src.slot is not None:  # a pixelwire descriptor (RdmaMetadata keys are free-form)
        assert _RUST_NOTE.fullmatch(src.notification), repr(src.notification)
    if src.content_hash is not None:
        assert _RUST_HASH.fullmatch(src.content_hash), repr(src.content_hash)
    for field in ("addr", "size", "slot", "generation", "metadata_version"):
        v = getattr(src, field)
        assert v is None or (isinstance(v, int) and 0 <= v < _U64), (field, v)
    assert src.addr + src.size <= _U64
    h, w, c = src.shape
    assert h > 0 and w > 0 and c in (1, 3, 4)


def one(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 3)
    secret = fdp.PickValueInList([None, b"s3cret"])
    try:
        if mode == 0:
            # A raw reference string.
            desc = signing.decode_reference(fdp.ConsumeUnicodeNoSurrogates(4096), secret)
            assert isinstance(desc, dict)
            src = descriptor.parse_descriptor(desc, None)
        elif mode == 1:
            # Arbitrary bytes as the JSON payload of a well-formed reference.
            payload = fdp.ConsumeBytes(4096)
            signed = f"{signing.PREFIX}{signing.VERSION}.{signing._b64(payload)}"
            sig = signing._b64(signing._mac(secret, signed)) if secret else ""
            desc = signing.decode_reference(f"{signed}.{sig}", secret)
            src = descriptor.parse_descriptor(desc, None)
        else:
            # A structured descriptor, mutated, through a signed reference.
            desc = mutate(fdp)
            shape = None if mode == 2 else [fdp.ConsumeIntInRange(0, 5) for _ in range(3)]
            try:
                ref = signing.encode_reference(desc, secret)
            except ValueError:  # nan/inf are not JSON
                return
            assert signing.decode_reference(ref, secret) == json.loads(json.dumps(desc))
            src = descriptor.parse_descriptor(desc, shape)
    except DescriptorError:
        return
    check_source(src)


if __name__ == "__main__":
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()
