"""Images and videos published through the cache of published media
(:mod:`pixelwire.caches.published_images`): each decoded once however
often it comes, here or in requests running beside this one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from pixelwire import _native
from pixelwire.caches.data_urls import DataUrlMemo
from pixelwire.caches.published_images import CacheKey, Key, Outcome, PublishCache
from pixelwire.descriptor import Decoded, PublishedSlot
from pixelwire.publisher.images import ImageOptions, sha256s
from pixelwire.publisher.off_loop import publish_executor

# Publishes sources (with their SHA-256s when known) off the loop, uncached.
Publish = Callable[[list[bytes | bytearray], Sequence[str] | None], Awaitable[list[Decoded | Exception]]]


async def publish_through_cache(
    cache: PublishCache,
    data_urls: DataUrlMemo,
    native: _native.NativePublisher,
    sources: list[bytes | bytearray],
    options: ImageOptions,
    salt: str | None,
    publish: Publish,
    release: Callable[[Decoded], object],
) -> list[Decoded | Exception]:
    """Every source published through ``cache``, keyed by its SHA-256 (a
    resent ``data:`` URL's from ``data_urls``), ``options`` and ``salt``;
    ``publish`` decodes what the cache does not serve. A caller that goes
    away has every hand-out it got ended (``release``)."""
    loop = asyncio.get_running_loop()
    # A resent data: URL's bytes come with the digest noted the first time.
    noted = [data_urls.sha256(data) for data in sources]
    unknown = [data for data, sha256 in zip(sources, noted, strict=True) if sha256 is None]
    computed = iter(await loop.run_in_executor(publish_executor(), sha256s, unknown) if unknown else [])
    digests = [sha256 if sha256 is not None else next(computed) for sha256 in noted]
    for data, known, sha256 in zip(sources, noted, digests, strict=True):
        if known is None:
            data_urls.note_sha256(data, sha256)
    identity = None if options.resize is None else options.resize.identity
    keys = [
        CacheKey(digest, len(data), options.mode, options.background, options.layout, identity, salt)
        for digest, data in zip(digests, sources, strict=True)
    ]
    results: list[Decoded | Exception | None] = [None] * len(sources)
    try:
        await _fill(cache, native, sources, digests, keys, results, publish)
    except BaseException:
        # The caller went away: every hand-out it got is ended now.
        for result in results:
            if isinstance(result, Decoded):
                release(result)
        raise
    return [RuntimeError("an image was left unpublished (a bug)") if r is None else r for r in results]


async def _fill(
    cache: PublishCache,
    native: _native.NativePublisher,
    sources: list[bytes | bytearray],
    digests: list[str],
    keys: list[CacheKey],
    results: list[Decoded | Exception | None],
    publish: Publish,
) -> None:
    """Fills `results`: a hit is handed out; the first of each missing key
    (here or in no other request) is decoded, once, and kept; a repeat
    here, or a key another request is decoding, gets a hand-out of that
    decode (or its error). What none of that served (a decode abandoned
    by its request, an image too large to keep) is decoded uncached."""
    leaders: dict[CacheKey, int] = {}
    repeats: list[tuple[int, CacheKey]] = []
    waits: list[tuple[int, CacheKey, asyncio.Future[Outcome]]] = []
    for index, key in enumerate(keys):
        hit = cache.hand_out(native, key)
        future = cache.waiting_on(key)
        if hit is not None:
            results[index] = _image(hit)
        elif key in leaders:
            repeats.append((index, key))
        elif future is not None:
            waits.append((index, key, future))
        else:
            leaders[key] = index
            cache.begin(key)
    try:
        firsts = list(leaders.values())
        outcomes = (
            await publish([sources[index] for index in firsts], [digests[index] for index in firsts])
            if firsts
            else []
        )
    except BaseException:
        for key in leaders:
            cache.finish_abandoned(key)
        raise
    for (key, index), outcome in zip(leaders.items(), outcomes, strict=True):
        results[index] = outcome
        cache.finish(native, key, outcome)
    for index, key in repeats:
        results[index] = _again(cache, native, key, results[leaders[key]])
    for index, key, future in waits:
        results[index] = _again(cache, native, key, await asyncio.shield(future))
    rest = [index for index, result in enumerate(results) if result is None]
    if rest:
        again = await publish([sources[index] for index in rest], None)
        for index, outcome in zip(rest, again, strict=True):
            results[index] = outcome


def _again(
    cache: PublishCache, native: _native.NativePublisher, key: CacheKey, outcome: Outcome
) -> Decoded | Exception | None:
    """What a request waiting on a decode of `key` gets: the decode's
    error, or a hand-out of what it published (None: decode it anew)."""
    if isinstance(outcome, Exception):
        return outcome
    again = None if outcome is None else cache.hand_out(native, key)
    return None if again is None else _image(again)


def _image(published: PublishedSlot) -> Decoded:
    """An image key's entry (images and videos never share a key)."""
    assert isinstance(published, Decoded), "an image key names an image"
    return published


async def publish_one_through_cache(
    cache: PublishCache,
    native: _native.NativePublisher,
    key: Key,
    publish: Callable[[], Awaitable[PublishedSlot]],
) -> PublishedSlot:
    """One medium item (a video) through ``cache`` under ``key``: a hit is
    handed out; a key another request is decoding gets a hand-out of that
    decode (or its error); a miss is decoded by ``publish``, once, and
    kept (unless it alone is over the budget). A decode whose request went
    away leaves its waiters to decode for themselves."""
    hit = cache.hand_out(native, key)
    if hit is not None:
        return hit
    future = cache.waiting_on(key)
    if future is not None:
        outcome = await asyncio.shield(future)
        if isinstance(outcome, Exception):
            raise outcome
        again = None if outcome is None else cache.hand_out(native, key)
        return again if again is not None else await publish()
    cache.begin(key)
    try:
        published = await publish()
    except Exception as error:
        cache.finish(native, key, error)
        raise
    except BaseException:
        cache.finish_abandoned(key)
        raise
    cache.finish(native, key, published)
    return published
