"""The SSRF guard: hostile URLs refused before they reach the test server, and
the address rules (IPv4 ranges, IPv6 forms that embed an IPv4 address).

There is no DNS here, so the SSRF tests use ``HookedFetcher``, which overrides
the fetcher's two documented test seams: ``_getaddrinfo`` (fake DNS for a few
made-up names) and ``_address_refusal`` (treats the two made-up names
``public.example`` and ``cdn.example`` as public although they resolve to the
loopback test server, so that they can stand in for hosts on the internet).
Every other name and address goes through the real guard.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pixelwire
from pixelwire.fetch import Fetcher, address_refusal
from pixelwire.fetch.addresses import DEPLOYMENT_PRIVATE_HINT

from reference import CORPUS

PUBLIC_NAMES = {"public.example", "cdn.example"}
FAKE_DNS = {
    # Stand-ins for hosts on the internet; the test server listens behind them.
    "public.example": ["127.0.0.1"],
    "cdn.example": ["127.0.0.1"],
    # Hostile names: the real guard must refuse them.
    "evil.example": ["127.0.0.1"],
    "evil6.example": ["::1"],
    "dual.example": ["93.184.215.14", "::1"],  # one public address, one loopback
    "metadata.example": ["169.254.169.254"],
    "rfc1918.example": ["10.1.2.3"],
    "nat64.example": ["64:ff9b::a9fe:a9fe"],  # a DNS64 answer for the metadata address
}


class HookedFetcher(Fetcher):
    """A Fetcher with fake DNS and two made-up names treated as public (test seams only)."""

    async def _getaddrinfo(self, host: str, port: int, family: int) -> list[tuple[int, int, str]]:
        addresses = FAKE_DNS.get(host.rstrip("."))
        if addresses is None:
            return await super()._getaddrinfo(host, port, family)
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.IPPROTO_TCP, a)
            for a in addresses
            if family in (0, socket.AF_INET6 if ":" in a else socket.AF_INET)
        ]

    def _address_refusal(self, host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
        if host.rstrip(".") in PUBLIC_NAMES:
            return None
        return super()._address_refusal(host, ip)


def hooked(kind: str, allowed: Path) -> HookedFetcher:
    options: dict[str, Any] = {"timeout": 10.0, "connect_timeout": 2.0}
    if kind == "allowlist":
        options["allowed_domains"] = ["public.example"]
    elif kind == "local":
        options["allowed_local_path"] = allowed
    return HookedFetcher(**options)


TO = "http://public.example:{port}/to?url="
HOSTILE: list[tuple[str, str]] = [
    # Loopback in every IPv4 spelling.
    ("default", "http://127.0.0.1:{port}/secret"),
    ("default", "https://127.0.0.1:{port}/secret"),
    ("default", "http://127.0.0.2:{port}/secret"),
    ("default", "http://2130706433:{port}/secret"),
    ("default", "http://0x7f000001:{port}/secret"),
    ("default", "http://0x7f.0x0.0x0.0x1:{port}/secret"),
    ("default", "http://0x7f.1:{port}/secret"),
    ("default", "http://017700000001:{port}/secret"),
    ("default", "http://0177.0.0.1:{port}/secret"),
    ("default", "http://127.1:{port}/secret"),
    ("default", "http://127.0.1:{port}/secret"),
    ("default", "http://0:{port}/secret"),
    ("default", "http://0.0.0.0:{port}/secret"),
    ("default", "http://%31%32%37.0.0.1:{port}/secret"),
    ("default", "http://\u2460\u2461\u2466.\u24ea.\u24ea.\u2460:{port}/secret"),  # circled digits
    ("default", "http://127\u30020\u30020\u30021:{port}/secret"),  # ideographic full stops
    # IPv6 forms.
    ("default", "http://[::1]:{port}/secret"),
    ("default", "http://[0:0:0:0:0:0:0:1]:{port}/secret"),
    ("default", "http://[::ffff:127.0.0.1]:{port}/secret"),
    ("default", "http://[::ffff:7f00:1]:{port}/secret"),
    ("default", "http://[::ffff:10.0.0.1]:{port}/secret"),
    ("default", "http://[::ffff:0:7f00:1]:{port}/secret"),  # IPv4-translated (SIIT)
    ("default", "http://[::10.0.0.1]:{port}/secret"),
    ("default", "http://[64:ff9b::10.0.0.1]:{port}/secret"),
    ("default", "http://[64:ff9b:1::a00:1]:{port}/secret"),  # local-use NAT64
    ("default", "http://[2001:0:808:808::f5ff:fffe]:{port}/secret"),  # Teredo, client 10.0.0.1
    ("default", "http://[::127.0.0.1]:{port}/secret"),
    ("default", "http://[::]:{port}/secret"),
    ("default", "http://[64:ff9b::7f00:1]:{port}/secret"),
    ("default", "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/"),
    ("default", "http://[2002:7f00:1::1]:{port}/secret"),
    ("default", "http://[fe80::1%25lo]:{port}/secret"),
    ("default", "http://[fc00::1]/"),
    ("default", "http://[fd00:ec2::254]/latest/meta-data/"),
    ("default", "http://[ff02::1]/"),
    ("default", "http://[2001:db8::1]/"),
    ("default", "http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/"),  # Teredo
    # Private, link-local, metadata, CGNAT, multicast, reserved IPv4.
    ("default", "http://10.0.0.1/"),
    ("default", "http://172.16.0.1/"),
    ("default", "http://192.168.1.1/"),
    ("default", "http://169.254.169.254/latest/meta-data/"),
    ("default", "http://169.254.170.2/v2/credentials"),
    ("default", "http://100.64.0.1/"),
    ("default", "http://224.0.0.1/"),
    ("default", "http://240.0.0.1/"),
    ("default", "http://255.255.255.255/"),
    ("default", "http://192.0.2.1/"),
    ("default", "http://198.18.0.1/"),
    ("default", "http://192.0.0.170/"),
    # Names that resolve to refused addresses.
    ("default", "http://localhost:{port}/secret"),
    ("default", "http://LocalHost:{port}/secret"),
    ("default", "http://evil.example:{port}/secret"),
    ("default", "http://EVIL.example.:{port}/secret"),
    ("default", "http://evil6.example:{port}/secret"),
    ("default", "http://dual.example:{port}/secret"),
    ("default", "http://metadata.example/latest/meta-data/"),
    ("default", "http://rfc1918.example/"),
    ("default", "http://nat64.example/latest/meta-data/"),
    # A public-looking host that redirects to a private address.
    ("default", TO + "http://127.0.0.1:{port}/secret"),
    ("default", TO + "http://localhost:{port}/secret"),
    ("default", TO + "http://evil.example:{port}/secret"),
    ("default", TO + "http://[::1]:{port}/secret"),
    ("default", TO + "http://2130706433:{port}/secret"),
    ("default", TO + "http://169.254.169.254/latest/meta-data/"),
    ("default", TO + "file:///etc/passwd"),
    ("default", TO + "gopher://127.0.0.1:{port}/_secret"),
    ("default", TO + "data:image/png;base64,iVBORw0KGgo="),
    # Schemes.
    ("default", "file:///etc/passwd"),
    ("default", "file://{allowed}/inside.png"),  # no allowed_local_path: file: is off
    ("local", "file:///etc/passwd"),
    ("local", "file://{allowed}/../outside.png"),
    ("local", "file://{allowed}/%2e%2e/outside.png"),
    ("local", "file://{allowed}/link.png"),  # a symlink that leads outside
    ("local", "file://public.example{allowed}/inside.png"),
    ("default", "ftp://127.0.0.1:{port}/secret"),
    ("default", "gopher://127.0.0.1:{port}/_GET%20/secret"),
    ("default", "dict://127.0.0.1:{port}/"),
    ("default", "ws://127.0.0.1:{port}/secret"),
    ("default", "javascript:alert(1)"),
    ("default", "//127.0.0.1:{port}/secret"),
    ("default", "/secret"),
    ("default", "http://public.example@127.0.0.1:{port}/secret"),
    ("default", "http://user:pass@public.example:{port}/secret"),
    # The domain allow-list, on the first hop and on a redirect.
    ("allowlist", "http://cdn.example:{port}/secret"),
    ("allowlist", "http://public.example.cdn.example:{port}/secret"),
    ("allowlist", "http://127.0.0.1:{port}/secret"),
    ("allowlist", TO + "http://cdn.example:{port}/secret"),
]


def _case_id(case: tuple[str, str]) -> str:
    kind, template = case
    return f"{kind}:{template.replace('{port}', 'P').replace('{allowed}', 'A')}"


@pytest.mark.parametrize(("kind", "template"), HOSTILE, ids=[_case_id(c) for c in HOSTILE])
def test_hostile_url_is_blocked_and_never_reaches_the_server(
    kind: str, template: str, tmp_path: Path, serve: Callable[..., Any]
) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "inside.png").write_bytes((CORPUS / "hopper.png").read_bytes())
    (tmp_path / "outside.png").write_bytes((CORPUS / "hopper.png").read_bytes())
    os.symlink(tmp_path / "outside.png", allowed / "link.png")

    async def main() -> None:
        async with serve() as server, hooked(kind, allowed) as fetcher:
            url = template.format(port=server.port, allowed=allowed)
            with pytest.raises(pixelwire.BlockedURL) as caught:
                await fetcher.fetch(url)
            assert caught.value.status is None
            assert caught.value.retryable is False
            print(f"\n{url!r}: {caught.value}")
            if template.startswith(TO):
                # The public-looking first hop is served; the hop it redirects to is not.
                assert len(server.log) == 1 and server.log[0].startswith("/to?")
            else:
                assert server.log == []

    asyncio.run(main())


def test_hostile_table_is_large_enough() -> None:
    assert len(HOSTILE) >= 25


def test_hooked_names_reach_the_server_when_nothing_is_hostile(serve: Callable[..., Any]) -> None:
    """Controls for the table: the hooks work, so only the guard stops the hostile cases."""
    data = (CORPUS / "hopper.png").read_bytes()

    async def main() -> None:
        async with serve() as server, hooked("allowlist", Path("/")) as allowlisted:
            async with hooked("default", Path("/")) as fetcher:
                assert await fetcher.fetch(f"http://public.example:{server.port}/img/hopper.png") == data
                redirect = f"http://public.example:{server.port}/to?url=http://cdn.example:{server.port}/img/hopper.png"
                assert await fetcher.fetch(redirect) == data
            assert await allowlisted.fetch(f"http://public.example:{server.port}/img/hopper.png") == data
            assert await allowlisted.fetch(f"http://PUBLIC.example.:{server.port}/img/hopper.png") == data
            assert len(server.log) == 5 and server.log[1].startswith("/to?")
            assert [p for i, p in enumerate(server.log) if i != 1] == ["/img/hopper.png"] * 4

    asyncio.run(main())


def test_the_real_default_fetcher_blocks_the_test_server(serve: Callable[..., Any]) -> None:
    async def main() -> None:
        async with serve() as server, Fetcher() as fetcher:
            for host in ("127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "2130706433"):
                with pytest.raises(pixelwire.BlockedURL):
                    await fetcher.fetch(server.url("/img/hopper.png", host=host))
            assert server.log == []

    asyncio.run(main())


def test_allow_private_opts_out_of_the_address_check_only(
    serve: Callable[..., Any], open_fetcher: Callable[..., Fetcher]
) -> None:
    async def main() -> None:
        async with serve() as server, open_fetcher() as fetcher:
            assert await fetcher.fetch(server.url("/img/hopper.png", host="localhost"))
            # Odd spellings, schemes and credentials stay refused.
            for url in (
                server.url("/secret", host="2130706433"),
                server.url("/secret", host="127.1"),
                f"ftp://127.0.0.1:{server.port}/secret",
                f"http://u:p@127.0.0.1:{server.port}/secret",
                "file:///etc/passwd",
            ):
                with pytest.raises(pixelwire.BlockedURL):
                    await fetcher.fetch(url)
            assert server.log == ["/img/hopper.png"]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("8.8.8.8", False),
        ("1.1.1.1", False),
        ("2606:4700:4700::1111", False),
        ("64:ff9b::808:808", False),  # NAT64 of 8.8.8.8
        ("2002:808:808::1", False),  # 6to4 of 8.8.8.8
        ("127.0.0.1", True),
        ("10.255.255.255", True),
        ("172.31.0.1", True),
        ("192.168.0.1", True),
        ("169.254.169.254", True),
        ("100.127.255.255", True),
        ("0.0.0.0", True),
        ("224.0.0.251", True),
        ("255.255.255.255", True),
        ("::1", True),
        ("::", True),
        ("::ffff:8.8.8.8", False),  # IPv4-mapped: the IPv4 rule
        ("::8.8.8.8", True),
        ("fe80::1", True),
        ("fec0::1", True),
        ("fd12:3456::1", True),
        ("ff0e::1", True),
        ("64:ff9b::a00:1", True),
        ("64:ff9b:1::1", True),
        ("2002:a00:1::1", True),
        ("2001::1", True),
        ("2001:db8::1", True),
    ],
)
def test_address_policy(address: str, refused: bool) -> None:
    assert (address_refusal(ipaddress.ip_address(address)) is not None) is refused


# -- embedded IPv4 in IPv6: one rule ---------------------------------------------------

# Every IPv6 form that embeds an IPv4 address is judged by the IPv4 rule applied
# to what it embeds; a form whose public addresses are refused all the same says
# so. (address, refused, words the refusal must contain)
EMBEDDED_IPV4: list[tuple[str, bool, str]] = [
    # IPv4-mapped: a socket connects to the IPv4 address itself.
    ("::ffff:10.0.0.1", True, "embeds 10.0.0.1"),
    ("::ffff:127.0.0.1", True, "embeds 127.0.0.1"),
    ("::ffff:169.254.169.254", True, "embeds 169.254.169.254"),
    ("::ffff:8.8.8.8", False, ""),
    # IPv4-translated (SIIT, ::ffff:0:0:0/96): obsolete, public ones refused too.
    ("::ffff:0:10.0.0.1", True, "embeds 10.0.0.1"),
    ("::ffff:0:8.8.8.8", True, "IPv4-translated"),
    # IPv4-compatible (::/96): deprecated, public ones refused too.
    ("::10.0.0.1", True, "embeds 10.0.0.1"),
    ("::192.168.1.1", True, "embeds 192.168.1.1"),
    ("::8.8.8.8", True, "IPv4-compatible"),
    # NAT64, the well-known prefix: a translator reaches the IPv4 address.
    ("64:ff9b::10.0.0.1", True, "embeds 10.0.0.1"),
    ("64:ff9b::100.64.0.1", True, "embeds 100.64.0.1"),
    ("64:ff9b::8.8.8.8", False, ""),
    # NAT64, the local-use prefix (64:ff9b:1::/48): the site picks the prefix
    # length, so every RFC 6052 layout that fits must embed a public address.
    ("64:ff9b:1::10.0.0.1", True, "embeds"),
    ("64:ff9b:1::8.8.8.8", True, "embeds 0.0.0.0"),  # public at /96, 0.0.0.0 at /48
    ("64:ff9b:1:a00:0:108:808:808", True, "embeds 10.0.0.1"),  # 10.0.0.1 at /48
    ("64:ff9b:1:808:8:808:808:808", False, ""),  # 8.8.8.8 in every layout
    # 6to4 (2002::/16): the relay delivers to the IPv4 router it names.
    ("2002:a00:1::1", True, "embeds 10.0.0.1"),
    ("2002:7f00:1::1", True, "embeds 127.0.0.1"),
    ("2002:808:808::1", False, ""),
    # Teredo (2001::/32): server and (obfuscated) client IPv4; refused even when public.
    ("2001:0:808:808::f5ff:fffe", True, "embeds 10.0.0.1"),  # client 10.0.0.1
    ("2001:0:a00:1::f7f7:f7f7", True, "embeds 10.0.0.1"),  # server 10.0.0.1
    ("2001:0:808:808::f7f7:f7f7", True, "Teredo"),  # both 8.8.8.8
]


@pytest.mark.parametrize(("address", "refused", "words"), EMBEDDED_IPV4)
def test_embedded_ipv4_is_judged_by_the_ipv4_rule(address: str, refused: bool, words: str) -> None:
    reason = address_refusal(ipaddress.IPv6Address(address))
    print(f"\n{address}: {reason}")
    assert (reason is not None) is refused
    if refused:
        assert words in (reason or "")


def test_a_refused_private_address_says_how_this_fetcher_allows_it() -> None:
    """A Fetcher made in code names its own switch (allow_private=True, and
    the variable of pixelwire's default fetchers), not the CLI's flags; the
    frontend's and the plug-in's (DEPLOYMENT_PRIVATE_HINT) name both
    settings, since worker mode needs both (the frontend checks a URL, the
    plug-in checks it again)."""
    with pytest.raises(pixelwire.BlockedURL) as refused:
        pixelwire.Fetcher().check("http://127.0.0.1:9/x.png")
    message = str(refused.value)
    assert "loopback" in message
    assert "allow_private=True" in message and "PIXELWIRE_ALLOW_PRIVATE=1" in message
    assert "--allow-private" not in message
    with pytest.raises(pixelwire.BlockedURL) as refused:
        pixelwire.Fetcher(private_hint=DEPLOYMENT_PRIVATE_HINT).check("http://127.0.0.1:9/x.png")
    message = str(refused.value)
    assert "--allow-private" in message and "PIXELWIRE_ALLOW_PRIVATE=1" in message
