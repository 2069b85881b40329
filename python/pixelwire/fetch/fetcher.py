"""The :class:`Fetcher`: one URL into bytes, through the guard, within limits.

``data:`` URLs are decoded natively (base64 only), ``http``/``https`` URLs go
through one pooled aiohttp session, hop by hop, each hop checked before it is
connected to and redirects followed by hand, and ``file:`` URLs are read only
below ``allowed_local_path``.

Retries: with ``attempts`` over one, an ``http(s)`` fetch that failed in a
way that is safe to try again is tried again, vLLM's way
(:mod:`pixelwire.fetch.retries`).

Fairness: ``timeout`` bounds a whole fetch, the wait for a connection and a
trickling body included; host names are resolved on the fetcher's own small
thread pool, never queued behind the event loop's default executor; and
:meth:`Fetcher.concurrency_limit` (or ``fetch(url, limit=...)``,
:meth:`Fetcher.fetch_many`) bounds how many fetches one caller has in flight,
so that one request's many slow URLs cannot take the whole connection pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import os
import socket
from collections.abc import Iterable
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
from pixelwire._native import FetchError, __version__, decode_data_url, decode_image
from pixelwire.config import Mode
from pixelwire.fetch.addresses import (
    HOST_NAME,
    PRIVATE_HINT,
    IPAddress,
    address_refusal,
    canonical_ipv4,
    host_allowed,
    is_odd_ipv4_spelling,
    normalise_domain,
)
from pixelwire.fetch.concurrency import caller_limit, caller_limit_scope, new_limit
from pixelwire.fetch.content import read_body
from pixelwire.fetch.errors import blocked, describe, error, too_large
from pixelwire.fetch.local import LocalFolder
from pixelwire.fetch.retries import RetryPolicy

DEFAULT_MAX_BYTES: Final = config.FETCH_MAX_BYTES
DEFAULT_USER_AGENT: Final = f"pixelwire/{__version__}"

_HTTP_SCHEMES: Final = frozenset({"http", "https"})
_REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
# Data URLs decoded on a worker thread from this size on (the native decoder
# releases the GIL); smaller ones are decoded inline, cheaper than the hop.
_DATA_URL_THREAD_CHARS: Final = 1 << 20


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
    and the whole body, however slowly it trickles in. ``attempts`` is how
    many times an ``http(s)`` fetch is tried when it fails in a way worth
    retrying; attempt ``n`` (from 0) has ``timeout * retry_growth**n``
    seconds and follows a pause of ``retry_backoff * retry_growth**(n - 1)``
    seconds (vLLM's back-off for ``retry_backoff=1, retry_growth=4``;
    :attr:`retries`). ``connect_timeout``
    bounds each TCP connect. ``max_bytes`` caps the body, counted after
    gzip/deflate decoding. ``max_redirects`` is how many redirects are
    followed. ``allowed_domains``, when given, is the only set of
    hosts fetched from on any hop: an entry matches that host exactly,
    ``"*.example.com"`` matches every subdomain of example.com. ``allow_private``
    turns off the address check (see :mod:`pixelwire.fetch.addresses`);
    ``private_hint`` is what a refused private address's error says to do
    (by default: ``allow_private=True``; the frontend names its flag).
    ``file:`` URLs are read only when ``allowed_local_path`` is set and the
    file, symlinks resolved, lies below it; no symbolic link is followed out
    of it.

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
        attempts: int = config.FETCH_ATTEMPTS,
        retry_backoff: float = config.FETCH_RETRY_BACKOFF,
        retry_growth: float = config.FETCH_RETRY_GROWTH,
        allowed_domains: Iterable[str] | None = None,
        allow_private: bool = False,
        allowed_local_path: str | os.PathLike[str] | None = None,
        user_agent: str = DEFAULT_USER_AGENT,
        private_hint: str = PRIVATE_HINT,
    ) -> None:
        if not timeout > 0 or not connect_timeout > 0:
            raise ValueError("timeout and connect_timeout must be positive")
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        if max_redirects < 0:
            raise ValueError("max_redirects must not be negative")
        self.retries = RetryPolicy(int(attempts), float(retry_backoff), float(retry_growth))
        if isinstance(allowed_domains, str):
            raise TypeError("allowed_domains must be a collection of domains, not one string")
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.max_bytes = int(max_bytes)
        self.max_redirects = int(max_redirects)
        self.allowed_domains: frozenset[str] | None = (
            None if allowed_domains is None else frozenset(normalise_domain(d) for d in allowed_domains)
        )
        self.allow_private = bool(allow_private)
        self.private_hint = private_hint
        self._local_folder = None if allowed_local_path is None else LocalFolder(allowed_local_path)
        self.allowed_local_path: Path | None = None if self._local_folder is None else self._local_folder.root
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
        return caller_limit_scope(new_limit(max_concurrent))

    async def fetch(self, url: str, *, limit: asyncio.Semaphore | None = None) -> bytes:
        """The bytes ``url`` refers to (``data:``, ``http(s):`` or allowed ``file:``).

        ``limit``, when given, is the caller's concurrency limit, held for the
        fetch (in place of the one :meth:`concurrency_limit` set, if any).
        Raises :class:`pixelwire.BlockedURL` for what the guard refuses,
        :class:`pixelwire.fetch.FetchTooLarge` for what is over ``max_bytes``
        and :class:`pixelwire.FetchError` for every other failure (the last
        attempt's, when there were several).
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
            raise blocked(f"invalid URL ({exc.__class__.__name__})") from None
        is_file = parsed.scheme == "file"
        if is_file:
            self._check_file_url(parsed)
        else:
            self._check_url(parsed)  # refused at once, not after waiting for a slot
        if limit is None:
            limit = caller_limit()
        if is_file:
            return await self._attempt(parsed, limit, self.timeout)
        return await self.retries.run(functools.partial(self._attempt, parsed, limit), self.timeout)

    async def _attempt(self, parsed: URL, limit: asyncio.Semaphore | None, timeout: float) -> bytes:
        """One try at ``parsed`` within ``timeout`` seconds, the caller's slot held."""
        try:
            async with asyncio.timeout(timeout):
                async with contextlib.nullcontext() if limit is None else limit:
                    if parsed.scheme == "file":
                        return await self._fetch_file(parsed)
                    return await self._fetch_http(parsed)
        except FetchError:
            raise
        except TimeoutError:
            raise error(
                FetchError, f"timed out after {timeout:g} s fetching {describe(parsed)}", retryable=True
            ) from None
        except (aiohttp.ClientSSLError, aiohttp.ClientConnectorCertificateError) as exc:
            raise error(FetchError, f"TLS error fetching {describe(parsed)}: {exc}") from exc
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, OSError) as exc:
            raise error(
                FetchError,
                f"connection error fetching {describe(parsed)}: {exc.__class__.__name__}",
                retryable=True,
            ) from exc
        except aiohttp.ClientError as exc:
            raise error(
                FetchError, f"HTTP error fetching {describe(parsed)}: {exc.__class__.__name__}"
            ) from exc

    async def fetch_many(
        self, urls: Iterable[str], *, max_concurrent: int = DEFAULT_MAX_CONCURRENT
    ) -> list[bytes | FetchError]:
        """Fetches ``urls``, at most ``max_concurrent`` at once: one result per
        URL, in order, the bytes or the :class:`pixelwire.FetchError` (or
        :class:`pixelwire.BlockedURL`) it failed with. Each fetch has its own
        ``timeout``, counted from the call. Other exceptions propagate, after
        the fetches still running are cancelled."""
        limit = new_limit(max_concurrent)
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
            raise blocked(f"invalid URL ({exc.__class__.__name__})") from None
        if parsed.scheme == "file":
            if self.allowed_local_path is None:
                raise blocked("file: URLs are refused (no allowed_local_path is set)")
            return
        self._check_url(parsed)

    # -- data: -----------------------------------------------------------------

    async def _fetch_data(self, url: str) -> bytes:
        comma = url.find(",")
        if comma >= 0:
            # Refuse from the length alone before decoding anything.
            payload = len(url) - comma - 1
            if payload // 4 * 3 > self.max_bytes + 2:
                raise too_large(
                    f"data: URL payload of {payload} characters is over the limit of {self.max_bytes} bytes"
                )
        if len(url) >= _DATA_URL_THREAD_CHARS:
            _, data = await asyncio.to_thread(decode_data_url, url)
        else:
            _, data = decode_data_url(url)
        if len(data) > self.max_bytes:
            raise too_large(f"data: URL holds {len(data)} bytes, over the limit of {self.max_bytes} bytes")
        return data

    # -- file: -----------------------------------------------------------------

    def _check_file_url(self, url: URL) -> None:
        if self.allowed_local_path is None:
            raise blocked("file: URLs are refused (no allowed_local_path is set)")
        if url.raw_host not in (None, "", "localhost"):
            raise blocked("file: URLs must not name a host")

    async def _fetch_file(self, url: URL) -> bytes:
        self._check_file_url(url)
        folder = self._local_folder
        assert folder is not None
        return await asyncio.to_thread(folder.read, url.path, self.max_bytes)

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
        where = describe(url)
        if url.scheme not in _HTTP_SCHEMES:
            raise blocked(f"scheme {url.scheme or '(none)'!r} is refused (http and https only)")
        if url.raw_user is not None or url.raw_password is not None:
            raise blocked(f"URLs with credentials are refused: {where}")
        host = url.raw_host
        if not host:
            raise blocked(f"URL has no host: {where}")
        if not host_allowed(host, self.allowed_domains):
            raise blocked(f"host {host!r} is not in allowed_domains: {where}")
        ip: IPAddress | None
        if ":" in host:
            try:
                ip = ipaddress.IPv6Address(url.host or "")
            except ValueError:
                raise blocked(f"invalid IPv6 host: {where}") from None
        else:
            ip = canonical_ipv4(host)
            if ip is None:
                if is_odd_ipv4_spelling(host):
                    raise blocked(f"numeric host in a non-canonical IPv4 spelling is refused: {where}")
                if HOST_NAME.fullmatch(host) is None:
                    raise blocked(f"invalid host name: {where}")
                return  # a name: its addresses are checked when the connector resolves it
        reason = self._address_refusal(host, ip)
        if reason is not None:
            raise blocked(f"address {ip} is refused ({reason}): {where}; {self.private_hint}")

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
        if is_odd_ipv4_spelling(host):
            raise blocked(f"numeric host in a non-canonical IPv4 spelling is refused: {host!r}")
        infos = await self._getaddrinfo(host, port, family)
        if not infos:
            raise OSError(f"no addresses for {host!r}")
        results: list[ResolveResult] = []
        for fam, proto, address in infos:
            try:
                ip = ipaddress.ip_address(address)
            except ValueError:
                raise blocked(f"host {host!r} resolved to an unparseable address") from None
            reason = self._address_refusal(host, ip)
            if reason is not None:
                raise blocked(f"host {host!r} resolves to {ip}, refused ({reason}); {self.private_hint}")
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
                    raise error(
                        FetchError,
                        f"HTTP {status}{reason} from {describe(url)}",
                        status=status,
                        retryable=status in (408, 429) or 500 <= status <= 599,
                    )
                return await read_body(response, url, self.max_bytes)
            except BaseException:
                response.close()  # drop the connection: its body was not read to the end
                raise
            finally:
                response.release()  # back to the pool when the body was read, else closed
        raise AssertionError("unreachable")  # pragma: no cover

    def _redirect_target(self, response: aiohttp.ClientResponse, url: URL, hop: int) -> URL:
        if hop >= self.max_redirects:
            raise error(
                FetchError, f"more than {self.max_redirects} redirects, the last from {describe(url)}"
            )
        location = response.headers.get("Location")
        if not location:
            raise error(
                FetchError,
                f"HTTP {response.status} redirect without a Location from {describe(url)}",
                status=response.status,
            )
        try:
            target = url.join(URL(location, encoded=False))
        except (ValueError, TypeError):
            raise blocked(f"invalid redirect target from {describe(url)}") from None
        if target.scheme not in _HTTP_SCHEMES:
            scheme = target.scheme or "(none)"
            raise blocked(f"redirect to scheme {scheme!r} is refused, from {describe(url)}")
        return target.with_fragment(None)


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
