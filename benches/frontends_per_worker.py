"""What one worker holds per frontend it READs from: N publisher processes
(``pixelwire.publisher_process``, each its own NIXL agent), each in a
network namespace of its own on one bridge, and one worker (a Reader in a
process of its own, as in the fault suite) in another, all on UCX over TCP.
The worker READs one image from each of the first 1, 2, 8, 32 frontends
(cumulatively), then READs from all of them once more; after each step:
the frontends whose metadata it holds, its established TCP connections, its
threads and its resident memory, and what each frontend past the first
added to the last two.

Needs root (namespaces) and the NIXL runtime. Usage (from the repository):

    sudo .venv/bin/python benches/frontends_per_worker.py [--steps 1,2,8,32] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "tests"), str(HERE.parent / "tests" / "faults")]

from faultnet import WORKER_SCRIPT, Child, make_image, publisher_argv  # noqa: E402
from netns import Bridged, sh, why_namespaces_unavailable  # noqa: E402

POOL_BYTES = 16 << 20
READ_TIMEOUT = 30.0


def _proc_status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    return out


def _connections(net: Bridged, role: str) -> int:
    """Established TCP connections in ``role``'s namespace (the worker's
    process is the only one there)."""
    out = sh(*net.exec_prefix(role), "ss", "-Htn", "state", "established").stdout
    return sum(1 for line in out.splitlines() if line.strip())


def measure(steps: list[int]) -> list[dict[str, Any]]:
    reason = why_namespaces_unavailable()
    if reason is not None:
        raise SystemExit(f"frontends_per_worker: {reason}")
    most = max(steps)
    roles = ["worker", *(f"f{i}" for i in range(most))]
    net = Bridged("pwn").open(roles)
    logs = Path(tempfile.mkdtemp(prefix="frontends-per-worker-"))
    children: list[Child] = []
    rows: list[dict[str, Any]] = []
    try:
        image = make_image(logs, "image.png", 640, 480, seed=7)
        worker_argv = [str(WORKER_SCRIPT), str(READ_TIMEOUT)]
        worker = Child(net.ns("worker"), Bridged.DEV, worker_argv, logs / "worker.log")
        children.append(worker)
        worker.first()
        frontends: list[Child] = []
        for i in range(most):
            argv = publisher_argv(POOL_BYTES, 60.0, 10.0, POOL_BYTES)
            front = Child(net.ns(f"f{i}"), Bridged.DEV, argv, logs / f"f{i}.log")
            children.append(front)
            frontends.append(front)
        for front in frontends:
            front.first()

        def read_from(front: Child) -> None:
            answer = front.ask(cmd="publish", path=str(image.path), count=1)
            worker.send(cmd="read", desc=answer["descs"][0])
            assert worker.lines.get(60) == {"event": "started"}
            result = worker.lines.get(READ_TIMEOUT + 30)
            assert result is not None and result.get("ok") and result["sha256"] == image.sha256, result

        base = _proc_status(worker.proc.pid)
        rows.append({"frontends": 0, "rss_mib": base["VmRSS"] / 1024, "threads": base["Threads"]})
        first, first_tcp = base, 0
        done = 0
        for n in steps:
            started = time.monotonic()
            for front in frontends[done:n]:
                read_from(front)
            first_reads = time.monotonic() - started
            done = n
            started = time.monotonic()
            for front in frontends[:n]:
                read_from(front)
            again = time.monotonic() - started
            stats = worker.ask(cmd="stats")["stats"]
            status = _proc_status(worker.proc.pid)
            tcp = _connections(net, "worker")
            if n == steps[0]:
                first, first_tcp = status, tcp
            rows.append(
                {
                    "frontends": n,
                    "remotes": stats["remotes"],
                    "connects": stats["remote_connects"],
                    "tcp_established": tcp,
                    "threads": status["Threads"],
                    "rss_mib": round(status["VmRSS"] / 1024, 1),
                    # Past the first frontend (whose READ also made the receive pool).
                    "rss_kib_per_added_frontend": round((status["VmRSS"] - first["VmRSS"]) / max(1, n - 1)),
                    "tcp_per_added_frontend": round((tcp - first_tcp) / max(1, n - 1), 1),
                    "first_reads_s": round(first_reads, 2),
                    "reads_again_s": round(again, 2),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    finally:
        for child in reversed(children):
            child.close()
        net.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", default="1,2,8,32", help="frontend counts, ascending (default 1,2,8,32)")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args()
    rows = measure(sorted(int(n) for n in args.steps.split(",")))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
