"""The processes a serving benchmark starts (vLLM's OpenAI server, the
``pixelwire frontend``), a local image server, and what is read from them:
CPU time from /proc and Prometheus samples from ``/metrics``."""

from __future__ import annotations

import contextlib
import http.server
import os
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# Ports handed to servers come from below Linux's ephemeral range (32768 up),
# so that no outgoing connection's source port can take one between this
# check and the server's own bind; picked at random so that two runs on one
# host rarely pick the same one.
_LISTEN_PORTS = range(20000, 32768)


def free_port(host: str) -> int:
    """A port on ``host`` nothing listens on now, for a server started next."""
    for _ in range(200):
        port = random.choice(_LISTEN_PORTS)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} in {_LISTEN_PORTS}")


class Service:
    """A server in its own session (so that it and its children stop
    together), its output in a log file."""

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], url: str, log_dir: Path
    ) -> None:
        self.name = name
        self.url = url
        self.log = log_dir / f"{name}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                list(argv), env=dict(env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, path: str, timeout: float) -> None:
        """Until ``path`` answers 200, for at most ``timeout`` seconds; a
        server that is not ready by then is stopped (its caller never got
        hold of a ready one to stop) and its log's tail raised."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as response:
                    if response.status == 200:
                        return
            except urllib.error.HTTPError as error:
                error.close()  # e.g. the frontend's 502 while vLLM starts; its socket must not leak
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {timeout:g} s:\n{self.tail()}")

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            return str(response.read().decode())

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after it.
    return text[text.rindex(")") + 2 :].split()


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


@dataclass(frozen=True)
class CpuReading:
    """The CPU time of a process (and of its live descendants) at one
    moment, two ways: user + system time from /proc/PID/stat, in clock
    ticks (10 ms: a turn of 3 requests is good to about 3 ms a request),
    and each live thread's nanoseconds on a CPU from
    /proc/PID/task/TID/schedstat. ``later - earlier`` is the seconds
    between two readings: from the threads' nanoseconds where every thread
    of the earlier one is still there, no counter gone back (a thread
    started in between counts whole), and the ticks grew by no more than
    that plus what truncating to ticks can lose (a tick per process per
    reading); else from the ticks (a thread that ended took its nanoseconds
    with it, and one that began and ended in between is in neither
    reading's threads: a video decoder's threads live within one request)."""

    seconds: float
    thread_ns: dict[int, int] = field(default_factory=dict)
    processes: int = 1

    def __sub__(self, earlier: CpuReading) -> float:
        later = self.thread_ns
        ticks = self.seconds - earlier.seconds
        kept = earlier.thread_ns and all(later.get(tid, -1) >= ns for tid, ns in earlier.thread_ns.items())
        if kept:
            threads = (sum(later.values()) - sum(earlier.thread_ns.values())) / 1e9
            slack = (self.processes + earlier.processes) / CLOCK_TICKS
            if ticks <= threads + slack:
                return threads
        return ticks


def cpu_seconds(pid: int, *, with_descendants: bool = False) -> CpuReading:
    """User + system CPU time of a process (and of its live descendants):
    see :class:`CpuReading`."""
    ticks = 0
    processes = 0
    threads: dict[int, int] = {}
    for one in [pid, *(descendants(pid) if with_descendants else [])]:
        fields = _stat_fields(one)
        if fields:
            # utime and stime: fields 14 and 15 of /proc/PID/stat.
            ticks += int(fields[11]) + int(fields[12])
            processes += 1
            threads.update(_thread_ns(one))
    return CpuReading(ticks / CLOCK_TICKS, threads, max(processes, 1))


def _thread_ns(pid: int) -> dict[int, int]:
    """Nanoseconds on a CPU of each live thread of ``pid`` (the first field
    of its schedstat); those that end while being read are left out."""
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                found[int(entry.name)] = int(Path(f"{entry.path}/schedstat").read_text().split()[0])
    return found


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` in Prometheus text whose labels
    include ``labels``; 0 when there are none."""
    total = 0.0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        metric_name, _, label_text = key.partition("{")
        if metric_name != name:
            continue
        found = dict(part.split("=", 1) for part in label_text.rstrip("}").split(",") if "=" in part)
        if all(found.get(k, "").strip('"') == v for k, v in labels.items()):
            total += float(value)
    return total


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def image_server(root: Path, host: str) -> Iterator[str]:
    """Serves ``root`` over HTTP on ``host``; yields its base URL."""

    class Handler(_QuietHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
