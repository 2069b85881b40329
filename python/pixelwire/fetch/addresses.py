"""The SSRF guard's rules for hosts and addresses.

A host is refused when its spelling is not a plain name or a canonical
address: names are made of letters, digits, ``-``, ``_`` and ``.`` only, and
no numeric host may be in a legacy IPv4 spelling (decimal ``2130706433``, hex
``0x7f.1``, octal ``0177.0.0.1``, short ``127.1``), since resolvers map those
onto addresses the check would not see. The optional domain allow-list names
hosts exactly, ``"*.example.com"`` every subdomain of example.com.

An address must be global: loopback, private (RFC 1918, ULA), link-local
(cloud metadata at 169.254.169.254 included), CGNAT, multicast, reserved,
unspecified, documentation and benchmarking ranges are refused. Every IPv6
form that embeds an IPv4 address is judged by one rule, the IPv4 rule applied
to what it embeds: IPv4-mapped (``::ffff:0:0/96``), NAT64 (``64:ff9b::/96``;
for the local-use ``64:ff9b:1::/48``, whose prefix length the site picks, the
address in every RFC 6052 layout that fits) and 6to4 (``2002::/16``)
addresses are fetched from when that is public; IPv4-compatible (``::/96``,
deprecated), IPv4-translated (``::ffff:0:0:0/96``, obsolete) and Teredo
(``2001::/32``: server and client) addresses are refused even then. One
refused address refuses the whole host.

``allow_private=True`` on a :class:`pixelwire.Fetcher` turns the address check
off (to reach services on the local network); the scheme, host-spelling and
allow-list checks stay on.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Final

from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# A host name as it reaches the resolver: IDNA-encoded, lower case.
HOST_NAME: Final = re.compile(r"[a-z0-9_.-]+")
# A final label that is a number in any base: the host is an IPv4 spelling.
_NUMERIC_LABEL: Final = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")

# How a refusal of a private address says to allow it. A Fetcher made in
# code is told so in code; pixelwire's default fetchers (decode_and_publish's)
# read the variable.
PRIVATE_HINT: Final = (
    "a Fetcher reaches private addresses when made with allow_private=True (pixelwire's default "
    "fetchers, as decode_and_publish uses: PIXELWIRE_ALLOW_PRIVATE=1)"
)
# The frontend's and the plug-in's: both settings, since worker mode needs
# both (the frontend checks a URL before passing it on, and the plug-in
# checks it again when vLLM fetches).
DEPLOYMENT_PRIVATE_HINT: Final = (
    "private addresses are allowed by --allow-private on pixelwire frontend and "
    "PIXELWIRE_ALLOW_PRIVATE=1 for the vLLM plug-in"
)

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


def canonical_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The address when ``host`` is a canonical dotted quad (a trailing dot allowed)."""
    try:
        return ipaddress.IPv4Address(host[:-1] if host.endswith(".") else host)
    except ValueError:
        return None


def is_odd_ipv4_spelling(host: str) -> bool:
    """True for numeric hosts that are not a canonical dotted quad (``0x7f.1``, ``127.1``, ...)."""
    bare = host[:-1] if host.endswith(".") else host
    if canonical_ipv4(bare) is not None:
        return False
    try:
        socket.inet_aton(bare)
    except OSError:
        pass
    else:
        return True
    last_label = bare.rsplit(".", 1)[-1]
    return bool(last_label) and _NUMERIC_LABEL.fullmatch(last_label) is not None


def normalise_domain(domain: str) -> str:
    """An ``allowed_domains`` entry as hosts are matched against it: IDNA-encoded, lower case."""
    if not isinstance(domain, str) or not domain:
        raise TypeError(f"allowed_domains entries must be non-empty strings, not {domain!r}")
    wildcard = domain.startswith("*.")
    name = domain[2:] if wildcard else domain
    host = URL.build(scheme="http", host=name.rstrip(".")).raw_host
    if not host:
        raise ValueError(f"invalid domain in allowed_domains: {domain!r}")
    return f"*.{host}" if wildcard else host


def host_allowed(host: str, domains: frozenset[str] | None) -> bool:
    """Whether ``host`` is one of ``domains`` (normalised entries), or there is no allow-list."""
    if domains is None:
        return True
    host = host.rstrip(".")
    if host in domains:
        return True
    if ":" in host or canonical_ipv4(host) is not None:
        return False  # addresses match exactly or not at all
    labels = host.split(".")
    return any(f"*.{'.'.join(labels[i:])}" in domains for i in range(1, len(labels)))
