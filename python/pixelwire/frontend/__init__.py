"""``pixelwire frontend``: an OpenAI-compatible reverse proxy in front of vLLM.

For ``POST /v1/chat/completions`` (and vLLM's other routes whose body is a
chat ``messages`` list: ``/tokenize``, ``/pooling``, ``/v1/embeddings``,
``/classify``) it decodes every image part concurrently into NIXL-registered
memory, swaps each URL for a (signed) descriptor reference that vLLM's
pixelwire media connector reads over NIXL, fetches every video and audio URL
through the same guard and hands vLLM the bytes, takes out every part's
client-chosen ``uuid`` (vLLM's cache key), forwards the request and streams
the answer back. Every other route passes through, except that a JSON body
holding a medium, a ``uuid`` media part or a ``pixelwire:`` reference is
refused there (vLLM would load such media itself, past this frontend's
guard). Upstream redirects are handed back, never followed. ``/metrics``
and ``GET /health`` are the frontend's own.

The parts: :mod:`~pixelwire.frontend.inspect` reads a request's path and
body (pure functions), :mod:`~pixelwire.frontend.pipeline` takes one
request's media from URLs to descriptor references, and
:mod:`~pixelwire.frontend.app` is the aiohttp application around them;
:mod:`~pixelwire.frontend.upstream_watch` holds the handshake with the
worker (image requests refused while its settings disagree);
:mod:`~pixelwire.frontend.errors` holds the error a client is answered.
"""

from pixelwire.frontend.app import Frontend, run
from pixelwire.frontend.errors import OpenAIError
from pixelwire.frontend.inspect import json_value_bound

__all__ = ["Frontend", "OpenAIError", "json_value_bound", "run"]
