"""Fetching image bytes from URLs, guarded against SSRF.

:class:`Fetcher` turns a URL into bytes: ``data:`` URLs are decoded natively
(base64 only), ``http``/``https`` URLs go through one pooled aiohttp session,
and ``file:`` URLs are read only below an explicitly allowed directory.
:func:`load_image` fetches and decodes in one call.

The SSRF guard is on by default. For every hop of a request, the original URL
and each redirect, it checks:

* the scheme: ``http`` and ``https`` only (``data:`` and ``file:`` are never
  followed from a redirect);
* the host: no credentials in the URL, a plain name or a canonical address
  (no legacy IPv4 spelling such as ``2130706433`` or ``127.1``);
* the optional domain allow-list;
* every address of the host: literal addresses directly, names through a
  resolver that aiohttp's connector calls when it opens a connection and that
  returns only addresses it has checked, so the connection goes to the very
  address that was checked and there is no DNS-rebinding window. An address
  must be global; ``allow_private=True`` turns this check off.

The parts:

* :mod:`pixelwire.fetch.fetcher`: :class:`Fetcher` and :func:`load_image`,
  the hops, redirects, time limits and name resolution;
* :mod:`pixelwire.fetch.addresses`: the rules for host spellings, the domain
  allow-list and addresses (which are global, how IPv6 forms that embed an
  IPv4 address are judged);
* :mod:`pixelwire.fetch.content`: a response body read under the size cap,
  gzip and deflate decoded;
* :mod:`pixelwire.fetch.local`: ``file:`` URLs read without leaving the
  allowed folder;
* :mod:`pixelwire.fetch.concurrency`: one caller's share of the fetcher;
* :mod:`pixelwire.fetch.retries`: which failed fetches are tried again, and
  how long each try may take;
* :mod:`pixelwire.fetch.errors`: the errors (:class:`FetchTooLarge` for
  what is over the size cap) and how their messages name a URL.
"""

from pixelwire.fetch.addresses import IPAddress as IPAddress
from pixelwire.fetch.addresses import address_refusal as address_refusal
from pixelwire.fetch.errors import FetchTooLarge as FetchTooLarge
from pixelwire.fetch.fetcher import DEFAULT_MAX_BYTES as DEFAULT_MAX_BYTES
from pixelwire.fetch.fetcher import DEFAULT_USER_AGENT as DEFAULT_USER_AGENT
from pixelwire.fetch.fetcher import Fetcher, load_image

# `import *` gives the two names it always gave; the `as` form above re-exports the rest.
__all__ = ["Fetcher", "load_image"]
