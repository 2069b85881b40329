"""What UCX may listen on: the ``UCX_NET_DEVICES`` a NIXL agent is made
with (each side's default: :mod:`pixelwire.frontend.nixl_interfaces`,
:mod:`pixelwire.vllm.nixl_interfaces`), and the host's interfaces it is
told from."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from pathlib import Path

ALL = "all"
_SIOCGIFADDR = 0x8915


class InterfaceNotFound(ValueError):
    """The interface to listen on could not be told (the message says how to name it)."""


def apply(devices: str | None) -> str | None:
    """Puts ``devices`` in ``UCX_NET_DEVICES`` for the agent this process
    is about to make, unless the operator set that variable; returns what
    is in force (None: every device)."""
    if "UCX_NET_DEVICES" in os.environ:
        return os.environ["UCX_NET_DEVICES"]
    if devices is not None:
        os.environ["UCX_NET_DEVICES"] = devices
    return devices


def interface_of(local: str) -> str | None:
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
