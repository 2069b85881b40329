"""The network interfaces the frontend's NIXL agent listens on.

UCX opens a listener on every network device it is allowed (each
interface's address, TCP), and the frontend's registered pool is read
through them: left to itself, a frontend told ``--host 127.0.0.1`` would
still offer its pixels on every interface of the host. The agent needs to
be reachable by the workers only, and they sit where the upstream is. So,
unless the operator names the devices (``--nixl-interface``, or UCX's own
``UCX_NET_DEVICES``, which wins), the frontend allows UCX:

- ``lo`` alone when the upstream is on this host (a loopback address);
- otherwise the interface this host reaches the upstream through, plus
  every RDMA port (``mlx5_0:1``: not IP listeners, and what the workers'
  READs use where there is one).

Workers elsewhere than the upstream's side (a router in front of remote
vLLMs, say) need ``--nixl-interface`` naming their side.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from pathlib import Path
from urllib.parse import urlsplit

ALL = "all"
_SIOCGIFADDR = 0x8915


class InterfaceNotFound(ValueError):
    """The interface toward the upstream could not be told (the message says how to name it)."""


def listen_devices(setting: str | None, upstream: str) -> str | None:
    """``UCX_NET_DEVICES`` for the frontend's NIXL agent: ``setting`` as
    given (``all``: None, no restriction), else the default above."""
    if setting:
        return None if setting == ALL else setting
    host = urlsplit(upstream).hostname
    if host is None:
        raise InterfaceNotFound(f"--upstream {upstream!r} names no host: give --nixl-interface")
    try:
        info = socket.getaddrinfo(host, 80, proto=socket.IPPROTO_TCP)
    except OSError as error:
        raise InterfaceNotFound(
            f"cannot resolve the upstream's host {host!r} ({error}) to choose the interface NIXL listens "
            f"on: give --nixl-interface (an interface name, or {ALL!r})"
        ) from None
    family, _, _, _, address = info[0]
    if ipaddress.ip_address(address[0]).is_loopback:
        return "lo"
    local = _source_address(family, address)
    name = _interface_of(local)
    if name is None:
        raise InterfaceNotFound(
            f"no interface holds {local}, the address this host reaches the upstream from: give "
            f"--nixl-interface (an interface name, or {ALL!r})"
        )
    return ",".join([name, *rdma_ports()])


def apply(devices: str | None) -> str | None:
    """Puts ``devices`` in ``UCX_NET_DEVICES`` for the agent this process
    is about to make, unless the operator set that variable; returns what
    is in force (None: every device)."""
    if "UCX_NET_DEVICES" in os.environ:
        return os.environ["UCX_NET_DEVICES"]
    if devices is not None:
        os.environ["UCX_NET_DEVICES"] = devices
    return devices


def _source_address(family: int, address: tuple[object, ...]) -> str:
    """The local address the kernel routes to ``address`` from (a UDP
    connect sends nothing)."""
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(address)
        return str(probe.getsockname()[0])


def _interface_of(local: str) -> str | None:
    """The interface that holds the address ``local``."""
    wanted = ipaddress.ip_address(local)
    if wanted.version == 6:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            fields = line.split()
            if ipaddress.IPv6Address(bytes.fromhex(fields[0])) == wanted:
                return fields[5]
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(answer[20:24]) == local:
                return name
    return None


def rdma_ports() -> list[str]:
    """Every RDMA device port on this host, as UCX names them (``mlx5_0:1``)."""
    root = Path("/sys/class/infiniband")
    if not root.is_dir():
        return []
    return sorted(
        f"{device.name}:{port.name}"
        for device in root.iterdir()
        for port in (device / "ports").iterdir()
        if (device / "ports").is_dir()
    )
