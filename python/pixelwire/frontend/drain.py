"""How a frontend stops without failing requests.

SIGTERM starts a drain: ``/health`` answers 503 ``{"draining": true}`` at
once (a load balancer's health checks take the frontend out) while requests
that still arrive are served, each answer closing its connection; after
``drain_seconds``, or as soon as no request has been in flight and none has
come for ``idle_seconds`` (the frontend's own ``/health`` and ``/metrics``
aside: a load balancer that took the frontend out, or none at all, sends
nothing more), or on a second SIGTERM or SIGINT, the frontend stops
listening, lets the requests in flight finish (their images are freed as
each request ends: nothing is left for a lease to reclaim) and exits.
SIGINT alone skips the wait (the requests in flight still finish)."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from pixelwire.config import DRAIN_IDLE_SECONDS

log = logging.getLogger("pixelwire.frontend")


class Drain:
    """The frontend's running state: serving, draining, or stopping; and
    the requests in flight, which :meth:`request_started` and
    :meth:`request_ended` count."""

    def __init__(self, drain_seconds: float, idle_seconds: float = DRAIN_IDLE_SECONDS) -> None:
        self.drain_seconds = drain_seconds
        self.idle_seconds = idle_seconds
        self.draining = False
        self.in_flight = 0
        # When a request last began or ended (monotonic).
        self._last_request = time.monotonic()
        self._term = asyncio.Event()
        self._stop = asyncio.Event()

    def request_started(self) -> None:
        self.in_flight += 1
        self._last_request = time.monotonic()

    def request_ended(self) -> None:
        self.in_flight -= 1
        self._last_request = time.monotonic()

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
        # The drain's idle time counts from the signal.
        self._last_request = max(self._last_request, time.monotonic())
        self._term.set()
        log.info(
            "SIGTERM: draining (/health answers 503) for %g s, or until no request has come for %g s, "
            "then stopping once the requests in flight finish",
            self.drain_seconds,
            self.idle_seconds,
        )

    def _on_int(self) -> None:
        log.info("SIGINT: stopping (requests in flight still finish)")
        self.draining = True
        self._stop.set()

    async def wait(self) -> None:
        """Returns when the frontend should stop listening: drain_seconds
        after SIGTERM, or once it has been idle for idle_seconds since, or at
        once on a second SIGTERM or SIGINT."""
        waits = [asyncio.ensure_future(self._term.wait()), asyncio.ensure_future(self._stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            deadline = time.monotonic() + self.drain_seconds
            while not self._stop.is_set():
                now = time.monotonic()
                idle_until = self._last_request + self.idle_seconds
                if self.in_flight == 0 and now >= idle_until:
                    log.info("no request for %g s: the drain ends early", self.idle_seconds)
                    return
                if now >= deadline:
                    return
                # A request in flight, or one that came lately: look again
                # when the idle time could be up (or at the deadline).
                pause = idle_until - now if self.in_flight == 0 else self.idle_seconds
                try:
                    await asyncio.wait_for(self._stop.wait(), timeout=max(0.01, min(pause, deadline - now)))
                except TimeoutError:
                    pass
        finally:
            for waiting in waits:
                waiting.cancel()
