"""The frontend's memo of decoded data: URLs (pixelwire.data_url_memo): a
resent URL gets the very bytes object (and digest) decoded the first time,
only for the same text, whole, and the same salt; it holds no more than its
budget, least recently used first out."""

from __future__ import annotations

import base64
import hashlib

from pixelwire.data_url_memo import DataUrlMemo


def _url(payload: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(payload).decode()


def test_a_resent_url_gets_the_same_bytes_and_digest_for_its_salt_only() -> None:
    memo = DataUrlMemo(1 << 20)
    data = b"\x89PNG" + bytes(range(256)) * 8
    url = _url(data)
    memo.remember(url, "tenant-1", data)
    found = memo.lookup("".join(list(url)), "tenant-1")  # an equal text, another object
    assert found is data
    assert memo.lookup(url, "tenant-2") is None and memo.lookup(url, None) is None
    assert memo.sha256(found) is None
    digest = hashlib.sha256(data).hexdigest()
    memo.note_sha256(found, digest)
    assert memo.sha256(found) == digest
    # Equal bytes that are not the object handed out have no noted digest.
    assert memo.sha256(bytes(bytearray(data))) is None
    assert memo.hits == 1


def test_a_text_differing_only_inside_is_not_taken_for_a_known_one() -> None:
    """Same length, same salt, same end (the bucket's key): the texts are
    compared whole, so a forged or colliding URL never gets another's bytes."""
    memo = DataUrlMemo(1 << 20)
    data = bytes(3000)
    url = _url(data)
    forged = url[:40] + ("B" if url[40] != "B" else "C") + url[41:]
    memo.remember(url, None, data)
    assert memo.lookup(forged, None) is None
    assert memo.lookup(url, None) is data


def test_the_memo_holds_its_budget_least_recently_used_first_out() -> None:
    entries = [(_url(bytes([n]) * 1000), bytes([n]) * 1000) for n in range(5)]
    size = len(entries[0][0]) + len(entries[0][1])
    memo = DataUrlMemo(3 * size)
    for url, data in entries[:3]:
        memo.remember(url, None, data)
    assert memo.lookup(entries[0][0], None) is entries[0][1]  # now the most recent
    memo.remember(entries[3][0], None, entries[3][1])
    assert memo.held == 3 * size
    assert memo.lookup(entries[1][0], None) is None  # the least recent went
    for url, data in (entries[0], entries[2], entries[3]):
        assert memo.lookup(url, None) is data
    # One larger than the whole budget is not held, and pushes nothing out.
    memo.remember(_url(bytes(4 * size)), None, bytes(4 * size))
    assert memo.held == 3 * size
    memo.clear()
    assert memo.held == 0 and memo.lookup(entries[0][0], None) is None


def test_a_memo_without_budget_holds_nothing() -> None:
    memo = DataUrlMemo(0)
    memo.remember(_url(b"x"), None, b"x")
    assert memo.held == 0 and memo.lookup(_url(b"x"), None) is None
