"""Whether a victim's video took turns with an attacker's video bombs or
queued behind them, judged from every request's (start, end).

A bomb with less left to decode than the victim needs rightly ends first
when the two take turns, so only victims sent while some bomb had far more
left (``slack`` times the slowest quiet victim) are judged: each must be
answered before such a bomb ends. First come, first served, every bomb
sent before it would end first, however long it had left. The attacker's
senders start one quiet bomb apart (``stagger``): senders that start
together take turns, so end together, and a victim sent just before then
could not be judged."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Span = tuple[float, float]


@dataclass(frozen=True)
class Turns:
    """The victims judged (sent while a bomb had more than ``need``
    seconds left) and, for each, whether it was answered before such a bomb
    ended."""

    need: float
    judged: list[Span]
    ahead: list[bool]

    def check(self, least: int, bombs: Sequence[Span]) -> None:
        """At least ``least`` victims judged, and each took its turns."""
        assert len(self.judged) >= least, ("too few victims sent while a bomb had long to go", self, bombs)
        assert all(self.ahead), ("a victim's video waited for a bomb that had long to go", self, bombs)

    def __str__(self) -> str:
        return f"{len(self.judged)} victims judged (a bomb had over {self.need:.2f} s to go)"


def turns(quiet: Sequence[Span], loaded: Sequence[Span], bombs: Sequence[Span], slack: float = 4.0) -> Turns:
    """The victims of ``loaded`` judged against ``bombs``, with ``slack``
    times the slowest of ``quiet`` as what a victim needs."""
    need = slack * max(end - start for start, end in quiet)

    def long_to_go(start: float, end: float, sent: float) -> bool:
        return start < sent and end - sent > need

    judged = [(sent, answered) for sent, answered in loaded if any(long_to_go(*bomb, sent) for bomb in bombs)]
    ahead = [
        any(long_to_go(*bomb, sent) and bomb[1] > answered for bomb in bombs) for sent, answered in judged
    ]
    return Turns(need, judged, ahead)
