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
(unsalted, as that cache is).
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
    data: bytes
    sha256: str | None = None


class DataUrlMemo:
    """Decoded ``data:`` URLs, within ``budget`` bytes of text and data."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self.hits = 0
        self._by_url: OrderedDict[tuple[str | None, int, str], _Known] = OrderedDict()
        # By the id of the bytes object handed out: the entry holds it, so
        # the id is its own while the entry lives.
        self._by_data: dict[int, _Known] = {}
        # vLLM may load a request's media on several threads.
        self._lock = threading.Lock()

    def lookup(self, url: str, salt: str | None) -> bytes | None:
        """The bytes ``url`` decoded to when it was remembered under
        ``salt``; None when it was not, or is no longer, held."""
        key = _key(url, salt)
        with self._lock:
            known = self._by_url.get(key)
            if known is None or known.url != url:
                return None
            self._by_url.move_to_end(key)
            self.hits += 1
            return known.data

    def remember(self, url: str, salt: str | None, data: bytes) -> None:
        """Holds ``data``, which ``url`` decodes to, for ``salt``'s resends."""
        size = len(url) + len(data)
        if size > self.budget:
            return
        key = _key(url, salt)
        known = _Known(url, data)
        with self._lock:
            old = self._by_url.pop(key, None)
            if old is not None:
                self._drop(old)
            self._by_url[key] = known
            self._by_data[id(data)] = known
            self.held += size
            while self.held > self.budget:
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

    def clear(self) -> None:
        with self._lock:
            self._by_url.clear()
            self._by_data.clear()
            self.held = 0

    def _drop(self, known: _Known) -> None:
        self._by_data.pop(id(known.data), None)
        self.held -= len(known.url) + len(known.data)


def _key(url: str, salt: str | None) -> tuple[str | None, int, str]:
    return (salt, len(url), url[-_TAIL_CHARS:])
