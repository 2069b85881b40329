"""Plumbing for the fault suite: two network namespaces joined by a veth
pair, a pixelwire publisher process in one and a worker (Reader) process in
the other, both on UCX over TCP pinned to their veth end.

Every name carries this process's pid, the addresses (10.231.0.1/30 and
10.231.0.2/30) exist only inside the two namespaces, and `NetPair.close()`
deletes both namespaces (which deletes the veth pair and every qdisc or
nftables table in them) whatever happened before.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
from netns import CMD_TIMEOUT, Unavailable, cleanup_stale, sh, wait_carrier
from PIL import Image

import pixelwire

FRONT_ADDR = "10.231.0.1"
WORKER_ADDR = "10.231.0.2"
PREFIX = "pwf"
WORKER_SCRIPT = Path(__file__).resolve().parent / "_fault_worker.py"


class NetPair:
    """Namespace A (frontend) and B (worker) joined by veth A<->B."""

    _count = 0

    def __init__(self) -> None:
        NetPair._count += 1
        self.ns_front = f"{PREFIX}-{os.getpid()}-a{NetPair._count}"
        self.ns_worker = f"{PREFIX}-{os.getpid()}-b{NetPair._count}"
        # Interface names are at most 15 characters.
        short = f"{os.getpid() % 10_000_000}{NetPair._count % 100:02d}"
        self.dev_front = f"pwa{short}"
        self.dev_worker = f"pwb{short}"
        self.nft_tables: list[str] = []
        self._created: list[str] = []

    def open(self) -> NetPair:
        cleanup_stale(PREFIX)
        try:
            for ns in (self.ns_front, self.ns_worker):
                sh("ip", "netns", "add", ns)
                self._created.append(ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            # Created inside A, so the pair never touches the host's namespace.
            sh(
                "ip", "-n", self.ns_front, "link", "add", self.dev_front,
                "type", "veth", "peer", "name", self.dev_worker, "netns", self.ns_worker,
            )  # fmt: skip
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            self.close()
            raise Unavailable(f"cannot create network namespaces and a veth pair: {error}") from error
        for ns, dev, addr in (
            (self.ns_front, self.dev_front, FRONT_ADDR),
            (self.ns_worker, self.dev_worker, WORKER_ADDR),
        ):
            sh("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
        self.wait_carrier()
        if shutil.which("ping") is not None:
            ping = sh("ip", "netns", "exec", self.ns_worker, "ping", "-c1", "-W5", FRONT_ADDR, check=False)
            if ping.returncode != 0:
                raise RuntimeError(f"the veth pair passes no traffic: {ping.stdout} {ping.stderr}")
        return self

    def wait_carrier(self, within: float = 20.0) -> None:
        wait_carrier(self._both(), within)

    def close(self) -> None:
        for ns in reversed(self._created):
            sh("ip", "netns", "del", ns, check=False)
        self._created.clear()

    # -- impairments -------------------------------------------------------

    def _both(self) -> list[tuple[str, str]]:
        return [(self.ns_front, self.dev_front), (self.ns_worker, self.dev_worker)]

    def rate_limit(self, rate: str = "64mbit") -> None:
        """A token bucket on both ends: makes a 24 MB READ take seconds."""
        for ns, dev in self._both():
            sh(
                "tc", "-n", ns, "qdisc", "replace", "dev", dev, "root",
                "tbf", "rate", rate, "burst", "64kb", "latency", "400ms",
            )  # fmt: skip

    def clear_qdiscs(self) -> None:
        for ns, dev in self._both():
            sh("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)

    def netem(self, spec: list[str]) -> bool:
        """`tc netem` on both ends; False where the kernel has no sch_netem."""
        for ns, dev in self._both():
            done = sh("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "netem", *spec, check=False)
            if done.returncode != 0:
                if "unknown" in done.stderr.lower() or "no such file" in done.stderr.lower():
                    self.clear_qdiscs()
                    return False
                raise RuntimeError(f"tc netem {spec} failed: {done.stderr.strip()}")
        return True

    def random_drop(self, percent: int) -> bool:
        """Drops `percent`% of the packets arriving in each namespace with
        nftables (the fallback for netem's loss); False without `nft`."""
        if shutil.which("nft") is None:
            return False
        for ns in (self.ns_front, self.ns_worker):
            rules = (
                "table inet pwfault {\n"
                "  chain in { type filter hook input priority 0; policy accept;\n"
                f"    numgen random mod 100 < {percent} counter drop\n"
                "  }\n"
                "}\n"
            )
            done = subprocess.run(
                ["ip", "netns", "exec", ns, "nft", "-f", "-"],
                input=rules, capture_output=True, text=True, timeout=CMD_TIMEOUT, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"nft failed in {ns}: {done.stderr.strip()}")
            self.nft_tables.append(ns)
        return True

    def dropped(self) -> int:
        """Packets the random-drop rules have dropped so far."""
        total = 0
        for ns in self.nft_tables:
            out = sh("ip", "netns", "exec", ns, "nft", "-j", "list", "table", "inet", "pwfault").stdout
            for item in json.loads(out).get("nftables", []):
                for expr in item.get("rule", {}).get("expr", []):
                    if "counter" in expr:
                        total += int(expr["counter"]["packets"])
        return total

    def clear_drops(self) -> None:
        for ns in self.nft_tables:
            sh("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "pwfault", check=False)
        self.nft_tables.clear()

    def link(self, up: bool) -> None:
        """`ip link set down/up` on the frontend's end (takes the pair's carrier)."""
        sh("ip", "-n", self.ns_front, "link", "set", self.dev_front, "up" if up else "down")
        if up:
            self.wait_carrier()

    def worker_rx_bytes(self) -> int:
        out = sh("ip", "-n", self.ns_worker, "-s", "-j", "link", "show", "dev", self.dev_worker).stdout
        return int(json.loads(out)[0]["stats64"]["rx"]["bytes"])


class _Lines:
    """A child's stdout, line by line, with a timeout on every read."""

    def __init__(self, stream: IO[str]) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.noise: list[str] = []
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        try:
            for line in stream:
                if line.startswith("{"):
                    self._queue.put(line)
                else:
                    # UCX writes its warnings to stdout: kept, not answers.
                    self.noise.append(line.rstrip())
        except (OSError, ValueError):
            pass
        self._queue.put(None)

    def get(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON line; None at end of stream; TimeoutError if none came."""
        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no answer within {timeout:.0f} s") from None
        return None if line is None else json.loads(line)

    def ready(self) -> bool:
        return not self._queue.empty()


class Child:
    """A Python child run inside a namespace with UCX pinned to its veth."""

    name = "child"

    def __init__(self, ns: str, dev: str, argv: list[str], log: Path) -> None:
        env = {
            **os.environ,
            "UCX_TLS": "tcp",
            "UCX_NET_DEVICES": dev,
            "NIXL_LOG_LEVEL": os.environ.get("NIXL_LOG_LEVEL", "ERROR"),
            "PYTHONUNBUFFERED": "1",
        }
        self.log_path = log
        self._log = log.open("w")
        # `ip netns exec` execs the command itself: the pid is the child's.
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None
        self.lines = _Lines(self.proc.stdout)

    def first(self, timeout: float = 90.0) -> dict[str, Any]:
        answer = self.lines.get(timeout)
        if answer is None:
            raise RuntimeError(f"{self.name} died at start: {self.log_tail()}")
        return answer

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def ask(self, timeout: float = 60.0, **cmd: Any) -> dict[str, Any]:
        self.send(**cmd)
        answer = self.lines.get(timeout)
        if answer is None:
            raise RuntimeError(f"{self.name} died: {self.log_tail()}")
        return answer

    def alive(self) -> bool:
        return self.proc.poll() is None

    def sigkill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        noise = "\n".join(self.lines.noise)
        return (f"{text}\n[stdout, not JSON]\n{noise}" if noise else text)[-chars:]

    def close(self) -> None:
        if self.alive():
            try:
                self.send(cmd="exit")
                self.proc.wait(timeout=20)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        if self.alive():
            self.proc.kill()
            self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        self._log.close()


def publisher_argv(pool_bytes: int, lease: float, acquire: float, region_bytes: int) -> list[str]:
    """`python -m pixelwire.publisher_process` with these settings (its
    cache of published images off)."""
    from pixelwire import publisher_process

    return publisher_process.arguments(pool_bytes, lease, acquire, region_bytes)


class Frontend(Child):
    """pixelwire's own publisher process (`pixelwire.publisher_process`)."""

    name = "frontend"

    def __init__(self, net: NetPair, log: Path, lease: float, pool_bytes: int = 128 << 20) -> None:
        argv = publisher_argv(pool_bytes, lease, 10.0, 64 << 20)
        super().__init__(net.ns_front, net.dev_front, argv, log)
        self.agent = self.first()["ready"]

    def publish_file(self, path: Path, count: int = 1) -> list[dict[str, Any]]:
        answer = self.ask(cmd="publish", path=str(path), count=count)
        assert "descs" in answer, answer
        descs: list[dict[str, Any]] = answer["descs"]
        return descs

    def stats(self) -> dict[str, int]:
        stats: dict[str, int] = self.ask(cmd="stats", timeout=30)["stats"]
        return stats

    def drained(self, within: float) -> tuple[bool, dict[str, int]]:
        """Waits (bounded) for every slot to be freed; returns the last stats."""
        deadline = time.monotonic() + within
        stats = self.stats()
        while time.monotonic() < deadline:
            if stats["slots_in_use"] == 0 and stats["bytes_in_use"] == 0:
                return True, stats
            time.sleep(0.25)
            stats = self.stats()
        return stats["slots_in_use"] == 0 and stats["bytes_in_use"] == 0, stats


class Worker(Child):
    """A Reader in its own process (tests/faults/_fault_worker.py)."""

    name = "worker"

    def __init__(self, net: NetPair, log: Path, timeout: float) -> None:
        super().__init__(net.ns_worker, net.dev_worker, [str(WORKER_SCRIPT), str(timeout)], log)
        self.timeout = timeout
        self.first()

    def start_read(self, desc: dict[str, Any]) -> None:
        self.send(cmd="read", desc=desc)
        started = self.lines.get(60)
        assert started == {"event": "started"}, (started, self.log_tail())

    def result(self, within: float) -> dict[str, Any]:
        try:
            answer = self.lines.get(within)
        except TimeoutError as error:
            raise AssertionError(
                f"HANG: the worker's read gave no answer within {within:.0f} s "
                f"(reader timeout {self.timeout} s); worker log: {self.log_tail()}"
            ) from error
        if answer is None:
            raise AssertionError(f"the worker died during a read: {self.log_tail()}")
        return answer

    def read(self, desc: dict[str, Any], within: float) -> dict[str, Any]:
        self.start_read(desc)
        return self.result(within)


def pixels_sha256(data: bytes) -> str:
    pixels = np.ascontiguousarray(pixelwire.decode_image(data))
    return hashlib.sha256(pixels.tobytes()).hexdigest()


@dataclass(frozen=True)
class FaultImage:
    path: Path
    data: bytes
    sha256: str  # of the decoded pixels
    pixel_bytes: int


def _png(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    # Blocks of noise over a gradient: every region differs, so a zeroed or
    # reused slot can never pass for the image; PNG level 1 keeps it quick.
    coarse = rng.integers(0, 256, (height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    pixels = np.repeat(np.repeat(coarse, 8, axis=0), 8, axis=1)[:height, :width]
    pixels[:, :, 0] ^= (np.arange(width, dtype=np.uint32) % 256).astype(np.uint8)[None, :]
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG", compress_level=1)
    return out.getvalue()


def make_image(folder: Path, name: str, width: int, height: int, seed: int) -> FaultImage:
    data = _png(width, height, seed)
    path = folder / name
    path.write_bytes(data)
    return FaultImage(path, data, pixels_sha256(data), width * height * 3)


class Procs:
    """Starts frontends and workers in the pair and ends them all at teardown."""

    def __init__(self, net: NetPair, logs: Path) -> None:
        self.net = net
        self.logs = logs
        self.started: list[Frontend | Worker] = []

    def frontend(self, lease: float) -> Frontend:
        front = Frontend(self.net, self.logs / f"frontend{len(self.started)}.log", lease=lease)
        self.started.append(front)
        return front

    def worker(self, timeout: float) -> Worker:
        worker = Worker(self.net, self.logs / f"worker{len(self.started)}.log", timeout=timeout)
        self.started.append(worker)
        return worker

    def close(self) -> None:
        for child in reversed(self.started):
            try:
                child.close()
            except Exception as error:  # noqa: BLE001 - teardown must reach the namespaces
                print(f"closing {child.name}: {error!r}")
