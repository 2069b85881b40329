"""Which failed fetches are tried again, and how long each try may take.

vLLM's way (``vllm/connections.py``, 0.32): try ``n`` (from 0) has the
fetch's timeout times ``growth**n`` and follows a pause of
``backoff * growth**(n - 1)`` seconds; vLLM's own loader uses 3 tries,
``backoff`` 1 and ``growth`` 4 (1 s, then 4 s). Only what is safe to repeat
is tried again (:attr:`pixelwire.FetchError.retryable`: a timeout, a
connection error, HTTP 408, 429 or 5xx), never a URL the guard refused nor
one over a limit; only ``http(s)`` fetches are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pixelwire import config
from pixelwire._native import BlockedURL, FetchError
from pixelwire.fetch.errors import FetchTooLarge

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in all (1: no retry), the first pause ``backoff``
    seconds, each try's time limit and pause ``growth`` times the last."""

    attempts: int = config.FETCH_ATTEMPTS
    backoff: float = config.FETCH_RETRY_BACKOFF
    growth: float = config.FETCH_RETRY_GROWTH

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if not self.backoff >= 0 or not self.growth >= 1:
            raise ValueError("retry_backoff must not be negative, retry_growth not under 1")

    def timeout(self, base: float, attempt: int) -> float:
        """Try ``attempt``'s time limit, for a fetch whose first has ``base`` seconds."""
        return base * self.growth**attempt

    def pause(self, attempt: int) -> float:
        """Seconds to wait before try ``attempt``."""
        return 0.0 if attempt == 0 else self.backoff * self.growth ** (attempt - 1)

    @staticmethod
    def is_worth_retrying(error: FetchError) -> bool:
        return error.retryable and not isinstance(error, BlockedURL | FetchTooLarge)

    async def run(self, attempt: Callable[[float], Awaitable[T]], base_timeout: float) -> T:
        """``attempt(timeout)`` until it succeeds, fails in a way not worth
        retrying or has had its tries; raises the last try's error."""
        for n in range(self.attempts):
            if n:
                await asyncio.sleep(self.pause(n))
            try:
                return await attempt(self.timeout(base_timeout, n))
            except FetchError as error:
                if not self.is_worth_retrying(error) or n + 1 == self.attempts:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover
