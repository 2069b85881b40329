"""What a frontend takes for the plug-in's READ failure (pixelwire.resend):
only a JSON error whose message starts with the marker."""

from __future__ import annotations

import json

from pixelwire.resend import READ_FAILED, is_read_failure


def test_only_the_plugins_read_failure_is_one() -> None:
    """The marker at the start of vLLM's error message, nowhere else."""

    def answer(message: object) -> bytes:
        return json.dumps({"error": {"message": message, "type": "BadRequestError", "code": 400}}).encode()

    assert is_read_failure(answer(f"{READ_FAILED}READ of 64 bytes from x timed out after 5s"))
    assert not is_read_failure(answer(f"The model `{READ_FAILED}` does not exist."))
    assert not is_read_failure(answer("pixelwire: descriptor reference signature does not match"))
    assert not is_read_failure(answer(None))
    assert not is_read_failure(READ_FAILED.encode())
    assert not is_read_failure(b"{not json")
    assert not is_read_failure(json.dumps([READ_FAILED]).encode())
