"""How the serving reports write a figure: milliseconds and megabytes as
table text (``pixelwire.bench.report`` and ``pixelwire.bench.turns_report``)."""

from __future__ import annotations


def ms_text(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def mb_text(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.2f}"
