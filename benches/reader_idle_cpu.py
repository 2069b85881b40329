"""What an open, idle pixelwire Reader costs its process in CPU, with NIXL's
progress thread on its agent (``ReaderSettings.progress_thread``, the
default; PIXELWIRE_READER_PROGRESS_THREAD in vLLM) and without: the
plug-in's reader is open for the life of vLLM's API server, so this is
spent per second of wall time whether requests come or not.

Each setting in turn, ``--rounds`` times: a reader opened, one second to
settle, then the process's CPU time (``time.process_time``: every thread)
over ``--seconds``, as ms per second; the reader closed. Needs NIXL (the
nixl wheel).

    python benches/reader_idle_cpu.py --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path


def idle_ms_per_s(progress_thread: bool, seconds: float) -> float:
    from pixelwire import Reader
    from pixelwire.config import ReaderSettings

    reader = Reader(ReaderSettings(progress_thread=progress_thread)).open()
    try:
        time.sleep(1.0)  # the agent's start-up is not idling
        cpu, wall = time.process_time(), time.monotonic()
        time.sleep(seconds)
        return (time.process_time() - cpu) * 1e3 / (time.monotonic() - wall)
    finally:
        asyncio.run(reader.close())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    found: dict[str, list[float]] = {"progress_thread": [], "no_progress_thread": []}
    for _ in range(args.rounds):
        for on in (True, False):
            rate = idle_ms_per_s(on, args.seconds)
            found["progress_thread" if on else "no_progress_thread"].append(round(rate, 2))
    result = {"idle_cpu_ms_per_s": found, "seconds": args.seconds}
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
