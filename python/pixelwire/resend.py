"""The two answers after which a frontend sends a request again. vLLM loads
a request's media before it schedules the request, so nothing was
generated for it in either case.

* :data:`READ_FAILED`: the plug-in could not READ one of its images (the
  frontend's slot was reclaimed or reused, the peer went away, the NIXL
  network broke or is partitioned, a READ ran past its timeout). Sent
  again with fresh references (each image published anew, in a slot of its
  own), it may reach another replica, or the same one over a new connection.
* :data:`NOT_HELD`: a resent image's reference
  (:mod:`pixelwire.resent_reference`) named bytes the plug-in no longer
  holds (evicted, restarted, or another replica). Sent again with its
  ``data:`` URLs in full.

The plug-in's message starts with the marker; a frontend looks for it at
the start of the error message of a 400 answer (vLLM's ``ErrorResponse``),
never anywhere else in a body."""

from __future__ import annotations

import json

READ_FAILED = "pixelwire: image READ failed before generation: "
NOT_HELD = "pixelwire: resent image not held before generation: "


def asks_for_resend(answer: bytes) -> bool:
    """Whether ``answer`` (a 400's body) is one of the plug-in's two answers
    after which the request is sent again."""
    try:
        message = json.loads(answer)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(message, str) and message.startswith((READ_FAILED, NOT_HELD))
