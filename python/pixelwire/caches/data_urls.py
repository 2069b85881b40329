"""The ``data:`` URLs a frontend decoded lately, by their exact text and the
request's ``cache_salt``: a resent one gets the same bytes object back,
and the SHA-256 the cache keys on with it, instead of being
base64-decoded and hashed again (a resent 1080p screenshot is half a
megabyte of base64, and those two passes were most of its cost).

A lookup matches only the same text, compared whole, under the same salt,
so what it returns is what decoding the URL would give. The salt keeps one
tenant from timing another's resends. Texts and bytes are held within a
byte budget, least recently used first out. The frontend's publisher keeps
one beside its cache; the vLLM plug-in, in worker mode, one beside its own
(unsalted, as that cache is), where a resent image's reference
(:mod:`pixelwire.resent_reference`) finds the bytes by their digest. A
frontend in worker mode keeps one of the URLs its worker was sent, by
their digest only (:meth:`DataUrlMemo.remember_digest`): it sends a resent
one on as such a reference.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

# Characters of a URL's end in its bucket key, beside its length and salt:
# enough to tell apart images of the same length (a PNG's last IDAT checksum
# is there); the whole text is compared before anything is returned.
_TAIL_CHARS = 256


@dataclass
class _Known:
    url: str
    # None where only the digest is held (remember_digest).
    data: bytes | None
    sha256: str | None = None
    # The decoded size: len(data), or what remember_digest was told.
    nbytes: int = 0
    salt: str | None = None

    @property
    def held(self) -> int:
        return len(self.url) + (len(self.data) if self.data is not None else 0)


class DataUrlMemo:
    """Decoded ``data:`` URLs, within ``budget`` bytes of text and data: a
    :class:`~pixelwire.caches.interface.Cache` keyed by a URL's text and salt."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held_bytes = 0
        self.hits = 0
        self.misses = 0
        self._by_url: OrderedDict[tuple[str | None, int, str], _Known] = OrderedDict()
        # By the id of the bytes object handed out: the entry holds it, so
        # the id is its own while the entry lives.
        self._by_data: dict[int, _Known] = {}
        # By the decoded bytes' SHA-256, once noted: the latest entry of it.
        self._by_sha256: dict[str, _Known] = {}
        # vLLM may load a request's media on several threads.
        self._lock = threading.Lock()

    def lookup(self, url: str, salt: str | None) -> bytes | None:
        """The bytes ``url`` decoded to when it was remembered under
        ``salt``; None when it was not, or is no longer, held."""
        key = _key(url, salt)
        with self._lock:
            known = self._by_url.get(key)
            if known is None or known.url != url:
                self.misses += 1
                return None
            self._by_url.move_to_end(key)
            self.hits += 1
            return known.data

    def lookup_digest(self, url: str, salt: str | None) -> tuple[str, int] | None:
        """The SHA-256 and size of what ``url`` decodes to, when it was
        remembered under ``salt`` with its digest; None otherwise."""
        key = _key(url, salt)
        with self._lock:
            known = self._by_url.get(key)
            if known is None or known.sha256 is None or known.url != url:
                self.misses += 1
                return None
            self._by_url.move_to_end(key)
            self.hits += 1
            return known.sha256, known.nbytes

    def by_sha256(self, sha256: str) -> bytes | None:
        """Bytes held whose SHA-256 was noted as ``sha256``, or None."""
        with self._lock:
            known = self._by_sha256.get(sha256)
            if known is None or known.data is None:
                self.misses += 1
                return None
            self._by_url.move_to_end(_key(known.url, known.salt))
            self.hits += 1
            return known.data

    def remember(self, url: str, salt: str | None, data: bytes) -> None:
        """Holds ``data``, which ``url`` decodes to, for ``salt``'s resends."""
        self._hold(_Known(url, data, nbytes=len(data)), salt)

    def remember_digest(self, url: str, salt: str | None, sha256: str, nbytes: int) -> None:
        """Holds ``url`` with the SHA-256 and size of what it decodes to,
        not the bytes themselves."""
        self._hold(_Known(url, None, sha256, nbytes), salt)

    def __contains__(self, key: tuple[str, str | None]) -> bool:
        """Whether the URL and salt of ``key`` are held (not counted as a lookup)."""
        url, salt = key
        with self._lock:
            known = self._by_url.get(_key(url, salt))
            return known is not None and known.url == url

    def forget(self, url: str, salt: str | None) -> None:
        """Lets go of ``url`` remembered under ``salt``, if it is held."""
        key = _key(url, salt)
        with self._lock:
            known = self._by_url.get(key)
            if known is not None and known.url == url:
                del self._by_url[key]
                self._drop(known)

    def _hold(self, known: _Known, salt: str | None) -> None:
        if known.held > self.budget:
            return
        known.salt = salt
        key = _key(known.url, salt)
        with self._lock:
            old = self._by_url.pop(key, None)
            if old is not None:
                self._drop(old)
            self._by_url[key] = known
            if known.data is not None:
                self._by_data[id(known.data)] = known
            if known.sha256 is not None:
                self._by_sha256[known.sha256] = known
            self.held_bytes += known.held
            while self.held_bytes > self.budget:
                _, oldest = self._by_url.popitem(last=False)
                self._drop(oldest)

    def sha256(self, data: bytes | bytearray) -> str | None:
        """The SHA-256 noted for ``data``, the very object a lookup returned."""
        with self._lock:
            known = self._by_data.get(id(data))
            return known.sha256 if known is not None and known.data is data else None

    def note_sha256(self, data: bytes | bytearray, sha256: str) -> None:
        """Notes ``data``'s SHA-256, if ``data`` is an object held here."""
        with self._lock:
            known = self._by_data.get(id(data))
            if known is not None and known.data is data:
                known.sha256 = sha256
                self._by_sha256[sha256] = known

    def clear(self) -> None:
        with self._lock:
            self._by_url.clear()
            self._by_data.clear()
            self._by_sha256.clear()
            self.held_bytes = 0

    def _drop(self, known: _Known) -> None:
        if known.data is not None and self._by_data.get(id(known.data)) is known:
            del self._by_data[id(known.data)]
        if known.sha256 is not None and self._by_sha256.get(known.sha256) is known:
            del self._by_sha256[known.sha256]
        self.held_bytes -= known.held


def _key(url: str, salt: str | None) -> tuple[str | None, int, str]:
    return (salt, len(url), url[-_TAIL_CHARS:])
