"""The one answer after which a frontend sends a request again: the
plug-in could not READ one of its images (the frontend's slot was
reclaimed or reused, the peer went away, the NIXL network broke or is
partitioned, a READ ran past its timeout). vLLM loads a request's media
before it schedules the request, so nothing was generated for it; sent
again with fresh references (each image published anew, in a slot of its
own), it may reach another replica, or the same one over a new connection.

The plug-in's message for such a failure starts with :data:`READ_FAILED`;
a frontend looks for it at the start of the error message of a 400 answer
(vLLM's ``ErrorResponse``), never anywhere else in a body."""

from __future__ import annotations

import json

READ_FAILED = "pixelwire: image READ failed before generation: "


def is_read_failure(answer: bytes) -> bool:
    """Whether ``answer`` (a 400's body) is the plug-in's READ failure."""
    try:
        message = json.loads(answer)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(message, str) and message.startswith(READ_FAILED)
