"""A pixelwire frontend in its own process, driven over stdin/stdout.

One JSON command a line in, one JSON answer a line out:
  {"cmd": "publish", "path": "...", "mode": "RGB"} -> {"desc": {...}} or {"error": "Class", "message": "..."}
  {"cmd": "publish_b64", "data": "<base64>"}       -> same
  {"cmd": "stats"}                                  -> {"stats": {...}}
  {"cmd": "rss"}                                    -> {"rss_kib": N}
  {"cmd": "exit"}
Arguments: pool_bytes lease_seconds acquire_timeout
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path

import pixelwire


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def main() -> None:
    pool_bytes, lease, acquire = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    loop = asyncio.get_running_loop()
    async with pixelwire.Publisher(
        pool_bytes=pool_bytes, lease_seconds=lease, acquire_timeout=acquire
    ) as pub:
        print(json.dumps({"ready": pub.agent_name}), flush=True)
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            answer: dict[str, object]
            if cmd["cmd"] == "exit":
                break
            if cmd["cmd"] == "stats":
                answer = {"stats": pub.stats()}
            elif cmd["cmd"] == "rss":
                answer = {"rss_kib": _rss_kib()}
            else:
                data = Path(cmd["path"]).read_bytes() if "path" in cmd else base64.b64decode(cmd["data"])
                try:
                    decoded = await pub.decode_and_publish(data, mode=cmd.get("mode", "RGB"))
                    answer = {"desc": decoded.to_dict()}
                except pixelwire.PixelwireError as error:
                    answer = {"error": type(error).__name__, "message": str(error)}
            print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
