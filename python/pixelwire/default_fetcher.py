"""The Fetcher a Publisher or Reader makes when given none."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pixelwire.config import allow_private_from_env

if TYPE_CHECKING:
    from pixelwire.fetch import Fetcher


def default_fetcher() -> Fetcher:
    """A Fetcher with the default SSRF guard; PIXELWIRE_ALLOW_PRIVATE=1 is the
    explicit opt-out for deployments that fetch from their own network."""
    # The fetcher pulls in aiohttp: imported only when one is needed.
    from pixelwire.fetch import Fetcher

    return Fetcher(allow_private=allow_private_from_env())
