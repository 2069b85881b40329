"""A request sent upstream once more (:mod:`pixelwire.resend`), and, in
worker mode, the record that lets a resent image go as a reference.

After the plug-in's answer that it could not READ one of a request's
images, the request is sent once more with its images published anew;
after its answer that it no longer held a resent image, once more with
its ``data:`` URLs in full. In worker mode with a secret, the frontend
keeps the ``data:`` URLs its worker was sent in requests it answered, by
digest (a :class:`~pixelwire.caches.data_urls.DataUrlMemo`), so that a
resend goes as a reference to the bytes it holds
(:mod:`pixelwire.resent_reference`), while the worker's handshake says it
keeps them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from pixelwire.caches.data_urls import DataUrlMemo
from pixelwire.config import data_url_memo_bytes
from pixelwire.frontend.pipeline import MediaPipeline
from pixelwire.frontend.settings import FrontendConfig
from pixelwire.handshake import WorkerSettings
from pixelwire.resent_reference import data_url_digest
from pixelwire.signing import secret_fingerprint

log = logging.getLogger("pixelwire.frontend")

# The SHA-256 and size of each data: URL a request sent in full (None: one
# vLLM would not decode), computed while the request is upstream.
Digests = asyncio.Task[list[tuple[str, int] | None]]


class ResendRecord:
    """The frontend's side of sending a request again: its counts, and
    worker mode's record of the ``data:`` URLs the worker was sent."""

    def __init__(self, config: FrontendConfig, registry: CollectorRegistry) -> None:
        self.resent = Counter(
            "pixelwire_frontend_resent_after_read_failure",
            "Requests sent upstream once more, their images published anew, after the plug-in "
            "answered that it could not READ one of them (nothing was generated)",
            registry=registry,
        )
        # Worker mode: the data: URLs the worker was sent in requests it
        # answered, by digest. Needs the secret.
        worker_mode = config.decode_at == "worker" and config.secret is not None
        cache_bytes = config.publisher.cache_bytes
        self.sent_urls = DataUrlMemo(data_url_memo_bytes(cache_bytes) if worker_mode else 0)
        # What the worker's handshake shows for a secret it shares (slow to
        # compute on purpose: once, here, not on the event loop).
        self._fingerprint = secret_fingerprint(config.secret) if worker_mode else None
        # Digests being computed for that record, held until done.
        self._noting: set[asyncio.Task[Any]] = set()
        self.resent_references = Counter(
            "pixelwire_frontend_resent_references",
            "Images and videos whose data: URL the worker was sent before, sent on as a reference to the "
            "bytes it holds (worker mode)",
            registry=registry,
        )
        self.resent_not_held = Counter(
            "pixelwire_frontend_resent_not_held",
            "Requests sent upstream once more, their data: URLs in full, after the plug-in answered that "
            "it no longer held a resent image (worker mode; nothing was generated)",
            registry=registry,
        )

    def for_request(self, worker: WorkerSettings | None) -> DataUrlMemo | None:
        """The record to send resent images by: only while the worker's last
        handshake (``worker``) says it keeps the data: URLs it decoded and
        checks this frontend's signatures."""
        if not self.sent_urls.budget or worker is None or worker.memo != "1":
            return None
        return self.sent_urls if worker.secret == self._fingerprint else None

    def digests(self, pipeline: MediaPipeline, worker: WorkerSettings | None) -> Digests | None:
        """The digests of the data: URLs a worker-mode request sends in full,
        computed off the loop (a base64 decode and a SHA-256 each) while
        the request is upstream; None when there are none to note."""
        if not pipeline.sent_in_full or self.for_request(worker) is None:
            return None
        urls = pipeline.sent_in_full
        task = asyncio.create_task(asyncio.to_thread(lambda: [data_url_digest(url) for url in urls]))
        # Held until done, whatever becomes of the request.
        self._noting.add(task)
        task.add_done_callback(self._noting.discard)
        return task

    async def answered(self, pipeline: MediaPipeline | None, digests: Digests | None, status: int) -> None:
        """The upstream's status for a request, before its answer is relayed.
        A 2xx means the worker loaded the request's media (vLLM loads them
        before it schedules a request): its data: URLs sent in full are
        noted, for their resends to go as references. Noted before the
        answer goes out, so a client's next turn finds them; the digests
        were computed while the request was upstream, so this rarely waits."""
        if pipeline is None or not 200 <= status < 300:
            return
        self.resent_references.inc(len(pipeline.referenced))
        if digests is None:
            return
        # Shielded: a client gone meanwhile cancels this wait, not the digests.
        found = await asyncio.shield(digests)
        for url, digest in zip(pipeline.sent_in_full, found, strict=True):
            if digest is not None:
                self.sent_urls.remember_digest(url, pipeline.cache_salt, *digest)

    def resending(self, pipeline: MediaPipeline, path: str) -> None:
        """The plug-in asked for ``pipeline``'s request to be sent again:
        counted, and a resent image it no longer holds forgotten here, so
        that the next try sends its URL in full."""
        if pipeline.referenced:
            # Worker mode has nothing to READ: the worker no longer holds one.
            log.info("the upstream no longer holds a resent image for %s: sending in full", path)
            self.resent_not_held.inc()
            for url in pipeline.referenced:
                self.sent_urls.forget(url, pipeline.cache_salt)
        else:
            log.info("the upstream could not READ an image for %s: publishing it anew, once", path)
            self.resent.inc()
