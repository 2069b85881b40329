"""A worker-mode video's client as the frontend signs it into the URL's
header (``pixelwire.video_client``): vLLM reads the same media type and
payload, the plug-in reads the client back only under the same secret, and
a missing, altered or forged tag names no client."""

from __future__ import annotations

import base64

import pytest

from pixelwire.loader_input import data_url_parts
from pixelwire.video_client import PARAMETER, signed_client, tagged_url

SECRET = b"video-client-secret"
PAYLOAD = base64.b64encode(b"\x00\x00\x00\x18ftypisom" + bytes(range(256))).decode()


@pytest.mark.parametrize(
    "url",
    [
        f"data:video/mp4;base64,{PAYLOAD}",
        f"data:video/mp4;codecs=avc1;base64,{PAYLOAD}",
        f"data:VIDEO/MP4;base64,{PAYLOAD}",
        f"data:;base64,{PAYLOAD}",
        f"data:video/mp4;{PARAMETER}=forged.forged;base64,{PAYLOAD}",
    ],
)
def test_vllm_reads_the_same_media_type_and_payload_from_a_tagged_url(url: str) -> None:
    tagged = tagged_url(url, "203.0.113.7", SECRET)
    assert data_url_parts(tagged) == data_url_parts(url)
    assert signed_client(tagged, SECRET) == "203.0.113.7"


def test_each_client_has_its_own_tag_and_ipv6_addresses_fit() -> None:
    url = f"data:video/mp4;base64,{PAYLOAD}"
    tags = {tagged_url(url, client, SECRET) for client in ("127.0.0.1", "127.0.0.2", "2001:db8::1")}
    assert len(tags) == 3
    assert {signed_client(tag, SECRET) for tag in tags} == {"127.0.0.1", "127.0.0.2", "2001:db8::1"}


def test_a_tag_under_another_secret_or_none_names_no_client() -> None:
    tagged = tagged_url(f"data:video/mp4;base64,{PAYLOAD}", "127.0.0.1", SECRET)
    assert signed_client(tagged, b"another secret") is None
    assert signed_client(tagged, None) is None


def test_an_altered_or_forged_tag_names_no_client() -> None:
    tagged = tagged_url(f"data:video/mp4;base64,{PAYLOAD}", "127.0.0.1", SECRET)
    header, _, payload = tagged.partition(",")
    name, _, mac = header.split(f"{PARAMETER}=")[1].split(";")[0].partition(".")
    other = base64.urlsafe_b64encode(b"127.0.0.9").rstrip(b"=").decode()
    for forged in (f"{other}.{mac}", f"{name}.{mac[:-1]}A", f"{name}.", name, f"{name}.\u00e9{mac[1:]}"):
        assert signed_client(f"data:video/mp4;{PARAMETER}={forged};base64,{payload}", SECRET) is None
    assert signed_client(f"data:video/mp4;base64,{payload}", SECRET) is None


def test_a_url_vllm_refuses_is_left_as_it_came() -> None:
    for url in (f"data:video/mp4,{PAYLOAD}", "data:video/mp4;base64", "https://example.com/v.mp4"):
        assert tagged_url(url, "127.0.0.1", SECRET) == url
