"""What one chat request costs a running vLLM API server's process in CPU,
with an image or with none: the floor every request pays (HTTP, the chat
template, tokenizing, streaming the answer), which `pixelwire bench serve`'s
API-server CPU per image includes.

Against a server already running (vLLM itself, or a pixelwire frontend in
front of it: ``--url``), with the API server's process id (``--pid``: the
``vllm.entrypoints.openai.api_server`` process, whose threads are all
counted, from ``/proc/PID/task/*/schedstat``): first the process's CPU while
no request is in flight (``--idle`` seconds: what its threads spend per
second of wall time, NIXL's progress thread among them), then ``--requests``
streaming chat completions one after the other (8 tokens each, like
`pixelwire bench serve`), each with ``--image`` as a ``data:`` URL, or none
(``--image text``). Reports the CPU ms per request, the wall ms per request,
and the CPU ms per request less the idle rate times the wall time. Needs the
``openai`` client (vLLM's environment has it); the server must serve the
model as ``--model-name``.

    python benches/api_server_request_cpu.py --url http://HOST:PORT/v1 --pid PID --image photo-1080p.jpg
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import os
import time
from pathlib import Path
from typing import Any


def _cpu_ms(pid: int) -> float:
    """CPU ms of every live thread of ``pid`` so far (a thread that ended
    takes its time with it: read around a stretch where none do)."""
    total = 0
    for task in os.scandir(f"/proc/{pid}/task"):
        try:
            total += int(Path(task.path, "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e6


def _content(image: str) -> list[dict[str, Any]]:
    question = {"type": "text", "text": "What is in the image?"}
    if image == "text":
        return [{"type": "text", "text": "Describe the weather in one word."}]
    kind = "png" if image.lower().endswith(".png") else "jpeg"
    url = f"data:image/{kind};base64," + base64.b64encode(Path(image).read_bytes()).decode()
    return [{"type": "image_url", "image_url": {"url": url}}, question]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the OpenAI base URL (http://HOST:PORT/v1)")
    parser.add_argument("--pid", type=int, required=True, help="vLLM's API-server process id")
    parser.add_argument("--image", default="text", help="an image file sent with each request, or 'text'")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU measured first")
    parser.add_argument("--model-name", default="bench")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    # vLLM's environment has the client; the dev one need not.
    openai = importlib.import_module("openai")
    client = openai.OpenAI(base_url=args.url, api_key="unused")
    messages = [{"role": "user", "content": _content(args.image)}]

    def one() -> None:
        stream = client.chat.completions.create(
            model=args.model_name, messages=messages, max_tokens=8, temperature=0, stream=True
        )
        for _ in stream:
            pass

    one()  # warm-up: first-use costs are not a request's
    cpu, wall = _cpu_ms(args.pid), time.monotonic()
    time.sleep(args.idle)
    idle_ms_per_s = (_cpu_ms(args.pid) - cpu) / (time.monotonic() - wall)
    cpu, wall = _cpu_ms(args.pid), time.monotonic()
    for _ in range(args.requests):
        one()
    cpu_ms = (_cpu_ms(args.pid) - cpu) / args.requests
    wall_ms = (time.monotonic() - wall) * 1e3 / args.requests
    result = {
        "image": args.image,
        "requests": args.requests,
        "idle_cpu_ms_per_s": round(idle_ms_per_s, 2),
        "cpu_ms_per_request": round(cpu_ms, 2),
        "wall_ms_per_request": round(wall_ms, 1),
        "cpu_ms_per_request_less_idle": round(cpu_ms - idle_ms_per_s * wall_ms / 1e3, 2),
    }
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
