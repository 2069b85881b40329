"""The network interfaces the plug-in's NIXL reader agent listens on.

UCX opens a listener on every network device it is allowed, the reader's
as the frontend's (:mod:`pixelwire.frontend.nixl_interfaces`): left to
itself, a vLLM told ``--host 127.0.0.1`` would still offer its reader's
registered memory on every interface. The frontends that reach this
vLLM's reader are the ones that reach its HTTP server, so, unless the
operator names the devices (``PIXELWIRE_NIXL_INTERFACE``, or UCX's own
``UCX_NET_DEVICES``, which wins), the reader listens where vLLM's
``--host`` does:

- ``lo`` alone for a loopback address;
- the interface that holds the address, plus every RDMA port, for any
  other one address (or host name);
- every device when vLLM listens on every interface (no ``--host``,
  ``0.0.0.0``, ``::``): the HTTP server is reachable there too, and a
  frontend elsewhere must be able to reach the reader.

Imports nothing of vLLM, so it is tested without it.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from collections.abc import Sequence

from pixelwire.config import worker_nixl_interface_from_env
from pixelwire.nixl_interfaces import ALL, InterfaceNotFound, apply, interface_of, rdma_ports

__all__ = ["InterfaceNotFound", "apply_reader_interfaces", "listen_devices", "vllm_host"]

log = logging.getLogger("pixelwire.vllm")

# vLLM's parser reads underscores in option names as dashes.
_HOST = re.compile(r"^--host(=|$)")
_EVERY_INTERFACE = {"", "0.0.0.0", "::"}


def vllm_host(argv: Sequence[str]) -> str | None:
    """vLLM's ``--host`` as its parser reads ``argv`` (the last one wins);
    None when absent."""
    host: str | None = None
    args = list(argv)
    for i, arg in enumerate(args):
        if match := _HOST.match(arg):
            if match.group(1) == "=":
                host = arg.split("=", 1)[1]
            elif i + 1 < len(args):
                host = args[i + 1]
    return host


def listen_devices(setting: str | None, argv: Sequence[str]) -> str | None:
    """``UCX_NET_DEVICES`` for the reader agent: ``setting`` as given
    (``all``: None, no restriction), else the default above from vLLM's
    command line ``argv``."""
    if setting:
        return None if setting == ALL else setting
    host = vllm_host(argv)
    if host is None or host in _EVERY_INTERFACE:
        return None
    try:
        address = socket.getaddrinfo(host, 80, proto=socket.IPPROTO_TCP)[0][4][0]
    except OSError as error:
        raise InterfaceNotFound(
            f"cannot resolve vLLM's --host {host!r} ({error}) to choose the interface the plug-in's NIXL "
            f"reader listens on: set PIXELWIRE_NIXL_INTERFACE (an interface name, or {ALL!r})"
        ) from None
    if ipaddress.ip_address(address).is_loopback:
        return "lo"
    name = interface_of(str(address))
    if name is None:
        raise InterfaceNotFound(
            f"no interface holds {address}, vLLM's --host: set PIXELWIRE_NIXL_INTERFACE (an interface "
            f"name, or {ALL!r})"
        )
    return ",".join([name, *rdma_ports()])


def apply_reader_interfaces(argv: Sequence[str]) -> str | None:
    """Puts the reader's devices (``PIXELWIRE_NIXL_INTERFACE``, else the
    default from ``argv``) in ``UCX_NET_DEVICES`` before this process makes
    its NIXL agent, unless the operator set that variable; logs and
    returns what is in force (None: every device)."""
    devices = apply(listen_devices(worker_nixl_interface_from_env(), argv))
    log.info("the plug-in's NIXL reader listens on %s (UCX_NET_DEVICES)", devices or "every network device")
    return devices
