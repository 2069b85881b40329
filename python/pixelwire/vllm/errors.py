"""The exception the plug-in raises inside vLLM for each fault: vLLM's own
for the same fault, so vLLM's server answers with the same HTTP status
(its ``create_error_response``: ``ValueError`` 400,
``VLLMUnprocessableEntityError`` 422, ``NotImplementedError`` 501, anything
else 500).

* a 4xx from the image host (but 408 and 429) or a body over
  ``VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB``: ``VLLMUnprocessableEntityError`` (422);
* a 5xx, 408 or 429 from the image host, a timeout, a refused or broken
  connection, a local file that cannot be read: the
  :class:`pixelwire.FetchError` itself (500, as vLLM's server answers the
  aiohttp or OS error vLLM's loader raises);
* what pixelwire's guard refuses (an address, credentials in the URL, a
  redirect off the allowed domains, a ``file:`` URL outside
  ``--allowed-local-media-path``) and every other pixelwire error (an image
  over a limit, a bad descriptor): ``ValueError`` (400), as vLLM answers a
  URL off its allowed domains or outside its local path; a READ that
  failed (:class:`pixelwire.TransferError`) says so first
  (:data:`pixelwire.resend.READ_FAILED`), for the frontend to resend.
"""

from __future__ import annotations

from vllm.exceptions import VLLMUnprocessableEntityError
from yarl import URL

from pixelwire._native import BlockedURL, FetchError, PixelwireError, TransferError
from pixelwire.fetch import FetchTooLarge
from pixelwire.fetch.errors import describe
from pixelwire.resend import READ_FAILED

# What vLLM's _wrap_media_fetch_error leaves as they are (transient) among 4xx.
_TRANSIENT_CLIENT_STATUSES = (408, 429)


def _safe(url: str) -> str:
    """The URL as pixelwire's messages name one: no query, no payload."""
    if url[:5].lower() == "data:":
        return "data:..."
    try:
        return describe(URL(url))
    except (ValueError, TypeError):
        return "(invalid URL)"


def _unprocessable(message: str, url: str) -> Exception:
    """vLLM's 422, as vLLM's ``_wrap_media_fetch_error`` makes it: it names
    ``image_url`` as the parameter for every kind of media (a video's fetch
    too), and so does this, so that a client sees vLLM's own answer."""
    unprocessable: Exception = VLLMUnprocessableEntityError(message, parameter="image_url", value=_safe(url))
    return unprocessable


def as_vllm_error(error: PixelwireError, url: str, local_root: object = None) -> Exception:
    """vLLM's exception for the fault ``error`` reports on ``url``;
    ``local_root`` is vLLM's ``--allowed-local-media-path``, named in the
    refusal of a ``file:`` URL as vLLM names it."""
    if isinstance(error, FetchTooLarge):
        return _unprocessable(f"Failed to fetch media from URL: pixelwire: {error}", url)
    if isinstance(error, BlockedURL):
        if url[:5].lower() == "file:" and local_root is not None:
            return ValueError(
                f"pixelwire: {error}: the file path must be a subpath of "
                f"`--allowed-local-media-path {local_root}`."
            )
        return ValueError(f"pixelwire: {error}")
    if isinstance(error, FetchError):
        status = error.status
        if status is not None and status < 500 and status not in _TRANSIENT_CLIENT_STATUSES:
            return _unprocessable(f"Failed to fetch media from URL: HTTP {status} error", url)
        return error
    if isinstance(error, TransferError):
        # Marked so that the frontend may send the request again (pixelwire.resend).
        return ValueError(f"{READ_FAILED}{error}")
    return ValueError(f"pixelwire: {error}")


def local_files_refused() -> RuntimeError:
    """vLLM's answer to a ``file:`` URL without ``--allowed-local-media-path``."""
    return RuntimeError("Cannot load local files without `--allowed-local-media-path`.")
