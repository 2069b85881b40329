"""Whose a worker-mode video is, as the frontend tells the plug-in.

The plug-in's video decodes take turns among clients and hold at most a
client's share of the decode threads (:mod:`pixelwire.video.shares`), and
the turns remember the decoding time of a client whose decode was
abandoned. vLLM does not tell a media loader whose request it is, and
behind a frontend every request comes from the frontend's address, so on
its own the plug-in can only take a video's bytes for its client: an
attacker that varies its bytes on every attempt is a new client each time,
level with a victim however much decoding its abandoned attempts took.

The frontend knows the client (the peer address it shares decoding and
connections by). In worker mode it writes a ``data:`` video URL's header
anew as ``data:<media type>;pixelwire-client=<name>.<mac>;base64,`` with the
same payload: ``name`` the client's address in base64url, ``mac`` the
HMAC-SHA256 under ``PIXELWIRE_SECRET`` of the name (what vLLM reads of the
URL, its media type and payload, is unchanged: vLLM's grammar ignores the
parameters between them). The plug-in takes the named client only when
the signature matches its own secret; a URL without one, or with a wrong
one, or a plug-in without a secret, falls back to the bytes' digest. The
tag is not bound to the bytes: whoever sees the frontend's requests to
vLLM (the private side) could move a tag to other bytes, and gain only
another client's share.
"""

from __future__ import annotations

import base64
import binascii
import hmac

PARAMETER = "pixelwire-client"
_DOMAIN = b"pixelwire video client:"
# A header longer than this holds no tag of ours (the header is the text
# before the URL's first ","; an address is short).
_MAX_HEADER_CHARS = 512


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _mac(secret: bytes, name: str) -> str:
    return _b64(hmac.digest(secret, _DOMAIN + name.encode("ascii"), "sha256"))


def tagged_url(url: str, client: str, secret: bytes) -> str:
    """``url`` (a ``data:`` URL) with its header's parameters replaced by
    ``client``'s signed tag: the same media type and payload as vLLM reads
    them. A URL without the ``,`` or the ``;base64`` vLLM requires is left
    as it is (vLLM refuses it the same way)."""
    comma = url.find(",", 5)
    if url[:5].lower() != "data:" or comma < 0:
        return url
    header = url[5:comma]
    parameters, semicolon, encoding = header.rpartition(";")
    if not semicolon or encoding != "base64":
        return url
    media_type = parameters.partition(";")[0]
    name = _b64(client.encode("utf-8"))
    return f"data:{media_type};{PARAMETER}={name}.{_mac(secret, name)};base64{url[comma:]}"


def signed_client(url: str, secret: bytes | None) -> str | None:
    """The client a ``data:`` URL's tag names, when its signature matches
    ``secret``; None without a secret, a tag or a matching signature."""
    if secret is None or url[:5].lower() != "data:":
        return None
    header = url[5 : 5 + _MAX_HEADER_CHARS].partition(",")[0]
    for parameter in header.split(";")[1:]:
        key, equals, value = parameter.partition("=")
        if key != PARAMETER or not equals:
            continue
        name, dot, mac = value.partition(".")
        if not dot or not value.isascii() or not hmac.compare_digest(mac, _mac(secret, name)):
            return None
        try:
            return base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode("utf-8")
        except (binascii.Error, ValueError):
            return None
    return None
