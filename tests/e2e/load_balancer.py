"""HAProxy (the Debian package) as the scale-out topology's load balancer:
the configuration it runs with (the one docs/deploy.md shows) and the
server states it reports on its stats socket."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from pixelwire.bench import services

PORT = 8000

# The whole HTTP answer HAProxy sends as it is when no server is up: OpenAI's
# error JSON, not HAProxy's HTML (docs/deploy.md's 503.json, byte for byte).
ERROR_503 = "\r\n".join(
    [
        "HTTP/1.0 503 Service Unavailable",
        "Content-Type: application/json",
        "Cache-Control: no-cache",
        "Connection: close",
        "",
        '{"error": {"message": "no pixelwire frontend is up: vLLM is down or still loading",'
        ' "type": "ServiceUnavailableError", "param": null, "code": 503}}',
        "",
    ]
)


def config(
    backend: str, bind: str, servers: Sequence[tuple[str, str]], stats_socket: Path, error_503: Path
) -> str:
    """A load balancer on ``bind``:8000 in front of ``servers`` ((name,
    address) pairs, each listening on 8000), health-checked on /health:
    a server whose /health is not 200 twice in a row is out, twice 200 and
    it is back in. A connection a server refuses (it died) is sent to
    another server (``retries`` with ``redispatch``); a request a server
    took is never sent again (a POST may have started work). With no
    server up it answers 503 with ``error_503`` (a file holding
    :data:`ERROR_503`)."""
    lines = [
        "global",
        "    maxconn 4096",
        f"    stats socket {stats_socket} mode 600 level admin",
        "defaults",
        "    mode http",
        "    timeout connect 2s",
        "    timeout client 10m",
        "    timeout server 10m",
        "    timeout http-request 30s",
        "    retries 2",
        "    option redispatch 1",
        f"    errorfile 503 {error_503}",
        "frontend api",
        f"    bind {bind}:{PORT}",
        f"    default_backend {backend}",
        f"backend {backend}",
        "    balance leastconn",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        "    default-server inter 1s fastinter 500ms downinter 1s fall 2 rise 2",
        *(f"    server {name} {address}:{PORT} check" for name, address in servers),
    ]
    return "\n".join(lines) + "\n"


class HAProxy(services.Service):
    """``haproxy -db`` (foreground) with :func:`config`, started through
    ``launcher`` (``ip netns exec NS``)."""

    def __init__(
        self,
        name: str,
        launcher: Sequence[str],
        bind: str,
        servers: Sequence[tuple[str, str]],
        log_dir: Path,
    ) -> None:
        self.stats_socket = log_dir / f"{name}.sock"
        self.config_path = log_dir / f"{name}.cfg"
        error_503 = log_dir / f"{name}-503.json"
        error_503.write_bytes(ERROR_503.encode())
        self.config_path.write_text(config(name, bind, servers, self.stats_socket, error_503))
        binary = shutil.which("haproxy")
        if binary is None:
            raise RuntimeError("haproxy is not installed")
        checked = subprocess.run(
            [binary, "-c", "-q", "-f", str(self.config_path)], capture_output=True, text=True, timeout=20
        )
        if checked.returncode != 0:
            raise RuntimeError(f"haproxy refused its configuration: {checked.stderr}")
        argv = [*launcher, binary, "-db", "-f", str(self.config_path)]
        super().__init__(name, argv, dict(os.environ), f"http://{bind}:{PORT}", log_dir)
        self.backend = name

    def _ask(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(10)
            sock.connect(str(self.stats_socket))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def server_states(self) -> dict[str, str]:
        """Each server's status as HAProxy's health checks see it (UP, DOWN,
        ...), from ``show stat``."""
        lines = self._ask("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        states: dict[str, str] = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(","), strict=False))
            if row.get("pxname") == self.backend and row.get("svname") not in ("BACKEND", "FRONTEND", None):
                states[row["svname"]] = row.get("status", "")
        return states
