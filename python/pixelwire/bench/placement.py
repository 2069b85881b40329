"""Where the benchmark's processes run.

The network: the frontend in its own network namespace, joined to this one
by a veth pair, with UCX over TCP on it, as a frontend on a second host
would be; on the loopback (UCX picks shared memory) where this process may
not create namespaces. The CPUs: the load generator, the frontend and vLLM
each on their own set where the machine has enough cores, else unpinned.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

NAMESPACE_PREFIX = "pwbench"
# Below this many usable cores, disjoint sets would starve vLLM: no pinning.
MIN_CORES_TO_PIN = 6
COMMAND_TIMEOUT = 20.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def why_no_namespace() -> str | None:
    """None when this process can put the frontend in a namespace, else why not."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    return None


@dataclass
class Network:
    """Addresses and settings for one run: vLLM, the image server and the
    load generator in this namespace; the frontend in ``namespace`` (None:
    all on the loopback)."""

    description: str
    host_address: str
    frontend_address: str
    namespace: str | None = None
    host_device: str | None = None
    frontend_device: str | None = None
    _created: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return "netns" if self.namespace else "loopback"

    def frontend_prefix(self) -> list[str]:
        """The argv prefix that runs a command in the frontend's namespace
        (`ip netns exec` execs it, so the process id is the command's)."""
        return ["ip", "netns", "exec", self.namespace] if self.namespace else []

    def vllm_env(self) -> dict[str, str]:
        return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": self.host_device} if self.host_device else {}

    def frontend_env(self) -> dict[str, str]:
        return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": self.frontend_device} if self.frontend_device else {}

    def close(self) -> None:
        # Deleting the namespace deletes the veth end in it, which deletes the pair.
        for namespace in reversed(self._created):
            _ip("netns", "del", namespace, check=False)
        self._created.clear()


def _delete_stale_namespaces() -> None:
    """Namespaces left by a run that was killed (their names carry the pid
    of a process that no longer exists)."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split(" ")[0]
        prefix, _, pid = name.partition("-")
        if prefix == NAMESPACE_PREFIX and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _ip("netns", "del", name, check=False)


def _wait_link_up(network: Network, within: float = 20.0) -> None:
    """The kernel reports a new veth up a moment late, and UCX ignores an
    interface that is not running."""
    assert network.namespace and network.host_device and network.frontend_device
    deadline = time.monotonic() + within
    while True:
        host = Path(f"/sys/class/net/{network.host_device}/operstate").read_text().strip()
        inside = _ip("-n", network.namespace, "link", "show", "dev", network.frontend_device).stdout
        if host == "up" and "state UP" in inside:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the veth pair did not come up within {within:.0f} s")
        time.sleep(0.05)


def open_network(choice: str) -> Network:
    """``choice``: "auto" (a namespace when possible), "netns" or "loopback"."""
    loopback = Network(
        description="loopback: frontend, vLLM and the load generator share one network stack "
        "(UCX picks shared memory)",
        host_address="127.0.0.1",
        frontend_address="127.0.0.1",
    )
    if choice == "loopback":
        return loopback
    why_not = why_no_namespace()
    if why_not:
        if choice == "netns":
            raise RuntimeError(f"--network netns: {why_not}")
        loopback.description += f" ({why_not})"
        return loopback
    _delete_stale_namespaces()
    pid = os.getpid()
    # Interface names are at most 15 characters; the /30 is picked by pid so
    # that two runs at once do not collide.
    short = pid % 10_000_000
    subnet = f"10.234.{pid % 256}"
    network = Network(
        description="",
        host_address=f"{subnet}.1",
        frontend_address=f"{subnet}.2",
        namespace=f"{NAMESPACE_PREFIX}-{pid}",
        host_device=f"pwbh{short}",
        frontend_device=f"pwbf{short}",
    )
    assert network.namespace and network.host_device and network.frontend_device
    try:
        _ip("netns", "add", network.namespace)
        network._created.append(network.namespace)
        _ip("-n", network.namespace, "link", "set", "lo", "up")
        _ip(
            "link", "add", network.host_device, "type", "veth",
            "peer", "name", network.frontend_device, "netns", network.namespace,
        )  # fmt: skip
        _ip("addr", "add", f"{network.host_address}/30", "dev", network.host_device)
        _ip("link", "set", network.host_device, "up")
        _ip("-n", network.namespace, "addr", "add", f"{network.frontend_address}/30", "dev",
            network.frontend_device)  # fmt: skip
        _ip("-n", network.namespace, "link", "set", network.frontend_device, "up")
        _wait_link_up(network)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        network.close()
        if choice == "netns":
            raise
        loopback.description += f" (no namespace: {error})"
        return loopback
    network.description = (
        f"netns: the frontend in network namespace {network.namespace}, joined by a veth pair "
        f"({network.frontend_address} <-> {network.host_address}); vLLM's plug-in reads its pixels "
        f"with UCX over TCP (UCX_TLS=tcp, UCX_NET_DEVICES=the veth ends), as from a second host"
    )
    return network


@contextlib.contextmanager
def network_for_run(choice: str) -> Iterator[Network]:
    network = open_network(choice)
    try:
        yield network
    finally:
        network.close()


@dataclass(frozen=True)
class Placement:
    """CPU sets per role ("client", "frontend", "vllm"); empty: not pinned."""

    description: str
    cpus: dict[str, list[int]]

    def prefix(self, role: str) -> list[str]:
        """The argv prefix that pins a command to its role's CPUs."""
        cpus = self.cpus.get(role)
        return ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []

    def pin_this_process(self) -> None:
        """The load generator and the image server run in this process."""
        if self.cpus.get("client"):
            os.sched_setaffinity(0, self.cpus["client"])


def plan_placement(pin: bool) -> Placement:
    usable = sorted(os.sched_getaffinity(0))
    if not pin:
        return Placement(f"not pinned: --no-pin ({len(usable)} cores)", {})
    if len(usable) < MIN_CORES_TO_PIN:
        return Placement(f"not pinned: {len(usable)} cores", {})
    if shutil.which("taskset") is None:
        return Placement(f"not pinned: `taskset` (util-linux) is not installed ({len(usable)} cores)", {})
    # vLLM (API server and engine core) gets half; the frontend and the load
    # generator a quarter each.
    quarter = len(usable) // 4
    cpus = {
        "client": usable[:quarter],
        "frontend": usable[quarter : 2 * quarter],
        "vllm": usable[2 * quarter :],
    }
    described = ", ".join(f"{role} on CPUs {_ranges(ids)}" for role, ids in cpus.items())
    return Placement(f"pinned: {described}", cpus)


def _ranges(ids: list[int]) -> str:
    return (
        f"{ids[0]}-{ids[-1]}"
        if len(ids) > 1 and ids[-1] - ids[0] == len(ids) - 1
        else ",".join(map(str, ids))
    )
