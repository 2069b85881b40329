"""The fetcher's errors, and how their messages name a URL.

Errors are :class:`pixelwire.FetchError` with ``status`` (the HTTP status of
a non-success response, else ``None``) and ``retryable`` (timeouts, connection
errors, HTTP 408, 429 and 5xx), its subclass :class:`pixelwire.BlockedURL`
for anything the guard refuses, and :class:`FetchTooLarge` for a body, file
or ``data:`` payload over the fetcher's ``max_bytes``. Messages name the scheme, host and path but
never the query string or the payload of a ``data:`` URL.
"""

from __future__ import annotations

from yarl import URL

from pixelwire._native import BlockedURL, FetchError


class FetchTooLarge(FetchError):
    """What a URL holds is over the fetcher's ``max_bytes`` (never retried)."""


def error(
    cls: type[FetchError], message: str, *, status: int | None = None, retryable: bool = False
) -> FetchError:
    return cls(message, status=status, retryable=retryable)


def blocked(message: str) -> FetchError:
    return error(BlockedURL, message)


def too_large(message: str) -> FetchError:
    return error(FetchTooLarge, message)


def describe(url: URL) -> str:
    """The URL without credentials, query or fragment, shortened: safe to log."""
    host = url.raw_host or ""
    if ":" in host:
        host = f"[{host}]"
    port = "" if url.port is None or url.is_default_port() else f":{url.port}"
    path = url.raw_path
    if len(path) > 80:
        path = path[:77] + "..."
    return f"{url.scheme}://{host}{port}{path}"
