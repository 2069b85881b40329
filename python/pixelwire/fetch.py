"""Fetching image bytes from URLs, guarded against SSRF.

:class:`Fetcher` turns a URL into bytes: ``data:`` URLs are decoded natively
(base64 only), ``http``/``https`` URLs go through one pooled aiohttp session,
and ``file:`` URLs are read only below an explicitly allowed directory.
:func:`load_image` fetches and decodes in one call.

The SSRF guard is on by default. For every hop of a request, the original URL
and each redirect, it checks:

* the scheme: ``http`` and ``https`` only (``data:`` and ``file:`` are never
  followed from a redirect);
* the host: no credentials in the URL; names made of letters, digits, ``-``,
  ``_`` and ``.`` only; no numeric host in a legacy IPv4 spelling (decimal
  ``2130706433``, hex ``0x7f.1``, octal ``0177.0.0.1``, short ``127.1``), since
  resolvers map those onto addresses the check would not see;
* the optional domain allow-list;
* every address of the host: literal addresses directly, names through a
  resolver that aiohttp's connector calls when it opens a connection and that
  returns only addresses it has checked, so the connection goes to the very
  address that was checked and there is no DNS-rebinding window. An address
  must be global: loopback, private (RFC 1918, ULA), link-local (cloud
  metadata at 169.254.169.254 included), CGNAT, multicast, reserved,
  unspecified, documentation and benchmarking ranges are refused. Every IPv6
  form that embeds an IPv4 address is judged by one rule, the IPv4 rule
  applied to what it embeds: IPv4-mapped (``::ffff:0:0/96``), NAT64
  (``64:ff9b::/96``; for the local-use ``64:ff9b:1::/48``, whose prefix length
  the site picks, the address in every RFC 6052 layout that fits) and 6to4
  (``2002::/16``) addresses are fetched from when that is public;
  IPv4-compatible (``::/96``, deprecated), IPv4-translated
  (``::ffff:0:0:0/96``, obsolete) and Teredo (``2001::/32``: server and
  client) addresses are refused even then. One refused address refuses the
  whole host.

``allow_private=True`` turns the address check off (to reach services on the
local network); the scheme, host-spelling and allow-list checks stay on.

``file:`` URLs are opened one path component at a time, each relative to the
directory opened before it and without following symbolic links
(``O_NOFOLLOW``); a link met on the way is read and its target walked the same
way, so no link, however late it is swapped in, leads outside the allowed
folder (there is no check-then-open window).

Fairness: ``timeout`` bounds a whole fetch, the wait for a connection and a
trickling body included; host names are resolved on the fetcher's own small
thread pool, never queued behind the event loop's default executor; and
:meth:`Fetcher.concurrency_limit` (or ``fetch(url, limit=...)``,
:meth:`Fetcher.fetch_many`) bounds how many fetches one caller has in flight,
so that one request's many slow URLs cannot take the whole connection pool.

Errors are :class:`pixelwire.FetchError` with ``status`` (the HTTP status of
a non-success response, else ``None``) and ``retryable`` (timeouts, connection
errors, HTTP 408, 429 and 5xx), and its subclass :class:`pixelwire.BlockedURL`
for anything the guard refuses. Messages name the scheme, host and path but
never the query string or the payload of a ``data:`` URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import ipaddress
import os
import re
import socket
import stat
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Final

import aiohttp
import numpy as np
import numpy.typing as npt
from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from pixelwire import config
from pixelwire._native import BlockedURL, FetchError, __version__, decode_data_url, decode_image
from pixelwire.config import Mode

__all__ = ["Fetcher", "load_image"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_MAX_BYTES: Final = config.FETCH_MAX_BYTES
DEFAULT_USER_AGENT: Final = f"pixelwire/{__version__}"

_HTTP_SCHEMES: Final = frozenset({"http", "https"})
_REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
_CHUNK: Final = 64 * 1024
# A host name as it reaches the resolver: IDNA-encoded, lower case.
_HOST_NAME: Final = re.compile(r"[a-z0-9_.-]+")
# A final label that is a number in any base: the host is an IPv4 spelling.
_NUMERIC_LABEL: Final = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
# Data URLs decoded on a worker thread from this size on (the native decoder
# releases the GIL); smaller ones are decoded inline, cheaper than the hop.
_DATA_URL_THREAD_CHARS: Final = 1 << 20

_CGNAT: Final = ipaddress.IPv4Network("100.64.0.0/10")
_IPV4_MAPPED: Final = ipaddress.IPv6Network("::ffff:0:0/96")
_IPV4_TRANSLATED: Final = ipaddress.IPv6Network("::ffff:0:0:0/96")
_IPV4_COMPATIBLE: Final = ipaddress.IPv6Network("::/96")
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL: Final = ipaddress.IPv6Network("64:ff9b:1::/48")
# Where RFC 6052 puts the IPv4 address for a prefix length that fits in the
# local-use NAT64 prefix: the bytes of the IPv6 address, in order (byte 8, the
# "u" octet, is skipped).
_RFC6052_LAYOUTS: Final = ((6, 7, 9, 10), (7, 9, 10, 11), (9, 10, 11, 12), (12, 13, 14, 15))

# file: URLs: directories on the way are opened with these, the file with the next.
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Non-blocking, so that a FIFO cannot hang the open or the read; regular files ignore it.
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_SYMLINKS: Final = 40  # as Linux: more links than this on one path is a loop

# The concurrency limit of the caller whose context a fetch runs in (see
# Fetcher.concurrency_limit); tasks copy it from the context that creates them.
_CALLER_LIMIT: contextvars.ContextVar[asyncio.Semaphore | None] = contextvars.ContextVar(
    "pixelwire_fetch_limit", default=None
)


def _error(
    cls: type[FetchError], message: str, *, status: int | None = None, retryable: bool = False
) -> FetchError:
    return cls(message, status=status, retryable=retryable)


# Both settings, since worker mode needs both: the frontend checks a URL
# before passing it on, and the plug-in checks it again when vLLM fetches.
_PRIVATE_HINT = (
    "private addresses are allowed by --allow-private on pixelwire frontend and "
    "PIXELWIRE_ALLOW_PRIVATE=1 for the vLLM plug-in"
)


def _blocked(message: str) -> FetchError:
    return _error(BlockedURL, message)


def _describe(url: URL) -> str:
    """The URL without credentials, query or fragment, shortened: safe to log."""
    host = url.raw_host or ""
    if ":" in host:
        host = f"[{host}]"
    port = "" if url.port is None or url.is_default_port() else f":{url.port}"
    path = url.raw_path
    if len(path) > 80:
        path = path[:77] + "..."
    return f"{url.scheme}://{host}{port}{path}"


def _ipv4_refusal(ip: ipaddress.IPv4Address) -> str | None:
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local, where cloud metadata services live"
    if ip in _CGNAT:
        return "shared address space (CGNAT)"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved or ip == ipaddress.IPv4Address("255.255.255.255"):
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "not globally routable"
    return None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, list[ipaddress.IPv4Address], bool] | None:
    """The IPv4 form ``ip`` is in, if any: its name, the IPv4 addresses it embeds
    and whether it may be fetched from when they all are public."""
    low = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _IPV4_MAPPED:
        return "IPv4-mapped", [low], True  # the socket connects to the IPv4 address itself
    if ip in _IPV4_TRANSLATED:
        return "IPv4-translated (SIIT, obsolete)", [low], False
    if ip in _IPV4_COMPATIBLE:
        return "IPv4-compatible (deprecated)", [low], False
    if ip in _NAT64:
        return "NAT64", [low], True
    if ip in _NAT64_LOCAL:
        packed = ip.packed
        layouts = [ipaddress.IPv4Address(bytes(packed[i] for i in at)) for at in _RFC6052_LAYOUTS]
        return "local-use NAT64", layouts, True
    if ip.sixtofour is not None:
        return "6to4", [ip.sixtofour], True
    if ip.teredo is not None:
        return "Teredo", list(ip.teredo), False
    return None


def _ipv6_refusal(ip: ipaddress.IPv6Address) -> str | None:
    if ip.scope_id:
        return "scoped (zone index)"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    embedded = _embedded_ipv4(ip)
    if embedded is not None:
        # One rule for every form: the IPv4 rule, applied to what it embeds.
        form, addresses, public_ok = embedded
        for v4 in addresses:
            reason = _ipv4_refusal(v4)
            if reason is not None:
                return f"{form}, embeds {v4}: {reason}"
        return None if public_ok else f"{form}, refused whatever it embeds"
    if ip.is_link_local:
        return "link-local"
    if ip.is_site_local:
        return "site-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "not globally routable"
    return None


def address_refusal(ip: IPAddress) -> str | None:
    """Why ``ip`` may not be fetched from with the guard on, or ``None`` if it may."""
    if isinstance(ip, ipaddress.IPv4Address):
        return _ipv4_refusal(ip)
    return _ipv6_refusal(ip)


def _canonical_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The address when ``host`` is a canonical dotted quad (a trailing dot allowed)."""
    try:
        return ipaddress.IPv4Address(host[:-1] if host.endswith(".") else host)
    except ValueError:
        return None


def _is_odd_ipv4_spelling(host: str) -> bool:
    """True for numeric hosts that are not a canonical dotted quad (``0x7f.1``, ``127.1``, ...)."""
    bare = host[:-1] if host.endswith(".") else host
    if _canonical_ipv4(bare) is not None:
        return False
    try:
        socket.inet_aton(bare)
    except OSError:
        pass
    else:
        return True
    last_label = bare.rsplit(".", 1)[-1]
    return bool(last_label) and _NUMERIC_LABEL.fullmatch(last_label) is not None


def _normalise_domain(domain: str) -> str:
    if not isinstance(domain, str) or not domain:
        raise TypeError(f"allowed_domains entries must be non-empty strings, not {domain!r}")
    wildcard = domain.startswith("*.")
    name = domain[2:] if wildcard else domain
    host = URL.build(scheme="http", host=name.rstrip(".")).raw_host
    if not host:
        raise ValueError(f"invalid domain in allowed_domains: {domain!r}")
    return f"*.{host}" if wildcard else host


class _Inflater:
    """Incremental gzip/deflate decoding whose output is capped (no compression bombs).

    ``feed`` never returns more than ``room + 1`` bytes, however much its
    input would expand, so the caller sees an overrun after one byte too many
    and stops. Concatenated gzip members are decoded in turn; anything else
    after the end of the stream is ignored.
    """

    def __init__(self, encoding: str) -> None:
        self._gzip = encoding != "deflate"
        self._obj: zlib._Decompress | None = None
        self._carry = b""  # the start of a stream or member, too short to recognise yet
        self._ended = False

    def _start(self, data: bytes) -> bool:
        """Starts the next stream or gzip member at ``data``; False when it cannot (yet)."""
        if len(data) < 2:
            self._carry = data
            return False
        if self._gzip:
            if data[:2] != b"\x1f\x8b":
                if self._obj is None:
                    raise _error(FetchError, "gzip body does not start with a gzip header")
                self._ended = True  # trailing bytes after the last member
                return False
            wbits = zlib.MAX_WBITS | 16
        else:
            if self._obj is not None:
                self._ended = True
                return False
            # RFC 9110's "deflate" is zlib-wrapped, but some servers send a
            # raw deflate stream; a zlib header is recognisable from two bytes.
            zlib_header = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
        self._obj = zlib.decompressobj(wbits)
        return True

    def feed(self, data: bytes, room: int) -> list[bytes]:
        out: list[bytes] = []
        budget = room + 1
        pending, self._carry = self._carry + data, b""
        while pending and budget > 0 and not self._ended:
            if (self._obj is None or self._obj.eof) and not self._start(pending):
                break
            obj = self._obj
            assert obj is not None
            try:
                chunk = obj.decompress(pending, budget)
            except zlib.error:
                raise _error(FetchError, "corrupt compressed body") from None
            budget -= len(chunk)
            if chunk:
                out.append(chunk)
            # After the end of a stream the rest of the input is in unused_data;
            # before it, input left over by the output cap is in unconsumed_tail.
            pending = obj.unused_data if obj.eof else obj.unconsumed_tail
        return out

    @property
    def complete(self) -> bool:
        return self._obj is not None and self._obj.eof and not self._carry


class _GuardedResolver(AbstractResolver):
    """aiohttp resolver that returns only addresses the fetcher's guard accepted."""

    def __init__(self, fetcher: Fetcher) -> None:
        self._fetcher = fetcher

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return await self._fetcher._resolve_checked(host, port, family)

    async def close(self) -> None:
        return None


class Fetcher:
    """Fetches URLs into bytes through one pooled HTTP session, with an SSRF guard.

    ``timeout`` bounds a whole :meth:`fetch` in seconds: the wait for the
    caller's concurrency limit and for a pooled connection, every redirect hop
    and the whole body, however slowly it trickles in. ``connect_timeout``
    bounds each TCP connect. ``max_bytes`` caps the body, counted after
    gzip/deflate decoding. ``max_redirects`` is how many redirects are
    followed. ``allowed_domains``, when given, is the only set of
    hosts fetched from on any hop: an entry matches that host exactly,
    ``"*.example.com"`` matches every subdomain of example.com. ``allow_private``
    turns off the address check (see the module docstring). ``file:`` URLs are
    read only when ``allowed_local_path`` is set and the file, symlinks
    resolved, lies below it; no symbolic link is followed out of it.

    Use as ``async with Fetcher() as f: data = await f.fetch(url)``, or create
    one and ``await f.close()`` when done; the HTTP session is created on first
    use and is tied to that event loop. Concurrent fetches share at most
    :attr:`MAX_CONNECTIONS` connections, :attr:`MAX_CONNECTIONS_PER_HOST` per
    host, kept alive for reuse. One caller (a frontend request) that must not
    take them all runs its fetches under :meth:`concurrency_limit`. Host names
    are resolved on the fetcher's own pool of :attr:`DNS_THREADS` threads.
    """

    MAX_CONNECTIONS: int = 64
    MAX_CONNECTIONS_PER_HOST: int = 32
    DNS_THREADS: int = 16
    DEFAULT_MAX_CONCURRENT: int = 8

    def __init__(
        self,
        *,
        timeout: float = config.FETCH_TIMEOUT,
        connect_timeout: float = config.CONNECT_TIMEOUT,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_redirects: int = config.FETCH_MAX_REDIRECTS,
        allowed_domains: Iterable[str] | None = None,
        allow_private: bool = False,
        allowed_local_path: str | os.PathLike[str] | None = None,
        user_agent: str = DEFAULT_USER_AGENT,
    ) -> None:
        if not timeout > 0 or not connect_timeout > 0:
            raise ValueError("timeout and connect_timeout must be positive")
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        if max_redirects < 0:
            raise ValueError("max_redirects must not be negative")
        if isinstance(allowed_domains, str):
            raise TypeError("allowed_domains must be a collection of domains, not one string")
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.max_bytes = int(max_bytes)
        self.max_redirects = int(max_redirects)
        self.allowed_domains: frozenset[str] | None = (
            None if allowed_domains is None else frozenset(_normalise_domain(d) for d in allowed_domains)
        )
        self.allow_private = bool(allow_private)
        self.allowed_local_path: Path | None = (
            None if allowed_local_path is None else Path(os.path.realpath(allowed_local_path))
        )
        # file: URL paths are matched against the folder as resolved and as given.
        self._local_prefixes: tuple[str, ...] = ()
        if allowed_local_path is not None:
            given = os.path.abspath(allowed_local_path)
            self._local_prefixes = tuple(dict.fromkeys((str(self.allowed_local_path), given)))
        self.user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None
        self._dns_executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def __aenter__(self) -> Fetcher:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the HTTP session and its connections; the fetcher cannot be used after."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        executor, self._dns_executor = self._dns_executor, None
        if executor is not None:
            # A lookup still running finishes on its own; nothing waits for it.
            executor.shutdown(wait=False, cancel_futures=True)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    @property
    def has_session(self) -> bool:
        """Whether the HTTP session (the connection pool) exists: it is made
        by the first ``http(s)`` fetch, not by ``data:`` or ``file:`` ones."""
        return self._session is not None

    def concurrency_limit(self, max_concurrent: int) -> contextlib.AbstractContextManager[asyncio.Semaphore]:
        """A context in which at most ``max_concurrent`` ``http(s)``/``file:``
        fetches run at once: one caller's share of the connection pool.

        ``with fetcher.concurrency_limit(8): await asyncio.gather(...)``: every
        fetch started in the ``with`` block, in tasks created there too (they
        copy the context), waits for one of the limit's slots; the wait counts
        against its ``timeout``. It applies to fetches of any :class:`Fetcher`
        (and so through a :class:`pixelwire.Publisher`); a nested limit
        replaces the outer one. ``data:`` URLs are not limited.
        """
        return _limit_scope(asyncio.Semaphore(_positive_limit(max_concurrent)))

    async def fetch(self, url: str, *, limit: asyncio.Semaphore | None = None) -> bytes:
        """The bytes ``url`` refers to (``data:``, ``http(s):`` or allowed ``file:``).

        ``limit``, when given, is the caller's concurrency limit, held for the
        fetch (in place of the one :meth:`concurrency_limit` set, if any).
        Raises :class:`pixelwire.BlockedURL` for what the guard refuses and
        :class:`pixelwire.FetchError` for every other failure.
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        if self._closed:
            raise RuntimeError("this Fetcher is closed")
        if url[:5].lower() == "data:":
            return await self._fetch_data(url)
        try:
            parsed = URL(url)
        except (ValueError, TypeError) as exc:
            raise _blocked(f"invalid URL ({exc.__class__.__name__})") from None
        is_file = parsed.scheme == "file"
        if is_file:
            self._check_file_url(parsed)
        else:
            self._check_url(parsed)  # refused at once, not after waiting for a slot
        if limit is None:
            limit = _CALLER_LIMIT.get()
        try:
            async with asyncio.timeout(self.timeout):
                async with contextlib.nullcontext() if limit is None else limit:
                    if is_file:
                        return await self._fetch_file(parsed)
                    return await self._fetch_http(parsed)
        except FetchError:
            raise
        except TimeoutError:
            raise _error(
                FetchError, f"timed out after {self.timeout:g} s fetching {_describe(parsed)}", retryable=True
            ) from None
        except (aiohttp.ClientSSLError, aiohttp.ClientConnectorCertificateError) as exc:
            raise _error(FetchError, f"TLS error fetching {_describe(parsed)}: {exc}") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
            raise _error(
                FetchError,
                f"connection error fetching {_describe(parsed)}: {exc.__class__.__name__}",
                retryable=True,
            ) from exc
        except aiohttp.ClientError as exc:
            raise _error(
                FetchError, f"HTTP error fetching {_describe(parsed)}: {exc.__class__.__name__}"
            ) from exc

    async def fetch_many(
        self, urls: Iterable[str], *, max_concurrent: int = DEFAULT_MAX_CONCURRENT
    ) -> list[bytes | FetchError]:
        """Fetches ``urls``, at most ``max_concurrent`` at once: one result per
        URL, in order, the bytes or the :class:`pixelwire.FetchError` (or
        :class:`pixelwire.BlockedURL`) it failed with. Each fetch has its own
        ``timeout``, counted from the call. Other exceptions propagate, after
        the fetches still running are cancelled."""
        limit = asyncio.Semaphore(_positive_limit(max_concurrent))
        urls = list(urls)
        for url in urls:
            if not isinstance(url, str):
                raise TypeError(f"url must be a str, not {type(url).__name__}")

        async def one(url: str) -> bytes | FetchError:
            try:
                return await self.fetch(url, limit=limit)
            except FetchError as exc:
                return exc

        tasks = [asyncio.ensure_future(one(url)) for url in urls]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    def check(self, url: str) -> None:
        """The checks ``fetch`` makes before connecting (scheme, credentials,
        host spelling, allow-list, literal addresses), without fetching: for a
        hop that forwards the URL for someone else to fetch. Names are not
        resolved here. Raises :class:`pixelwire.BlockedURL`."""
        if not isinstance(url, str):
            raise TypeError(f"url must be a str, not {type(url).__name__}")
        if url[:5].lower() == "data:":
            return
        try:
            parsed = URL(url)
        except (ValueError, TypeError) as exc:
            raise _blocked(f"invalid URL ({exc.__class__.__name__})") from None
        if parsed.scheme == "file":
            if self.allowed_local_path is None:
                raise _blocked("file: URLs are refused (no allowed_local_path is set)")
            return
        self._check_url(parsed)

    # -- data: -----------------------------------------------------------------

    async def _fetch_data(self, url: str) -> bytes:
        comma = url.find(",")
        if comma >= 0:
            # Refuse from the length alone before decoding anything.
            payload = len(url) - comma - 1
            if payload // 4 * 3 > self.max_bytes + 2:
                raise _error(
                    FetchError,
                    f"data: URL payload of {payload} characters is over the limit of {self.max_bytes} bytes",
                )
        if len(url) >= _DATA_URL_THREAD_CHARS:
            _, data = await asyncio.to_thread(decode_data_url, url)
        else:
            _, data = decode_data_url(url)
        if len(data) > self.max_bytes:
            raise _error(
                FetchError, f"data: URL holds {len(data)} bytes, over the limit of {self.max_bytes} bytes"
            )
        return data

    # -- file: -----------------------------------------------------------------

    def _check_file_url(self, url: URL) -> None:
        if self.allowed_local_path is None:
            raise _blocked("file: URLs are refused (no allowed_local_path is set)")
        if url.raw_host not in (None, "", "localhost"):
            raise _blocked("file: URLs must not name a host")

    async def _fetch_file(self, url: URL) -> bytes:
        self._check_file_url(url)
        root = self.allowed_local_path
        assert root is not None
        return await asyncio.to_thread(self._read_file, root, url.path)

    def _below_root(self, path: str) -> list[str]:
        """The components of ``path`` below the allowed folder (``..`` resolved
        lexically); refused when it does not lie below it."""
        if "\0" in path:
            raise _blocked("invalid file: URL")
        norm = os.path.normpath(path)
        if norm.startswith("/"):
            for prefix in self._local_prefixes:
                base = prefix.rstrip("/")
                if norm == prefix or norm.startswith(base + "/"):
                    return [c for c in norm[len(base) :].split("/") if c and c != "."]
        raise _blocked("file: URL is outside allowed_local_path")

    def _open_below(self, root: Path, path: str) -> int:
        """Opens ``path`` for reading without ever leaving ``root``.

        Each component is opened relative to the directory opened before it,
        with ``O_NOFOLLOW``: a symbolic link met on the way (whenever it was
        put there) fails to open, is read with ``readlink`` and its target
        walked the same way, ``..`` going back up the directories held open and
        an absolute target starting again from ``root``. Nothing is resolved by
        path, so there is no window between a check and the open.
        """
        rest = self._below_root(path)
        held = [os.open(root, _DIR_FLAGS)]
        links = 0
        try:
            while rest:
                name = rest.pop(0)
                if name == "..":
                    if len(held) == 1:
                        raise _blocked("file: URL is outside allowed_local_path")
                    os.close(held.pop())
                    continue
                try:
                    fd = os.open(name, _DIR_FLAGS if rest else _FILE_FLAGS, dir_fd=held[-1])
                except OSError as exc:
                    try:
                        target = os.readlink(name, dir_fd=held[-1])
                    except OSError:
                        raise exc from None  # not a link: the open's own error
                    links += 1
                    if links > _MAX_SYMLINKS:
                        raise _error(FetchError, "cannot read file: URL: too many symbolic links") from None
                    if target.startswith("/"):
                        rest = self._below_root(target) + rest
                        while len(held) > 1:
                            os.close(held.pop())
                    else:
                        rest = [c for c in target.split("/") if c and c != "."] + rest
                    continue
                if not rest:
                    return fd
                held.append(fd)
            # The path named a directory (the folder itself, or one reached by "..").
            return os.open(".", _FILE_FLAGS, dir_fd=held[-1])
        finally:
            for fd in held:
                os.close(fd)

    def _read_file(self, root: Path, path: str) -> bytes:
        try:
            fd = self._open_below(root, path)
            try:
                info = os.fstat(fd)
            except OSError:
                os.close(fd)
                raise
            if not stat.S_ISREG(info.st_mode):
                os.close(fd)
                raise _error(FetchError, "file: URL does not name a regular file")
            if info.st_size > self.max_bytes:
                os.close(fd)
                size = info.st_size
                raise _error(FetchError, f"file of {size} bytes is over the limit of {self.max_bytes} bytes")
            with open(fd, "rb") as f:
                data = f.read(self.max_bytes + 1)
        except OSError as exc:
            reason = exc.strerror or exc.__class__.__name__
            raise _error(FetchError, f"cannot read file: URL: {reason}") from None
        if len(data) > self.max_bytes:
            raise _error(FetchError, f"file is over the limit of {self.max_bytes} bytes")
        return data

    # -- http(s): --------------------------------------------------------------

    def _session_for_loop(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=_GuardedResolver(self),
                limit=self.MAX_CONNECTIONS,
                limit_per_host=self.MAX_CONNECTIONS_PER_HOST,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                # The pool wait is bounded by the overall timeout, not this one.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout),
                headers={
                    "User-Agent": self.user_agent,
                    "Accept": "image/*,*/*;q=0.8",
                    "Accept-Encoding": "gzip, deflate",
                },
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,  # decoded here, with the size cap applied to the output
                trust_env=False,  # no proxies from the environment
            )
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("this Fetcher's HTTP session belongs to another event loop")
        return self._session

    def _host_allowed(self, host: str) -> bool:
        domains = self.allowed_domains
        if domains is None:
            return True
        host = host.rstrip(".")
        if host in domains:
            return True
        if ":" in host or _canonical_ipv4(host) is not None:
            return False  # addresses match exactly or not at all
        labels = host.split(".")
        return any(f"*.{'.'.join(labels[i:])}" in domains for i in range(1, len(labels)))

    def _address_refusal(self, host: str, ip: IPAddress) -> str | None:
        """The address check for ``ip``, an address of ``host``; ``None`` accepts it.

        A seam for tests, which override it to treat a made-up public name as
        global although the test server behind it listens on the loopback.
        """
        if self.allow_private:
            return None
        return address_refusal(ip)

    def _check_url(self, url: URL) -> None:
        """Everything about one hop that can be checked before connecting."""
        where = _describe(url)
        if url.scheme not in _HTTP_SCHEMES:
            raise _blocked(f"scheme {url.scheme or '(none)'!r} is refused (http and https only)")
        if url.raw_user is not None or url.raw_password is not None:
            raise _blocked(f"URLs with credentials are refused: {where}")
        host = url.raw_host
        if not host:
            raise _blocked(f"URL has no host: {where}")
        if not self._host_allowed(host):
            raise _blocked(f"host {host!r} is not in allowed_domains: {where}")
        ip: IPAddress | None
        if ":" in host:
            try:
                ip = ipaddress.IPv6Address(url.host or "")
            except ValueError:
                raise _blocked(f"invalid IPv6 host: {where}") from None
        else:
            ip = _canonical_ipv4(host)
            if ip is None:
                if _is_odd_ipv4_spelling(host):
                    raise _blocked(f"numeric host in a non-canonical IPv4 spelling is refused: {where}")
                if _HOST_NAME.fullmatch(host) is None:
                    raise _blocked(f"invalid host name: {where}")
                return  # a name: its addresses are checked when the connector resolves it
        reason = self._address_refusal(host, ip)
        if reason is not None:
            raise _blocked(f"address {ip} is refused ({reason}): {where}; {_PRIVATE_HINT}")

    async def _getaddrinfo(self, host: str, port: int, family: int) -> list[tuple[int, int, str]]:
        """Resolves ``host``: ``(family, proto, address)`` for each result.

        On the fetcher's own threads, not the loop's default executor, whose
        threads may all be blocked (decodes waiting for a full pixel pool).
        A seam for tests, which have no DNS and override it to map made-up
        names onto addresses.
        """
        loop = asyncio.get_running_loop()
        executor = self._dns_executor
        if executor is None:
            executor = self._dns_executor = ThreadPoolExecutor(
                max_workers=self.DNS_THREADS, thread_name_prefix="pixelwire-dns"
            )
        lookup = functools.partial(
            socket.getaddrinfo, host, port, family, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG
        )
        infos = await loop.run_in_executor(executor, lookup)
        return [(fam, proto, str(sockaddr[0])) for fam, _, proto, _, sockaddr in infos]

    async def _resolve_checked(self, host: str, port: int, family: int) -> list[ResolveResult]:
        """The connector's resolution: every address is checked; one refused refuses them all."""
        if _is_odd_ipv4_spelling(host):
            raise _blocked(f"numeric host in a non-canonical IPv4 spelling is refused: {host!r}")
        infos = await self._getaddrinfo(host, port, family)
        if not infos:
            raise OSError(f"no addresses for {host!r}")
        results: list[ResolveResult] = []
        for fam, proto, address in infos:
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                raise _blocked(f"host {host!r} resolved to an unparseable address") from None
            reason = self._address_refusal(host, ip)
            if reason is not None:
                raise _blocked(f"host {host!r} resolves to {ip}, refused ({reason}); {_PRIVATE_HINT}")
            results.append(
                ResolveResult(
                    hostname=host,
                    host=address,
                    port=port,
                    family=fam,
                    proto=proto,
                    # Numeric: the connector must not resolve the address again.
                    flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
                )
            )
        return results

    async def _fetch_http(self, url: URL) -> bytes:
        session = self._session_for_loop()
        url = url.with_fragment(None)
        for hop in range(self.max_redirects + 1):
            self._check_url(url)
            response = await session.get(url, allow_redirects=False)
            try:
                status = response.status
                if status in _REDIRECT_STATUSES:
                    url = self._redirect_target(response, url, hop)
                    continue
                if not 200 <= status < 300:
                    reason = f" {response.reason}" if response.reason else ""
                    raise _error(
                        FetchError,
                        f"HTTP {status}{reason} from {_describe(url)}",
                        status=status,
                        retryable=status in (408, 429) or 500 <= status <= 599,
                    )
                return await self._read_body(response, url)
            except BaseException:
                response.close()  # drop the connection: its body was not read to the end
                raise
            finally:
                response.release()  # back to the pool when the body was read, else closed
        raise AssertionError("unreachable")  # pragma: no cover

    def _redirect_target(self, response: aiohttp.ClientResponse, url: URL, hop: int) -> URL:
        if hop >= self.max_redirects:
            raise _error(
                FetchError, f"more than {self.max_redirects} redirects, the last from {_describe(url)}"
            )
        location = response.headers.get("Location")
        if not location:
            raise _error(
                FetchError,
                f"HTTP {response.status} redirect without a Location from {_describe(url)}",
                status=response.status,
            )
        try:
            target = url.join(URL(location, encoded=False))
        except (ValueError, TypeError):
            raise _blocked(f"invalid redirect target from {_describe(url)}") from None
        if target.scheme not in _HTTP_SCHEMES:
            scheme = target.scheme or "(none)"
            raise _blocked(f"redirect to scheme {scheme!r} is refused, from {_describe(url)}")
        return target.with_fragment(None)

    async def _read_body(self, response: aiohttp.ClientResponse, url: URL) -> bytes:
        limit = self.max_bytes
        encoding = response.headers.get("Content-Encoding", "").strip().lower()
        inflater: _Inflater | None
        if encoding in ("", "identity"):
            inflater = None
            length = response.content_length
            if length is not None and length > limit:
                raise _error(
                    FetchError,
                    f"Content-Length {length} is over the limit of {limit} bytes: {_describe(url)}",
                )
        elif encoding in ("gzip", "x-gzip", "deflate"):
            inflater = _Inflater(encoding)
        else:
            raise _error(FetchError, f"unsupported Content-Encoding {encoding[:40]!r}: {_describe(url)}")
        chunks: list[bytes] = []
        total = 0
        async for chunk in response.content.iter_chunked(_CHUNK):
            if inflater is None:
                total += len(chunk)
                chunks.append(chunk)
            else:
                for piece in inflater.feed(chunk, limit - total):
                    total += len(piece)
                    chunks.append(piece)
            if total > limit:
                decoded = " after decoding" if inflater is not None else ""
                where = _describe(url)
                raise _error(FetchError, f"body is over the limit of {limit} bytes{decoded}: {where}")
        if inflater is not None and not inflater.complete:
            raise _error(FetchError, f"truncated {encoding} body: {_describe(url)}", retryable=True)
        return b"".join(chunks)


def _positive_limit(max_concurrent: int) -> int:
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
        raise ValueError(f"max_concurrent must be a positive int, not {max_concurrent!r}")
    return max_concurrent


@contextlib.contextmanager
def _limit_scope(limit: asyncio.Semaphore) -> Iterator[asyncio.Semaphore]:
    token = _CALLER_LIMIT.set(limit)
    try:
        yield limit
    finally:
        _CALLER_LIMIT.reset(token)


async def load_image(
    url_or_bytes: str | bytes | bytearray | memoryview,
    *,
    fetcher: Fetcher | None = None,
    mode: Mode = "RGB",
) -> npt.NDArray[np.uint8]:
    """Fetches (when given a URL) and decodes an image: ``(H, W, C)`` uint8 pixels.

    Decoding runs on a worker thread so the event loop is not blocked. Without
    a ``fetcher``, a default :class:`Fetcher` is created for this call and
    closed after it; pass one to share its connection pool between calls.
    """
    data: bytes | bytearray | memoryview
    if isinstance(url_or_bytes, str):
        if fetcher is not None:
            data = await fetcher.fetch(url_or_bytes)
        else:
            async with Fetcher() as own:
                data = await own.fetch(url_or_bytes)
    elif isinstance(url_or_bytes, bytes | bytearray | memoryview):
        data = url_or_bytes
    else:
        raise TypeError(f"expected a URL string or bytes, not {type(url_or_bytes).__name__}")
    return await asyncio.to_thread(decode_image, data, mode=mode)
