"""Scale-out: many frontends, many vLLM replicas, real load balancers, one
host each (network namespaces on a bridge, NIXL on UCX over TCP between
them), under load and under faults.

    client -> lb1 (HAProxy) -> fe1, fe2 (pixelwire frontend)
                                  -> lb2 (HAProxy) -> vllm1, vllm2 (the plug-in)

A reference vLLM with vLLM's own loader (on the test's loopback) answers
each image once; every answer through the topology must carry its tokens.
One topology for the module: the load phases and the faults run one after
another on it, each for a bounded time. Nothing asserts on timings; the
fault table's latencies are printed.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from load_balancer import HAProxy
from netns import Bridged, Unavailable, call_in, why_namespaces_unavailable

from pixelwire.bench import services

import stack

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]

ROLES = ("client", "lb1", "fe1", "fe2", "lb2", "vllm1", "vllm2")
FRONTENDS = ("fe1", "fe2")
REPLICAS = ("vllm1", "vllm2")
CLIENTS = 16
LOAD_SECONDS = 12.0
MIN_REQUESTS = 64
MAX_TOKENS = 4
# Lossless images of several sizes (vLLM's loader and pixelwire's decoder
# give the same pixels, so the same tokens).
IMAGES = ("hopper.png", "flower_thumbnail.png", "tiff_adobe_deflate.png", "exif.png")
PROMPT = "Describe the image."
# A reference token whose runner-up is closer than this (in logprob) may
# flip under another batch's float rounding: tokens are compared up to it.
TIE_MARGIN = 1e-3
STARTUP_SECONDS = 900.0


def _ucx_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        "UCX_TLS": "tcp",
        "UCX_NET_DEVICES": Bridged.DEV,
        "PIXELWIRE_SECRET": stack.SECRET,
        **(extra or {}),
    }


@dataclass
class Topology:
    net: Bridged
    logs: Path
    lb1: HAProxy
    lb2: HAProxy
    frontends: dict[str, stack.Service]
    replicas: dict[str, stack.Service]
    reference: dict[str, list[str]]  # image -> the reference's tokens, up to the first near-tie
    started: list[Any] = field(default_factory=list)

    def get(self, service: Any, path: str) -> str:
        """``service``'s ``path``, fetched from the client's host."""
        text: str = call_in(self.net.ns("client"), service.get, path, timeout=30)
        return text

    def wait_ready(self, service: Any) -> None:
        call_in(self.net.ns("client"), service.wait_ready, "/health", STARTUP_SECONDS)

    def start_frontend(self, role: str) -> stack.Service:
        service = stack.start_frontend(
            role,
            self.logs,
            self.lb2.url,
            env=_ucx_env(),
            host=self.net.address(role),
            launcher=tuple(self.net.exec_prefix(role)),
        )
        self.frontends[role] = service
        self.started.append(service)
        return service

    def start_replica(self, role: str) -> stack.Service:
        service = stack.start_vllm(
            role,
            self.logs,
            connector="pixelwire",
            extra_env=_ucx_env(
                {
                    "PIXELWIRE_READ_TIMEOUT": str(READ_TIMEOUT),
                    "PIXELWIRE_READER_FRONTEND_IDLE": str(FRONTEND_IDLE),
                }
            ),
            host=self.net.address(role),
            launcher=tuple(self.net.exec_prefix(role)),
        )
        self.replicas[role] = service
        self.started.append(service)
        return service

    def wait_out_of_service(self, lb: HAProxy, server: str, within: float = 120.0) -> None:
        deadline = time.monotonic() + within
        while not lb.server_states().get(server, "").startswith("DOWN"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{lb.name}: {server} still in service after {within:g} s")
            time.sleep(0.25)

    def wait_in_service(self, lb: HAProxy, servers: tuple[str, ...], within: float = 120.0) -> None:
        deadline = time.monotonic() + within
        while True:
            states = lb.server_states()
            if all(states.get(name, "").startswith("UP") for name in servers):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{lb.name}: servers not UP after {within:g} s: {states}")
            time.sleep(0.25)


def _data_url(name: str) -> str:
    return f"data:image/png;base64,{base64.b64encode((stack.CORPUS / name).read_bytes()).decode()}"


def _messages(image: str) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": _data_url(image)}},
                {"type": "text", "text": PROMPT},
            ],
        }
    ]


def _reference_tokens(url: str) -> dict[str, list[str]]:
    """Each image's greedy tokens from vLLM's own loader, cut before the
    first position whose top two are within TIE_MARGIN."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    tokens: dict[str, list[str]] = {}
    for image in IMAGES:
        answer = client.chat.completions.create(
            model="tiny",
            messages=_messages(image),  # type: ignore[arg-type]
            temperature=0,
            max_tokens=MAX_TOKENS,
            logprobs=True,
            top_logprobs=2,
        )
        kept: list[str] = []
        assert answer.choices[0].logprobs is not None and answer.choices[0].logprobs.content
        for position in answer.choices[0].logprobs.content:
            top = sorted((t.logprob for t in position.top_logprobs), reverse=True)
            if len(top) > 1 and top[0] - top[1] < TIE_MARGIN:
                break
            kept.append(position.token)
        tokens[image] = kept
    client.close()
    return tokens


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    reason = why_namespaces_unavailable("nft")
    if reason is None and shutil.which("haproxy") is None:
        reason = "`haproxy` is not installed (make setup installs it)"
    if reason is not None:
        pytest.skip(f"scale-out topology: {reason}")
    try:
        import pixelwire.transfer

        pixelwire.transfer.nixl_library_path()
    except pixelwire.TransferError as missing:
        pytest.skip(f"NIXL runtime not installed: {missing}")
    logs = tmp_path_factory.mktemp("scaleout-logs")
    stack.model_dir()
    net = Bridged("pws")
    try:
        net.open(ROLES)
    except Unavailable as error:
        pytest.skip(f"scale-out topology: {error}")
    started: list[Any] = []
    try:
        reference = stack.start_vllm("vllm-reference", logs, connector="http")
        started.append(reference)
        addresses = {role: net.address(role) for role in ROLES}
        lb2 = HAProxy(
            "lb2", net.exec_prefix("lb2"), addresses["lb2"], [(r, addresses[r]) for r in REPLICAS], logs
        )
        started.append(lb2)
        lb1 = HAProxy(
            "lb1", net.exec_prefix("lb1"), addresses["lb1"], [(f, addresses[f]) for f in FRONTENDS], logs
        )
        started.append(lb1)
        top = Topology(net, logs, lb1, lb2, {}, {}, {}, started)
        for role in REPLICAS:
            top.start_replica(role)
        for role in FRONTENDS:
            top.start_frontend(role)
        for service in [*top.replicas.values(), *top.frontends.values()]:
            top.wait_ready(service)
        reference.wait_ready("/health", STARTUP_SECONDS)
        top.wait_in_service(lb2, REPLICAS)
        top.wait_in_service(lb1, FRONTENDS)
        top.reference = _reference_tokens(reference.url)
        for role, replica in top.replicas.items():
            # Warms each replica for the images' shapes; through the
            # plug-in's own URL path, the same tokens too.
            warm = call_in(net.ns("client"), _reference_tokens, replica.url, timeout=STARTUP_SECONDS)
            for image, tokens in warm.items():
                same = min(len(tokens), len(top.reference[image]))
                assert tokens[:same] == top.reference[image][:same], f"{role} decodes {image} otherwise"
        yield top
    finally:
        for service in reversed(started):
            try:
                service.stop()
            except Exception as error:  # noqa: BLE001 - teardown must reach the namespaces
                print(f"stopping {service.name}: {error!r}")
        net.close()


# -- load ---------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    image: str
    started: float  # monotonic
    seconds: float
    kind: str  # "ok" or what failed
    tokens: tuple[str, ...]
    message: str = ""


async def _one(client: Any, image: str) -> Outcome:
    import openai

    started = time.monotonic()
    try:
        answer = await client.chat.completions.create(
            model="tiny", messages=_messages(image), temperature=0, max_tokens=MAX_TOKENS, logprobs=True
        )
    except openai.APIStatusError as e:
        body = e.body.get("message") if isinstance(e.body, dict) else None
        kind = f"HTTP {e.status_code}"
        return Outcome(image, started, time.monotonic() - started, kind, (), str(body or e))
    except openai.APIError as e:
        return Outcome(image, started, time.monotonic() - started, type(e).__name__, (), str(e))
    content = answer.choices[0].logprobs.content if answer.choices and answer.choices[0].logprobs else None
    tokens = tuple(position.token for position in content or ())
    return Outcome(image, started, time.monotonic() - started, "ok" if tokens else "no tokens", tokens)


async def _load(url: str, seconds: float, at_least: int) -> list[Outcome]:
    """CLIENTS concurrent ``openai`` clients (no retries), each sending
    requests one after another, the images in turn, until ``seconds`` are
    over and ``at_least`` requests were answered (a request started is
    always awaited)."""
    import openai

    deadline = time.monotonic() + seconds
    outcomes: list[Outcome] = []

    async def run_client(index: int) -> None:
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300
        ) as client:
            n = index
            while time.monotonic() < deadline or len(outcomes) < at_least:
                outcomes.append(await _one(client, IMAGES[n % len(IMAGES)]))
                n += 1

    await asyncio.gather(*(run_client(i) for i in range(CLIENTS)))
    return outcomes


def run_load(top: Topology, seconds: float = LOAD_SECONDS, at_least: int = 0) -> list[Outcome]:
    outcomes: list[Outcome] = call_in(
        top.net.ns("client"), asyncio.run, _load(top.lb1.url, seconds, at_least), timeout=seconds + 600
    )
    return outcomes


def wrong_answers(top: Topology, outcomes: list[Outcome]) -> list[Outcome]:
    """Answered requests whose tokens are not the reference's for their image."""
    return [
        o
        for o in outcomes
        if o.kind == "ok" and list(o.tokens[: len(top.reference[o.image])]) != top.reference[o.image]
    ]


def p99(seconds: list[float]) -> float:
    if not seconds:
        return float("nan")
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def metric(top: Topology, service: Any, name: str) -> float:
    return stack.metric(top.get(service, "/metrics"), name)


def wait_metric_zero(top: Topology, service: Any, name: str, within: float = 90.0) -> float:
    deadline = time.monotonic() + within
    while True:
        value = metric(top, service, name)
        if value == 0 or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


# -- tests --------------------------------------------------------------------


def test_every_answer_is_its_images_through_two_load_balancers(topology: Topology) -> None:
    """16 clients through lb1 -> two frontends -> lb2 -> two replicas: every
    request answered with the reference's tokens for its image, every
    replica READ from both frontends (its metadata for both is loaded), and
    both pools (frontends' and workers') empty afterwards."""
    top = topology
    assert len({tuple(t) for t in top.reference.values()}) > 1, "the images must not all give the same tokens"
    # Enough requests that each replica gets some from each frontend
    # whatever the machine's speed (each pair takes about a quarter).
    outcomes = run_load(top, at_least=MIN_REQUESTS)
    failed = [o for o in outcomes if o.kind != "ok"]
    wrong = wrong_answers(top, outcomes)
    print(
        f"\nscale-out load: {len(outcomes)} requests from {CLIENTS} clients in {LOAD_SECONDS:g} s, "
        f"{len(failed)} failed, {len(wrong)} wrong; p99 {p99([o.seconds for o in outcomes]):.2f} s; "
        f"reference tokens compared: { {k: len(v) for k, v in top.reference.items()} }"
    )
    for o in failed[:5]:
        print(f"  failed: {o.kind}: {o.message[:300]}")
    assert outcomes and not failed
    assert not wrong, wrong[:3]
    for role, replica in top.replicas.items():
        assert metric(top, replica, "pixelwire_worker_frontends") == len(FRONTENDS), (
            f"{role} must have READ from both frontends"
        )
        assert wait_metric_zero(top, replica, "pixelwire_worker_pool_bytes_in_use") == 0
    for role, frontend in top.frontends.items():
        images = stack.metric(top.get(frontend, "/metrics"), "pixelwire_frontend_images_total", path="nixl")
        assert images > 0, f"{role} served no image"
        assert wait_metric_zero(top, frontend, "pixelwire_frontend_pool_bytes_in_use") == 0


# -- faults under load ----------------------------------------------------------

# The replicas' READ timeout (PIXELWIRE_READ_TIMEOUT): a read across the
# partition fails within it.
READ_TIMEOUT = 5.0
FAULT_AT = 3.0  # seconds into the load
AFTER_SECONDS = 6.0
PARTITION_SECONDS = 10.0
# The replicas forget a frontend no READ used for this long: longer than
# any gap between one replica's READs from one frontend under the load on
# 2 loaded cores (p99 latencies reach ~20 s there), shorter than the
# test's wait for a killed frontend to be forgotten.
FRONTEND_IDLE = 30.0
TABLE: list[dict[str, Any]] = []


def nixl_images(top: Topology, service: Any, role: str) -> float:
    return stack.metric(top.get(service, "/metrics"), f"pixelwire_{role}_images_total", path="nixl")


def resent(top: Topology) -> dict[str, float]:
    """Each live frontend's count of requests resent after a READ failure."""
    return {
        role: metric(top, service, "pixelwire_frontend_resent_after_read_failure_total")
        for role, service in top.frontends.items()
        if service.process.poll() is None
    }


class Background:
    """``run_load`` in a thread of its own, while the test injects a fault."""

    def __init__(self, top: Topology, seconds: float) -> None:
        self.resent = resent(top)
        self.outcomes: list[Outcome] = []
        self.started = time.monotonic()
        self._thread = threading.Thread(
            target=lambda: self.outcomes.extend(run_load(top, seconds)), daemon=True
        )
        self._thread.start()

    def join(self) -> list[Outcome]:
        self._thread.join(LOAD_SECONDS + 600)
        assert not self._thread.is_alive(), "the load did not end"
        return self.outcomes


def replica_rss(top: Topology) -> int:
    """Resident bytes of both replicas' process trees (API server and engine)."""
    total = 0
    for replica in top.replicas.values():
        for pid in [replica.pid, *services.descendants(replica.pid)]:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def leaked(top: Topology) -> float:
    """Bytes still held in any live frontend's or replica's pool once
    they had time to empty (a failed READ quarantines its receive slot
    for twice the READ timeout)."""
    held = 0.0
    for service in top.frontends.values():
        if service.process.poll() is None:
            held += wait_metric_zero(top, service, "pixelwire_frontend_pool_bytes_in_use")
    for service in top.replicas.values():
        if service.process.poll() is None:
            held += wait_metric_zero(top, service, "pixelwire_worker_pool_bytes_in_use")
    return held


def worker_frontends(top: Topology) -> list[float]:
    return [metric(top, replica, "pixelwire_worker_frontends") for replica in top.replicas.values()]


def record(
    top: Topology, fault: str, load: Background, after: list[Outcome], fault_at: float, rss_before: int
) -> dict[str, Any]:
    """One row of the fault table; prints it and the failures by kind."""
    during = load.outcomes
    failed = [o for o in load.outcomes if o.kind != "ok"]
    # A frontend started again counts from 0.
    resends = sum(
        now - load.resent.get(role, 0.0) if now >= load.resent.get(role, 0.0) else now
        for role, now in resent(top).items()
    )
    recovered = max((o.started + o.seconds for o in failed), default=fault_at) - fault_at
    # Counted before the wait for the pools to empty, well within
    # FRONTEND_IDLE of the load after.
    frontends = worker_frontends(top)
    row = {
        "fault": fault,
        "requests": len(during),
        "failed": len(failed),
        "resent": resends,
        "wrong": len(wrong_answers(top, during + after)),
        "p99 during s": round(p99([o.seconds for o in during if o.started >= fault_at]), 2),
        "after requests": len(after),
        "after failed": sum(1 for o in after if o.kind != "ok"),
        "p99 after s": round(p99([o.seconds for o in after]), 2),
        "recover s": round(recovered, 1),
        "leaked bytes": leaked(top),
        "worker frontends": frontends,
        "worker rss MiB before/after": (rss_before >> 20, replica_rss(top) >> 20),
    }
    TABLE.append(row)
    print(f"\n[fault] {row}")
    for phase, outcomes in (("during", failed), ("after", [o for o in after if o.kind != "ok"])):
        kinds = collections.Counter(f"{o.kind}: {o.message[:200]}" for o in outcomes)
        for kind, count in kinds.most_common():
            print(f"  {phase}: {count:3d} x {kind}")
    return row


def run_after(top: Topology) -> list[Outcome]:
    return run_load(top, AFTER_SECONDS)


def test_fault_sigkill_a_frontend(topology: Topology) -> None:
    """fe1 SIGKILLed under load: HAProxy takes it out; at most its requests
    in flight fail (one a client); then every request succeeds on fe2, no
    answer is ever another image's, nothing stays held, and the replicas
    forget fe1's metadata (FRONTEND_IDLE after its last READ) while they
    keep fe2's."""
    top = topology
    rss = replica_rss(top)
    load = Background(top, LOAD_SECONDS)
    time.sleep(FAULT_AT)
    fault_at = time.monotonic()
    top.frontends["fe1"].process.kill()
    top.frontends["fe1"].process.wait(30)
    load.join()
    top.wait_out_of_service(top.lb1, "fe1")
    after = run_after(top)
    row = record(top, "SIGKILL frontend fe1", load, after, fault_at, rss)
    assert row["wrong"] == 0
    assert row["failed"] <= CLIENTS, "only requests in flight at fe1 may fail"
    assert row["after failed"] == 0
    assert row["leaked bytes"] == 0
    # fe1 went silent at the kill, fe2 with the load after: fe1 is
    # forgotten first, while fe2 is still kept.
    deadline = time.monotonic() + FRONTEND_IDLE + 15
    while max(frontends := worker_frontends(top)) > 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    print(f"  worker frontends once fe1 was forgotten: {frontends}")
    assert frontends == [1.0] * len(REPLICAS), "the replicas forgot the dead fe1, kept fe2"


def test_fault_frontend_restarts_with_a_new_agent(topology: Topology) -> None:
    """fe1 started again (a new NIXL agent at the same address): HAProxy
    puts it back, the replicas READ from it (new metadata), nothing fails."""
    top = topology
    rss = replica_rss(top)
    frontends_before = worker_frontends(top)
    load = Background(top, LOAD_SECONDS)
    time.sleep(FAULT_AT)
    fault_at = time.monotonic()
    top.wait_ready(top.start_frontend("fe1"))
    top.wait_in_service(top.lb1, ("fe1",))
    load.join()
    after = run_after(top)
    row = record(top, "frontend fe1 restarted (new agent)", load, after, fault_at, rss)
    print(f"  worker frontends (vllm1, vllm2) before the restart: {frontends_before}")
    assert row["wrong"] == 0
    assert row["failed"] == 0
    assert row["after failed"] == 0
    assert row["leaked bytes"] == 0
    assert row["worker frontends"] == [2.0] * len(REPLICAS), "the new fe1 and fe2; no stale fe1 kept"
    fe1_images = stack.metric(
        top.get(top.frontends["fe1"], "/metrics"), "pixelwire_frontend_images_total", path="nixl"
    )
    assert fe1_images > 0, "the restarted fe1 serves images"


def test_fault_replica_killed_and_restarted(topology: Topology) -> None:
    """vllm1 SIGKILLed under load, then started again: at most the requests
    it held fail (one a client; a request whose images it had READ is
    published anew by its frontend, whose retry on a fresh connection would
    otherwise send references to freed slots), the frontends free their
    slots when those requests end, lb2 puts vllm1 back once it is healthy,
    then nothing fails."""
    top = topology
    rss = replica_rss(top)
    before = {role: top.get(service, "/metrics") for role, service in top.frontends.items()}
    load = Background(top, LOAD_SECONDS)
    time.sleep(FAULT_AT)
    fault_at = time.monotonic()
    killed = top.replicas["vllm1"]
    os.killpg(killed.pid, signal.SIGKILL)  # the API server and its engine
    killed.process.wait(30)
    load.join()
    top.wait_ready(top.start_replica("vllm1"))
    top.wait_in_service(top.lb2, ("vllm1",))
    back_after = time.monotonic() - fault_at
    after = run_after(top)
    row = record(top, "vLLM replica vllm1 SIGKILLed and restarted", load, after, fault_at, rss)
    for role, service in top.frontends.items():
        text = top.get(service, "/metrics")
        fives = sum(
            stack.metric(text, "pixelwire_frontend_requests_total", route="chat", status=s)
            - stack.metric(before[role], "pixelwire_frontend_requests_total", route="chat", status=s)
            for s in ("502", "503", "504")
        )
        print(f"  {role}: 5xx answered during the fault {fives:g}")
    print(f"  vllm1 back in service {back_after:.0f} s after the kill (a CPU vLLM's start)")
    assert row["wrong"] == 0
    assert row["failed"] <= CLIENTS, "only requests in flight at vllm1 may fail"
    assert row["after failed"] == 0
    assert row["leaked bytes"] == 0


def test_fault_partition_between_a_frontend_and_a_replica(topology: Topology) -> None:
    """nftables drops everything between fe2 and vllm1 for 10 s: vllm1's
    READs from fe2 fail within the READ timeout with a clear error (fe2
    publishes such a request anew and sends it once more: it fails only if
    the load balancer picks vllm1 again), every other pair keeps serving;
    after the heal, vllm1 READs from fe2 again."""
    top = topology
    rss = replica_rss(top)
    images_before = nixl_images(top, top.replicas["vllm1"], "worker")
    load = Background(top, LOAD_SECONDS + PARTITION_SECONDS)
    time.sleep(FAULT_AT)
    fault_at = time.monotonic()
    top.net.drop_between("fe2", "vllm1")
    try:
        time.sleep(PARTITION_SECONDS)
    finally:
        top.net.heal("fe2")
    load.join()
    after = run_after(top)
    row = record(top, f"partition fe2 <-> vllm1 for {PARTITION_SECONDS:g} s", load, after, fault_at, rss)
    failed = [o for o in load.outcomes if o.kind != "ok"]
    assert row["wrong"] == 0
    assert all("pixelwire" in o.message or "NIXL" in o.message for o in failed), failed[:3]
    assert row["after failed"] == 0
    assert row["leaked bytes"] == 0
    assert nixl_images(top, top.replicas["vllm1"], "worker") > images_before, "vllm1 READs again"


def test_fault_table(topology: Topology) -> None:
    """Prints the fault table (RELIABILITY.md keeps a copy)."""
    columns = list(TABLE[0]) if TABLE else []
    print("\n| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in TABLE:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
