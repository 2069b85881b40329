"""A pixelwire publisher (what the frontend runs) in a child process, driven over stdin/stdout.

Used by `pixelwire demo`, `pixelwire bench transfer` and the tests. One JSON
command a line in, one JSON answer a line out:

  {"cmd": "publish", "data": "<base64>" | "path": "<file>", "mode": "RGB", "count": 1}
      -> {"descs": [...]} or {"error": "PoolExhausted", "message": "..."}
  {"cmd": "publish_source", "source": "<url>"} -> {"item": {...}} or {"error": ...}
  {"cmd": "stats"} -> {"stats": {...}}        {"cmd": "rss"} -> {"rss_kib": N}
  {"cmd": "naive_prepare", "size": N}  -> {"metadata": "<b64>", "addr": A, "size": N, "id": K}
  {"cmd": "naive_release", "id": K}    -> {"ok": true}
  {"cmd": "exit"}

The "naive" commands are the benchmark's baseline: a fresh NIXL registration
and fresh agent metadata for every image, through the `nixl` Python API.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib
import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

import pixelwire
from pixelwire import config
from pixelwire.video.sampling import VideoSampling


def rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def nixl_python_api() -> Any:
    """The `nixl` wheel's own Python API module (nixl_cu13 or nixl_cu12)."""
    for name in ("nixl_cu13._api", "nixl_cu12._api", "nixl._api"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise pixelwire.TransferError("the nixl Python API is not installed")


class _Naive:
    def __init__(self) -> None:
        api = nixl_python_api()
        self.agent = api.nixl_agent(f"naive-front-{os.getpid()}", api.nixl_agent_config(backends=["UCX"]))
        self.live: dict[int, tuple[Any, Any]] = {}
        self.next_id = 0

    def prepare(self, size: int) -> dict[str, Any]:
        buffer = np.full(size, 7, dtype=np.uint8)
        registration = self.agent.register_memory([(buffer.ctypes.data, size, 0, "")], mem_type="DRAM")
        metadata = self.agent.get_agent_metadata()
        self.next_id += 1
        self.live[self.next_id] = (buffer, registration)
        return {
            "metadata": base64.b64encode(metadata).decode(),
            "addr": buffer.ctypes.data,
            "size": size,
            "id": self.next_id,
        }

    def release(self, key: int) -> None:
        _, registration = self.live.pop(key)
        self.agent.deregister_memory(registration)


def _answers_channel() -> Any:
    """The replies get standard output to themselves: libraries that log to
    file descriptor 1 (UCX prints its warnings there) go to stderr instead,
    so a log line can never be read as an answer."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return replies


def arguments(
    pool_bytes: int, lease: float, acquire: float, region_bytes: int, cache_bytes: int = 0
) -> list[str]:
    """The Python arguments that run :func:`serve` with these settings in a
    process of its own (after the interpreter; launchers put theirs first)."""
    return [
        "-m",
        "pixelwire.publisher_process",
        *map(str, (pool_bytes, lease, acquire, region_bytes, cache_bytes)),
    ]


async def serve(
    pool_bytes: int, lease: float, acquire: float, region_bytes: int, cache_bytes: int = 0
) -> None:
    replies = _answers_channel()
    loop = asyncio.get_running_loop()
    naive: _Naive | None = None
    publisher = pixelwire.Publisher(
        pool_bytes=pool_bytes,
        lease_seconds=lease,
        acquire_timeout=acquire,
        region_bytes=region_bytes,
        cache_bytes=cache_bytes,
    )
    async with publisher as pub:
        ready = pub.agent_name if pub.decode_at == "frontend" else "pass-through"
        print(json.dumps({"ready": ready}), file=replies, flush=True)
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            cmd = json.loads(line)
            answer: dict[str, Any]
            kind = cmd["cmd"]
            if kind == "exit":
                break
            if kind == "stats":
                answer = {"stats": pub.stats() if pub.decode_at == "frontend" else {}}
            elif kind == "rss":
                answer = {"rss_kib": rss_kib()}
            elif kind == "naive_prepare":
                naive = naive or _Naive()
                answer = naive.prepare(int(cmd["size"]))
            elif kind == "naive_release":
                assert naive is not None
                naive.release(int(cmd["id"]))
                answer = {"ok": True}
            elif kind == "publish_video":
                sampling = VideoSampling.from_video_kwargs(
                    cmd.get("video_kwargs", {}), cmd.get("loader", "opencv")
                )
                try:
                    video = await pub.decode_and_publish_video(
                        base64.b64decode(cmd["data"]), sampling=sampling
                    )
                    answer = {"desc": video.to_dict()}
                except pixelwire.PixelwireError as error:
                    answer = {"error": type(error).__name__, "message": str(error)}
            elif kind == "publish_source":
                try:
                    item = await pub.decode_and_publish(cmd["source"], mode=cmd.get("mode", "RGB"))
                    answer = {"item": item.to_dict()}
                except pixelwire.PixelwireError as error:
                    answer = {"error": type(error).__name__, "message": str(error)}
            else:
                data = Path(cmd["path"]).read_bytes() if "path" in cmd else base64.b64decode(cmd["data"])
                try:
                    descs = []
                    for _ in range(int(cmd.get("count", 1))):
                        decoded = await pub.decode_and_publish(
                            data, mode=cmd.get("mode", "RGB"), layout=cmd.get("layout", "HWC")
                        )
                        descs.append(decoded.to_dict())
                    answer = {"descs": descs}
                except pixelwire.PixelwireError as error:
                    answer = {"error": type(error).__name__, "message": str(error)}
            print(json.dumps(answer), file=replies, flush=True)


class PublisherProcess:
    """Starts and talks to a publisher child process. With ``answer_timeout``
    (seconds), a command the child does not answer in time is a
    ``TimeoutError`` instead of a wait for ever (the soak bench kills
    children and must not hang on one)."""

    def __init__(
        self,
        pool_bytes: int = config.POOL_BYTES,
        lease: float = config.LEASE_SECONDS,
        acquire: float = config.ACQUIRE_TIMEOUT,
        env: dict[str, str] | None = None,
        region_bytes: int = config.REGION_BYTES,
        answer_timeout: float | None = None,
        cache_bytes: int = 0,
    ) -> None:
        env = {**os.environ, "NIXL_LOG_LEVEL": os.environ.get("NIXL_LOG_LEVEL", "FATAL"), **(env or {})}
        self.answer_timeout = answer_timeout
        self.proc = subprocess.Popen(
            [sys.executable, *arguments(pool_bytes, lease, acquire, region_bytes, cache_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.agent: str = self._answer("start")["ready"]

    def _answer(self, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        # One line per answer, so the text wrapper never holds a second
        # line that select() would not see.
        if self.answer_timeout is not None:
            ready, _, _ = select.select([self.proc.stdout], [], [], self.answer_timeout)
            if not ready:
                raise TimeoutError(f"frontend {what}: no answer within {self.answer_timeout:g} s")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"frontend {what}: the process died (exit {self.proc.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._answer(str(cmd.get("cmd")))

    def publish_many(self, data: bytes, count: int, mode: str = "RGB", layout: str = "HWC") -> dict[str, Any]:
        encoded = base64.b64encode(data).decode()
        return self.ask(cmd="publish", data=encoded, mode=mode, count=count, layout=layout)

    def publish_file(self, path: Path, mode: str = "RGB") -> dict[str, Any]:
        """One image the frontend reads from disk itself (no copy through the pipe)."""
        answer = self.ask(cmd="publish", path=str(path), mode=mode)
        return {"desc": answer["descs"][0]} if "descs" in answer else answer

    def publish(self, data: bytes, mode: str = "RGB", layout: str = "HWC") -> dict[str, Any]:
        """One image: {"desc": ...} or {"error": ..., "message": ...}."""
        answer = self.publish_many(data, 1, mode, layout)
        return {"desc": answer["descs"][0]} if "descs" in answer else answer

    def publish_video(
        self, data: bytes, loader: str = "opencv", video_kwargs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One video sampled as vLLM's ``loader`` with ``video_kwargs``
        (vLLM's --media-io-kwargs video part): {"desc": ...} or {"error": ...}."""
        encoded = base64.b64encode(data).decode()
        return self.ask(cmd="publish_video", data=encoded, loader=loader, video_kwargs=video_kwargs or {})

    def stats(self) -> dict[str, int]:
        stats: dict[str, int] = self.ask(cmd="stats")["stats"]
        return stats

    def rss_kib(self) -> int:
        return int(self.ask(cmd="rss")["rss_kib"])

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Asks the child to exit; kills it if it does not within 20 s."""
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=20)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


if __name__ == "__main__":
    asyncio.run(
        serve(int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    )
