"""Network namespaces for the tests that need hosts: the one owner of the
plumbing (bounded commands, the skip reason, the clean-up of what a killed
run left behind) that the fault suite's veth pair (`tests/faults/faultnet.py`)
and the scale-out topology's bridge (:class:`Bridged`) share.

Every namespace name is ``<prefix>-<pid>-<suffix>``: a run that was killed
leaves names whose pid no longer exists, which the next run deletes.
Addresses exist only inside the namespaces; deleting a namespace deletes
its interfaces, qdiscs and nftables tables.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

# Every external command is bounded.
CMD_TIMEOUT = 20.0
# setns(2)'s flag for a network namespace.
_CLONE_NEWNET = 0x40000000

T = TypeVar("T")


class Unavailable(Exception):
    """The machine cannot give us what a test needs (a skip, not a failure)."""


def sh(*args: str, check: bool = True, timeout: float = CMD_TIMEOUT) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def why_namespaces_unavailable(*tools: str) -> str | None:
    """None when this process can create network namespaces (and finds
    ``tools`` besides iproute2's), else why not."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs .ci/run as root)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), *((t, t) for t in tools)):
        if shutil.which(tool) is None:
            return f"`{tool}` ({package}) is not installed"
    return None


def cleanup_stale(prefix: str) -> None:
    """Deletes the namespaces named ``<prefix>-<pid>-...`` whose pid no
    longer exists (left behind by a run that was killed)."""
    listed = sh("ip", "netns", "list", check=False).stdout.split("\n")
    for line in listed:
        name = line.split(" ")[0]
        parts = name.split("-")
        if len(parts) == 3 and parts[0] == prefix and parts[1].isdigit():
            if not os.path.exists(f"/proc/{parts[1]}"):
                sh("ip", "netns", "del", name, check=False)


def wait_carrier(ends: Sequence[tuple[str, str]], within: float = 20.0) -> None:
    """Waits (bounded) until every (namespace, device) reports its link up:
    the kernel's linkwatch sets the operstate up to a second late, and UCX
    ignores an interface that is not running."""
    deadline = time.monotonic() + within
    while True:
        states = [
            json.loads(sh("ip", "-n", ns, "-j", "link", "show", "dev", dev).stdout)[0].get("operstate")
            for ns, dev in ends
        ]
        if all(state == "UP" for state in states):
            return
        if time.monotonic() > deadline:
            found = list(zip(ends, states, strict=True))
            raise RuntimeError(f"links did not come up within {within:.0f} s: {found}")
        time.sleep(0.05)


def call_in(ns: str, work: Callable[..., T], *args: Any, timeout: float | None = None) -> T:
    """``work(*args)`` in a thread that joined network namespace ``ns``
    (setns(2) moves the calling thread only): its sockets, an asyncio loop's
    included, live there. Raises what ``work`` raised."""
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {ns} failed")
        finally:
            os.close(fd)
        try:
            result.append(work(*args))
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            failure.append(error)

    thread = threading.Thread(target=run, name=f"netns-{ns}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"work in {ns} did not end within {timeout} s")
    if failure:
        raise failure[0]
    return result[0]


class Bridged:
    """Hosts as namespaces on one bridge: a hub namespace holds the bridge,
    each host has ``eth0`` (a veth whose other end is a port of the bridge)
    with ``10.232.0.<n>/24``. :meth:`close` deletes every namespace."""

    SUBNET = "10.232.0"
    DEV = "eth0"

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.hub = self._name("hub")
        self.hosts: dict[str, str] = {}  # role -> address
        self._created: list[str] = []

    def _name(self, role: str) -> str:
        return f"{self.prefix}-{os.getpid()}-{role}"

    def ns(self, role: str) -> str:
        return self._name(role)

    def open(self, roles: Sequence[str]) -> Bridged:
        cleanup_stale(self.prefix)
        try:
            sh("ip", "netns", "add", self.hub)
            self._created.append(self.hub)
            sh("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", self.hub, "link", "set", "br0", "up")
            for index, role in enumerate(roles, start=1):
                ns = self._name(role)
                sh("ip", "netns", "add", ns)
                self._created.append(ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                port = f"p{index}"
                # Made inside the host's namespace: nothing touches the test's own.
                sh(
                    "ip", "-n", ns, "link", "add", self.DEV,
                    "type", "veth", "peer", "name", port, "netns", self.hub,
                )  # fmt: skip
                sh("ip", "-n", self.hub, "link", "set", port, "master", "br0", "up")
                address = f"{self.SUBNET}.{10 + index}"
                sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", self.DEV)
                sh("ip", "-n", ns, "link", "set", self.DEV, "up")
                self.hosts[role] = address
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            self.close()
            raise Unavailable(f"cannot create network namespaces on a bridge: {error}") from error
        wait_carrier([(self._name(role), self.DEV) for role in roles])
        return self

    def address(self, role: str) -> str:
        return self.hosts[role]

    def exec_prefix(self, role: str) -> list[str]:
        """The argv prefix that runs a command as host ``role``."""
        return ["ip", "netns", "exec", self._name(role)]

    def drop_between(self, role: str, peer: str) -> None:
        """nftables in ``role``'s namespace drops every packet to and from
        ``peer`` (a partition of that pair alone) until :meth:`heal`."""
        rules = (
            "table inet pwpartition {\n"
            "  chain in { type filter hook input priority 0; policy accept;\n"
            f"    ip saddr {self.address(peer)} counter drop\n"
            "  }\n"
            "  chain out { type filter hook output priority 0; policy accept;\n"
            f"    ip daddr {self.address(peer)} counter drop\n"
            "  }\n"
            "}\n"
        )
        done = subprocess.run(
            [*self.exec_prefix(role), "nft", "-f", "-"],
            input=rules, capture_output=True, text=True, timeout=CMD_TIMEOUT, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"nft failed in {role}: {done.stderr.strip()}")

    def heal(self, role: str) -> None:
        sh(*self.exec_prefix(role), "nft", "delete", "table", "inet", "pwpartition", check=False)

    def close(self) -> None:
        for ns in reversed(self._created):
            sh("ip", "netns", "del", ns, check=False)
        self._created.clear()


def bridged_hosts(prefix: str, names: list[str]) -> Iterator[Bridged]:
    """For a pytest fixture: hosts ``names`` on one bridge, closed after
    the tests; the tests skip, saying why, where namespaces cannot be made."""
    import pytest

    why = why_namespaces_unavailable()
    if why is not None:
        pytest.skip(why)
    try:
        bridged = Bridged(prefix).open(names)
    except Unavailable as error:
        pytest.skip(str(error))
    yield bridged
    bridged.close()


def ports_reached(hosts: Bridged, source: str, target: str, listeners: set[tuple[str, int]]) -> list[int]:
    """The ports of ``listeners`` (a process's on host ``target``) that host
    ``source`` connects to at ``target``'s address."""
    address = hosts.address(target)
    return [port for _, port in sorted(listeners) if call_in(hosts.ns(source), reachable, address, port)]


def listeners_of(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on (addresses as
    /proc/net/tcp writes them: ``0100007F`` is 127.0.0.1)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                address, port = fields[1].rsplit(":", 1)
                found.add((address, int(port, 16)))
    return found


def reachable(address: str, port: int) -> bool:
    """Whether a TCP connection to ``address``:``port`` opens (from the
    calling thread's namespace: :func:`call_in`)."""
    try:
        with socket.create_connection((address, port), timeout=2):
            return True
    except OSError:
        return False
