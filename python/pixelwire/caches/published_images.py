"""The frontend's cache of published media: a repeated image (the same
encoded bytes, decoded the same way, for the same ``cache_salt``) or video
(the same bytes, sampled and resized the same way, for the same salt) is
handed out again instead of decoded again.

An entry is a published slot the native publisher keeps pinned: the pool
owns its bytes, its budget and its eviction order (least recently used
first, within ``cache_bytes``, and before any publish waits on a full pool);
this module owns the keys, the in-flight decodes and the counts. A hit is a
new hand-out of the slot: a fresh descriptor with its own lease and its own
notification, so each reader ends only its own hand-out and the slot is
freed once it is evicted and no hand-out is outstanding.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass

from pixelwire import _native
from pixelwire.caches.interface import counts
from pixelwire.descriptor import PublishedSlot


@dataclass(frozen=True)
class CacheKey:
    """What determines a published image's pixels, and who may share them:
    requests with different salts (vLLM's ``cache_salt``; none is a salt of
    its own) never share an entry, so one tenant cannot learn from a hit's
    timing that another sent an image."""

    source_sha256: str
    # The encoded length too: two different images would have to collide in
    # SHA-256 at the same length to share an entry.
    source_bytes: int
    mode: str
    background: tuple[int, int, int]
    layout: str
    # The resize policy's identity (None: full resolution).
    resize: str | None
    salt: str | None


@dataclass(frozen=True)
class VideoCacheKey:
    """What determines a published video's frames, and who may share them
    (as :class:`CacheKey`): its bytes, how they were sampled (the loader's
    settings, as the descriptor records them) and the frames' resize."""

    source_sha256: str
    source_bytes: int
    # VideoSampling.to_dict(), as canonical JSON.
    sampling: str
    resize: str | None
    salt: str | None


# What an in-flight decode's waiters get: the published image or video, the
# error the decode failed with, or None when its request went away before it
# ended (each waiter then decodes for itself).
Outcome = PublishedSlot | Exception | None
Key = CacheKey | VideoCacheKey


class PublishCache:
    """Published images by :class:`CacheKey` and videos by
    :class:`VideoCacheKey`, within ``budget`` pool bytes:
    a :class:`~pixelwire.caches.interface.Cache` whose entries' bytes the
    pool holds (pinned; the pool's ``pinned_bytes`` counts them as it
    evicts, which this learns at its next lookup)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.entries: dict[Key, PublishedSlot] = {}
        self.keys: dict[tuple[int, int], Key] = {}
        self.in_flight: dict[Key, asyncio.Future[Outcome]] = {}
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    @property
    def held_bytes(self) -> int:
        return sum(entry.size for entry in self.entries.values())

    def __contains__(self, key: Key) -> bool:
        return key in self.entries

    def hand_out(self, native: _native.NativePublisher, key: Key) -> PublishedSlot | None:
        """A new hand-out of the entry for `key`; None on a miss (no entry,
        or one the pool has evicted since, which is forgotten here)."""
        self._forget_evicted(native)
        entry = self.entries.get(key)
        if entry is None:
            return None
        fields = native.hand_out(entry.slot, entry.generation)
        if fields is None:
            self._forget(native, key)
            return None
        self.hits += 1
        return dataclasses.replace(
            entry,
            nixl_metadata=fields["metadata"],
            metadata_version=fields["metadata_version"],
            metadata_pruned=fields["metadata_pruned"],
            expires_at=fields["expires_at"],
            notification=fields["notification"],
            published_at=time.time(),
        )

    def begin(self, key: Key) -> None:
        """`key` is being decoded: requests for it wait for that decode."""
        self.misses += 1
        self.in_flight[key] = asyncio.get_running_loop().create_future()

    def waiting_on(self, key: Key) -> asyncio.Future[Outcome] | None:
        return self.in_flight.get(key)

    def finish(self, native: _native.NativePublisher, key: Key, outcome: Outcome) -> None:
        """Ends the decode of `key`: a published image is pinned and kept
        (unless it alone is over the budget), an error cached nowhere; every
        waiter gets `outcome`."""
        if isinstance(outcome, PublishedSlot) and native.pin(outcome.slot, outcome.generation, self.budget):
            self._forget_evicted(native)
            self._forget(native, key)
            self.entries[key] = outcome
            self.keys[outcome.slot, outcome.generation] = key
        future = self.in_flight.pop(key, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    def clear(self) -> None:
        """Forgets every entry (the publisher is closing: its pool goes with it)."""
        for key in list(self.in_flight):
            self.finish_abandoned(key)
        self.entries.clear()
        self.keys.clear()

    def finish_abandoned(self, key: Key) -> None:
        """The decode of `key` will not end here (its request went away)."""
        future = self.in_flight.pop(key, None)
        if future is not None and not future.done():
            future.set_result(None)

    def stats(self) -> dict[str, int]:
        return {**counts(self), "entries": len(self.entries)}

    def _forget(self, native: _native.NativePublisher, key: Key) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.keys.pop((entry.slot, entry.generation), None)
            native.unpin(entry.slot, entry.generation)

    def _forget_evicted(self, native: _native.NativePublisher) -> None:
        for slot in native.take_evicted():
            key = self.keys.pop(slot, None)
            if key is not None:
                self.entries.pop(key, None)
