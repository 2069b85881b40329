"""What every cache implements, whatever it keeps: :class:`Cache`."""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

Key = TypeVar("Key", contravariant=True)


@runtime_checkable
class Cache(Protocol[Key]):
    """A cache of entries by its own ``Key``: within ``budget`` bytes (0:
    off), holding :attr:`held_bytes` of them, with the lookups that found
    an entry (``hits``) and those that did not (``misses``), which its
    metrics show (:func:`counts`)."""

    budget: int
    hits: int
    misses: int

    @property
    def held_bytes(self) -> int:
        """Bytes the entries hold now, within ``budget``."""
        ...

    def __contains__(self, key: Key) -> bool:
        """Whether an entry for ``key`` is held (not counted as a lookup)."""
        ...

    def clear(self) -> None:
        """Forgets every entry."""
        ...


def counts(cache: Cache[Key], prefix: str = "") -> dict[str, int]:
    """The cache's counts as metrics read them: ``hits``, ``misses``,
    ``bytes`` and ``budget``, each name after ``prefix``."""
    values = {"hits": cache.hits, "misses": cache.misses, "bytes": cache.held_bytes, "budget": cache.budget}
    return {f"{prefix}{name}": value for name, value in values.items()}
