"""The frontend's memo of decoded data: URLs (pixelwire.caches.data_urls): a
resent URL gets the very bytes object (and digest) decoded the first time,
only for the same text, whole, and the same salt; it holds no more than its
budget, least recently used first out."""

from __future__ import annotations

import base64
import hashlib

from pixelwire.caches.data_urls import DataUrlMemo


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
    assert memo.held_bytes == 3 * size
    assert memo.lookup(entries[1][0], None) is None  # the least recent went
    for url, data in (entries[0], entries[2], entries[3]):
        assert memo.lookup(url, None) is data
    # One larger than the whole budget is not held, and pushes nothing out.
    memo.remember(_url(bytes(4 * size)), None, bytes(4 * size))
    assert memo.held_bytes == 3 * size
    memo.clear()
    assert memo.held_bytes == 0 and memo.lookup(entries[0][0], None) is None


def test_a_memo_without_budget_holds_nothing() -> None:
    memo = DataUrlMemo(0)
    memo.remember(_url(b"x"), None, b"x")
    assert memo.held_bytes == 0 and memo.lookup(_url(b"x"), None) is None


def test_a_url_held_by_its_digest_gives_the_digest_and_size_only_for_its_text_and_salt() -> None:
    """What a worker-mode frontend keeps of the URLs its worker was sent:
    the text and its bytes' digest, not the bytes; equal text under the
    same salt finds them, another salt or another text does not, and a
    forgotten one is gone."""
    memo = DataUrlMemo(1 << 20)
    data = bytes(range(256)) * 20
    url = _url(data)
    digest = hashlib.sha256(data).hexdigest()
    memo.remember_digest(url, "tenant-1", digest, len(data))
    assert memo.held_bytes == len(url), "the text only"
    assert memo.lookup_digest("".join(list(url)), "tenant-1") == (digest, len(data))
    assert memo.lookup_digest(url, "tenant-2") is None and memo.lookup_digest(url, None) is None
    assert memo.lookup(url, "tenant-1") is None, "no bytes to hand out"
    assert memo.by_sha256(digest) is None, "no bytes to hand out"
    memo.forget(url, "tenant-1")
    assert memo.lookup_digest(url, "tenant-1") is None and memo.held_bytes == 0


def test_bytes_are_found_by_their_noted_digest_until_they_go() -> None:
    """The plug-in's side: bytes whose digest was noted are found by it (a
    resent image's reference), the same object; evicted or forgotten, they
    are not, and a second URL of the same bytes keeps them findable when
    the first goes."""
    data = bytes(range(256)) * 4
    first, second = _url(data), "data:image/x-png;base64," + base64.b64encode(data).decode()
    digest = hashlib.sha256(data).hexdigest()
    size = len(first) + len(data)
    memo = DataUrlMemo(2 * size + len(second) - len(first))
    memo.remember(first, None, data)
    assert memo.by_sha256(digest) is None, "no digest noted yet"
    memo.note_sha256(data, digest)
    assert memo.by_sha256(digest) is data
    copy = bytes(bytearray(data))
    memo.remember(second, None, copy)
    memo.note_sha256(copy, digest)
    memo.forget(first, None)
    assert memo.by_sha256(digest) is copy
    other = bytes(2 * size)
    memo.remember(_url(b"y"), None, b"y")
    memo.remember(_url(other[: size // 2]), None, other[: size // 2])  # pushes the oldest out
    assert memo.lookup(second, None) is None
    assert memo.by_sha256(digest) is None
