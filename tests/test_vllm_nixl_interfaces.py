"""Where the plug-in's NIXL reader agent listens
(``pixelwire.vllm.nixl_interfaces``): with vLLM's ``--host 127.0.0.1``, the
reader agent made in vLLM's process is reachable from no other interface.
Seen on a host of its own (a network namespace with an ``eth0`` on a
bridge and a second host beside it), with the control
(``PIXELWIRE_NIXL_INTERFACE=all``) showing the test would see a listener
that leaked."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns import Bridged, bridged_hosts, listeners_of, ports_reached

from pixelwire.vllm.nixl_interfaces import listen_devices, vllm_host


def test_vllm_host_is_read_as_vllm_parses_it() -> None:
    assert vllm_host(["vllm", "serve", "m", "--host", "127.0.0.1"]) == "127.0.0.1"
    assert vllm_host(["api_server", "--host=10.0.0.1", "--port", "8000"]) == "10.0.0.1"
    assert vllm_host(["api_server", "--host", "a", "--host", "b"]) == "b"
    assert vllm_host(["api_server", "--port", "8000"]) is None


def test_the_default_follows_vllms_host_and_a_setting_wins() -> None:
    assert listen_devices(None, ["vllm", "--host", "127.0.0.1"]) == "lo"
    assert listen_devices(None, ["vllm", "--host", "localhost"]) == "lo"
    assert listen_devices(None, ["vllm", "--host", "::1"]) == "lo"
    # vLLM on every interface: its HTTP server is reachable there, and so must the reader be.
    assert listen_devices(None, ["vllm"]) is None
    assert listen_devices(None, ["vllm", "--host", "0.0.0.0"]) is None
    assert listen_devices("eth1,mlx5_0:1", ["vllm", "--host", "127.0.0.1"]) == "eth1,mlx5_0:1"
    assert listen_devices("all", ["vllm", "--host", "127.0.0.1"]) is None


@pytest.fixture(scope="module")
def hosts() -> Iterator[Bridged]:
    yield from bridged_hosts("pwr", ["worker", "outsider"])


# What vLLM's process does with the plug-in: the interfaces set from its
# command line at registration, then the reader agent made.
_READER = textwrap.dedent(
    """
    import sys, time
    from pixelwire.vllm.nixl_interfaces import apply_reader_interfaces
    from pixelwire.transfer import default_reader
    apply_reader_interfaces(["vllm", "--host", "127.0.0.1", "--port", "8000"])
    reader = default_reader().open()
    print("ready", flush=True)
    time.sleep(120)
    """
)


def _reader_listeners(hosts: Bridged, tmp_path: Path, setting: str) -> tuple[set[tuple[str, int]], list[int]]:
    """Makes the plug-in's reader on host "worker" as under vLLM's
    ``--host 127.0.0.1``; returns its listeners and the ports the host
    "outsider" could connect to at the worker's address."""
    argv = [*hosts.exec_prefix("worker"), sys.executable, "-c", _READER]
    env = {k: v for k, v in os.environ.items() if k not in ("UCX_NET_DEVICES", "PIXELWIRE_NIXL_INTERFACE")}
    env |= {"NIXL_LOG_LEVEL": "WARN", "PIXELWIRE_NIXL_INTERFACE": setting}
    log = (tmp_path / "reader.log").open("w")
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "ready" not in (tmp_path / "reader.log").read_text():
            assert process.poll() is None, (tmp_path / "reader.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "reader.log").read_text()
            time.sleep(0.1)
        listeners = listeners_of(process.pid)
        return listeners, ports_reached(hosts, "outsider", "worker", listeners)
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def test_the_reader_is_reachable_from_no_other_interface(hosts: Bridged, tmp_path: Path) -> None:
    """Every listener of the reader agent is on the loopback, and the host
    beside it connects to none of them."""
    listeners, reached = _reader_listeners(hosts, tmp_path, "")
    assert listeners, "the reader agent opened no listener: the control below would not see one either"
    assert all(address in ("0100007F", "00000000000000000000000001000000") for address, _ in listeners), (
        listeners
    )
    assert reached == []


def test_the_control_sees_the_reader_listening_everywhere(hosts: Bridged, tmp_path: Path) -> None:
    """With ``PIXELWIRE_NIXL_INTERFACE=all`` (UCX's default), the reader
    listens on the host's eth0 too, and the host beside it connects: what
    the test above would see if the default leaked."""
    _, reached = _reader_listeners(hosts, tmp_path, "all")
    assert reached
