"""How a frontend stops without failing requests.

SIGTERM starts a drain: ``/health`` answers 503 ``{"draining": true}`` at
once (a load balancer's health checks take the frontend out) while requests
that still arrive are served, each answer closing its connection; after
``drain_seconds`` (or a second SIGTERM, or SIGINT) the frontend stops
listening, lets the requests in flight finish (their images are freed as
each request ends: nothing is left for a lease to reclaim) and exits.
SIGINT alone skips the wait (the requests in flight still finish)."""

from __future__ import annotations

import asyncio
import logging
import signal

log = logging.getLogger("pixelwire.frontend")


class Drain:
    """The frontend's running state: serving, draining, or stopping."""

    def __init__(self, drain_seconds: float) -> None:
        self.drain_seconds = drain_seconds
        self.draining = False
        self._term = asyncio.Event()
        self._stop = asyncio.Event()

    def install(self) -> None:
        """Takes SIGTERM and SIGINT on the running loop."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self._on_term)
        loop.add_signal_handler(signal.SIGINT, self._on_int)

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)

    def _on_term(self) -> None:
        if self.draining:
            log.info("second SIGTERM: stopping now (requests in flight still finish)")
            self._stop.set()
            return
        self.draining = True
        self._term.set()
        log.info(
            "SIGTERM: draining (/health answers 503) for %g s, then stopping once the requests in "
            "flight finish",
            self.drain_seconds,
        )

    def _on_int(self) -> None:
        log.info("SIGINT: stopping (requests in flight still finish)")
        self.draining = True
        self._stop.set()

    async def wait(self) -> None:
        """Returns when the frontend should stop listening: drain_seconds
        after SIGTERM, or at once on a second SIGTERM or SIGINT."""
        waits = [asyncio.ensure_future(self._term.wait()), asyncio.ensure_future(self._stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not self._stop.is_set():
                try:
                    await asyncio.wait_for(self._stop.wait(), timeout=self.drain_seconds)
                except TimeoutError:
                    pass
        finally:
            for waiting in waits:
                waiting.cancel()
