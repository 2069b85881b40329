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

import ipaddress
import socket
from urllib.parse import urlsplit

from pixelwire.nixl_interfaces import ALL, InterfaceNotFound, apply, interface_of, rdma_ports

__all__ = ["ALL", "InterfaceNotFound", "apply", "listen_devices", "rdma_ports"]


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
    name = interface_of(local)
    if name is None:
        raise InterfaceNotFound(
            f"no interface holds {local}, the address this host reaches the upstream from: give "
            f"--nixl-interface (an interface name, or {ALL!r})"
        )
    return ",".join([name, *rdma_ports()])


def _source_address(family: int, address: tuple[object, ...]) -> str:
    """The local address the kernel routes to ``address`` from (a UDP
    connect sends nothing)."""
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect(address)
        return str(probe.getsockname()[0])
