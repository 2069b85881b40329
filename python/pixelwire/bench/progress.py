"""A progress bar on stderr: redrawn in place on a terminal, one line per
cell otherwise (logs stay readable)."""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any

WIDTH = 24


class Progress:
    def __init__(self, cells: int) -> None:
        self.cells = cells
        self.done = 0
        self.label = ""
        self.requests = 0
        self.errors = 0
        self.started = time.monotonic()
        self.cell_started = self.started
        self.interactive = sys.stderr.isatty()
        self._last_draw = 0.0

    def start_cell(self, label: str) -> None:
        self.label = label
        self.requests = 0
        self.errors = 0
        self.cell_started = time.monotonic()
        self._draw(force=True)

    def request_done(self, outcome: Any) -> None:
        self.requests += 1
        self.errors += outcome.error is not None
        self._draw()

    def end_cell(self) -> None:
        self.done += 1
        if not self.interactive:
            seconds = time.monotonic() - self.cell_started
            failed = f", {self.errors} errors" if self.errors else ""
            where = f"[{self.done}/{self.cells}] {self.label}"
            print(
                f"{where}: {self.requests} requests{failed} in {seconds:.1f} s", file=sys.stderr, flush=True
            )
        self._draw(force=True)

    def close(self) -> None:
        if self.interactive:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.interactive or (not force and now - self._last_draw < 0.2):
            return
        self._last_draw = now
        filled = WIDTH * self.done // max(1, self.cells)
        elapsed = now - self.started
        left = ""
        if self.done:
            left = f", ~{_clock(elapsed / self.done * (self.cells - self.done))} left"
        failed = f" {self.errors} err" if self.errors else ""
        line = (
            f"[{'#' * filled}{'.' * (WIDTH - filled)}] {self.done}/{self.cells} cells "
            f"{_clock(elapsed)}{left} | {self.label}: {self.requests} req{failed}"
        )
        columns = shutil.get_terminal_size((120, 20)).columns
        sys.stderr.write("\r" + line[: columns - 1].ljust(columns - 1))
        sys.stderr.flush()


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"
