"""The worker side of the fault suite: a `pixelwire.Reader` in its own
process (started inside a network namespace by the tests), driven over
stdin/stdout, one JSON line each way:

  {"cmd": "read", "desc": {...}, "output": "numpy"}
      -> {"event": "started"} then
         {"ok": true, "sha256": "...", "shape": [...], "elapsed": s}
         or {"ok": false, "error": "TransferError", "typed": true, "message": "...", "elapsed": s}
  {"cmd": "stats"} -> {"stats": {...}}
  {"cmd": "exit"}

Not collected by pytest (no test_ prefix); run as a script.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
from typing import Any

import numpy as np

import pixelwire


def _say(answer: dict[str, Any]) -> None:
    print(json.dumps(answer), flush=True)


async def main(timeout: float) -> None:
    loop = asyncio.get_running_loop()
    async with pixelwire.Reader(timeout=timeout) as reader:
        _say({"ready": True})
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            if cmd["cmd"] == "exit":
                break
            if cmd["cmd"] == "stats":
                _say({"stats": reader.stats()})
                continue
            _say({"event": "started"})
            started = time.monotonic()
            try:
                got = await reader.read_decoded(cmd["desc"], output="numpy")
                pixels = np.ascontiguousarray(got)
                _say(
                    {
                        "ok": True,
                        "sha256": hashlib.sha256(pixels.tobytes()).hexdigest(),
                        "shape": list(pixels.shape),
                        "elapsed": time.monotonic() - started,
                    }
                )
                del got, pixels
            except Exception as error:  # noqa: BLE001 - the test judges the type
                _say(
                    {
                        "ok": False,
                        "error": type(error).__name__,
                        "typed": isinstance(error, pixelwire.PixelwireError),
                        "message": str(error),
                        "elapsed": time.monotonic() - started,
                    }
                )


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1])))
