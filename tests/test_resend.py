"""What a frontend takes for the plug-in's answers after which it sends a
request again (pixelwire.resend): only a JSON error whose message starts
with one of the two markers."""

from __future__ import annotations

import json

import pytest

from pixelwire.resend import NOT_HELD, READ_FAILED, asks_for_resend


@pytest.mark.parametrize("marker", [READ_FAILED, NOT_HELD], ids=["read-failed", "not-held"])
def test_only_the_plugins_markers_ask_for_a_resend(marker: str) -> None:
    """The marker at the start of vLLM's error message, nowhere else."""

    def answer(message: object) -> bytes:
        return json.dumps({"error": {"message": message, "type": "BadRequestError", "code": 400}}).encode()

    assert asks_for_resend(answer(f"{marker}this worker could not have it"))
    assert not asks_for_resend(answer(f"The model `{marker}` does not exist."))
    assert not asks_for_resend(answer("pixelwire: descriptor reference signature does not match"))
    assert not asks_for_resend(answer(None))
    assert not asks_for_resend(marker.encode())
    assert not asks_for_resend(b"{not json")
    assert not asks_for_resend(json.dumps([marker]).encode())
