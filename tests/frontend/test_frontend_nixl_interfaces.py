"""Where the frontend's NIXL agent listens
(``pixelwire.frontend.nixl_interfaces``): with ``--host 127.0.0.1`` and an
upstream on the same host, nothing pixelwire opens is reachable from
another interface. Seen on a host of its own (a network namespace with an
``eth0`` on a bridge and a second host beside it), and with the control
(``--nixl-interface all``) showing the test would see a listener that
leaked."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import Bridged, bridged_hosts, listeners_of, ports_reached

from pixelwire.frontend.nixl_interfaces import listen_devices


def test_the_default_is_lo_for_an_upstream_on_this_host_and_a_setting_wins() -> None:
    assert listen_devices(None, "http://127.0.0.1:8000") == "lo"
    assert listen_devices(None, "http://localhost:8000") == "lo"
    assert listen_devices("eth1,mlx5_0:1", "http://127.0.0.1:8000") == "eth1,mlx5_0:1"
    assert listen_devices("all", "http://127.0.0.1:8000") is None


@pytest.fixture(scope="module")
def hosts() -> Iterator[Bridged]:
    yield from bridged_hosts("pwl", ["frontend", "outsider"])


def _frontend_listeners(hosts: Bridged, tmp_path: Path, *args: str) -> tuple[set[tuple[str, int]], list[int]]:
    """Starts a frontend with ``--host 127.0.0.1`` on host "frontend", its
    upstream on that host's loopback; returns its listeners and the ports
    the host "outsider" could connect to at the frontend's address."""
    argv = [
        *hosts.exec_prefix("frontend"), sys.executable, "-m", "pixelwire.cli", "frontend",
        "--host", "127.0.0.1", "--port", "8080", "--upstream", "http://127.0.0.1:9",
        "--no-check-upstream", *args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "UCX_NET_DEVICES"} | {"NIXL_LOG_LEVEL": "WARN"}
    log = (tmp_path / "frontend.log").open("w")
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        listeners: set[tuple[str, int]] = set()
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "frontend.log").read_text()
            listeners = listeners_of(process.pid)
            if any(port == 8080 for _, port in listeners) and len(listeners) > 1:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"no NIXL listener: {listeners} {(tmp_path / 'frontend.log').read_text()}")
        return listeners, ports_reached(hosts, "outsider", "frontend", listeners)
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def test_nothing_the_frontend_opens_is_reachable_from_another_interface(
    hosts: Bridged, tmp_path: Path
) -> None:
    """Every listener of the frontend (HTTP and NIXL's) is on the loopback,
    and the host beside it connects to none of them."""
    listeners, reached = _frontend_listeners(hosts, tmp_path)
    assert all(address in ("0100007F", "00000000000000000000000001000000") for address, _ in listeners), (
        listeners
    )
    assert reached == []


def test_the_control_sees_nixl_listening_everywhere(hosts: Bridged, tmp_path: Path) -> None:
    """With ``--nixl-interface all`` (UCX's default), NIXL listens on the
    host's eth0 too, and the host beside it connects: what the test above
    would see if the default leaked."""
    _, reached = _frontend_listeners(hosts, tmp_path, "--nixl-interface", "all")
    assert reached and 8080 not in reached
