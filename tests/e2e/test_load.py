"""Load on a real vLLM behind the real pixelwire frontend.

The bug report: 16 concurrent ``openai`` clients, each request with a 1080p
JPEG ``data:`` URL and a 640x480 PNG http URL, some requests answered 400
``pixelwire: NIXL READ failed: Not found`` (or ``NIXL refused the READ``)
while vLLM logged ``createXferReq: metadata for remote agent
'pixelwire-front-...' not found``: the worker's reader reloaded the
frontend's NIXL metadata each time a descriptor carried another version of
it (the frontend's pool had grown), under reads still in flight.

Here the frontend's pool grows 16 MiB at a time (``--region-bytes``; the
default is 64 MiB; ``pixelwire_frontend_pool_regions`` counts them), so two
sequential warm-up requests fit in its first region(s) and the worker loads
that version of the metadata; then 16
concurrent clients hold up to ~150 MB of pixels at once, and the pool grows
region after region while the worker reads. Every request must succeed, every image must go over
NIXL, the worker must count no error, and both pools must end up empty.
Nothing here asserts on timings.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import stack

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

CLIENTS = 16
REQUESTS = 160  # 10 a client
WARM_UP = 2  # sequential, before the load: one request's images fit in a region
MAX_TOKENS = 4
REGION_BYTES = 16 << 20
# Real photos from the corpus: one upscaled to 1080p (JPEG), one kept at
# 640x480 (re-encoded as PNG and served over HTTP).
BIG_SOURCE = "exif_gps_typeerror.jpg"  # 800x531
SMALL_SOURCE = "iptc.jpg"  # 640x480
BIG = "photo-1920x1080.jpg"
SMALL = "photo-640x480.png"
# In the RGBX layout the frontend publishes RGB in.
BIG_BYTES = 1920 * 1080 * 4
SMALL_BYTES = 640 * 480 * 4


def _make_images(folder: Path) -> None:
    from PIL import Image

    with Image.open(stack.CORPUS / BIG_SOURCE) as photo:
        photo.convert("RGB").resize((1920, 1080), Image.Resampling.LANCZOS).save(folder / BIG, quality=90)
    with Image.open(stack.CORPUS / SMALL_SOURCE) as photo:
        assert photo.size == (640, 480)
        photo.convert("RGB").save(folder / SMALL)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    logs = tmp_path_factory.mktemp("load-logs")
    images = tmp_path_factory.mktemp("load-images")
    _make_images(images)
    # One request's images fit in a region; 16 clients' need many.
    assert BIG_BYTES + SMALL_BYTES < REGION_BYTES < 2 * (BIG_BYTES + SMALL_BYTES)
    stack.model_dir()
    services: list[stack.Service] = []
    with stack.image_server(images) as image_base:
        try:
            vllm = stack.start_vllm(
                "vllm-load",
                logs,
                connector="pixelwire",
                extra_env={"PIXELWIRE_SECRET": stack.SECRET, "PIXELWIRE_ALLOW_PRIVATE": "1"},
            )
            services.append(vllm)
            frontend = stack.start_frontend(
                "frontend-load",
                logs,
                vllm.url,
                "--region-bytes",
                str(REGION_BYTES),
                "--allowed-domains",
                "127.0.0.1",
                "--allow-private",
                env={"PIXELWIRE_SECRET": stack.SECRET},
            )
            services.append(frontend)
            for service in services:
                service.wait_ready("/health", timeout=600)
            big = base64.b64encode((images / BIG).read_bytes()).decode()
            yield {
                "vllm": vllm,
                "frontend": frontend,
                "urls": [f"data:image/jpeg;base64,{big}", f"{image_base}/{SMALL}"],
            }
        finally:
            for service in reversed(services):
                service.stop()


def _metric_sum(text: str, name: str) -> float:
    """The sum of every sample of one metric, whatever its labels."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rpartition(" ")[2])
    return total


def _by_label(text: str, name: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


def _wait_zero(service: stack.Service, name: str, within: float) -> float:
    deadline = time.monotonic() + within
    while True:
        value = stack.metric(service.get("/metrics"), name)
        if value == 0 or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


async def _one(client: Any, urls: list[str], n: int) -> tuple[str, str]:
    """("ok", text) or (kind, message) for one chat completion."""
    import openai

    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    parts.append({"type": "text", "text": f"Describe the two images ({n})."})
    try:
        response = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": parts}],
            temperature=0,
            max_tokens=MAX_TOKENS,
        )
    except openai.APIStatusError as e:
        message = e.body.get("message") if isinstance(e.body, dict) else None
        return f"HTTP {e.status_code}", str(message or e.message)
    except openai.APIError as e:
        return type(e).__name__, str(e)
    tokens = response.usage.completion_tokens if response.usage else 0
    if not response.choices or tokens < 1:
        return "no tokens", repr(response)
    return "ok", response.choices[0].message.content or ""


async def _load(
    base_url: str, urls: list[str], frontend: stack.Service
) -> tuple[list[tuple[str, str]], int, list[tuple[str, str]]]:
    """WARM_UP requests one by one, then REQUESTS from CLIENTS concurrent
    clients (one AsyncOpenAI each, no retries) drawing from one counter.
    Returns the warm-up's outcomes, the frontend's regions after it and
    the load's outcomes."""
    import openai

    def client() -> Any:
        return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)

    async with client() as first:
        warm = [await _one(first, urls, -1 - i) for i in range(WARM_UP)]
    warm_regions = _regions(frontend)
    outcomes: list[tuple[str, str]] = []
    numbers = iter(range(REQUESTS))

    async def run_client() -> None:
        async with client() as mine:
            for n in numbers:
                outcomes.append(await _one(mine, urls, n))

    await asyncio.gather(*(run_client() for _ in range(CLIENTS)))
    return warm, warm_regions, outcomes


def _regions(frontend: stack.Service) -> int:
    return int(stack.metric(frontend.get("/metrics"), "pixelwire_frontend_pool_regions"))


def _summary(outcomes: list[tuple[str, str]]) -> collections.Counter[tuple[str, str]]:
    """Failures counted by the shape of their message (agent names,
    addresses and sizes vary)."""
    shapes = ((r"pixelwire-front-[\w-]+", "<agent>"), (r"0x[0-9a-f]+", "<addr>"), (r"\d+", "N"))
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for kind, message in outcomes:
        if kind != "ok":
            for pattern, replacement in shapes:
                message = re.sub(pattern, replacement, message)
            counts[(kind, message[:300])] += 1
    return counts


def test_concurrent_clients_with_a_growing_pool(served: dict[str, Any]) -> None:
    vllm, frontend, urls = served["vllm"], served["frontend"], served["urls"]
    worker_before = vllm.get("/metrics")
    front_before = frontend.get("/metrics")
    started = time.monotonic()
    warm, warm_regions, outcomes = asyncio.run(_load(f"{frontend.url}/v1", urls, frontend))
    elapsed = time.monotonic() - started
    regions = _regions(frontend)
    front_in_use = _wait_zero(frontend, "pixelwire_frontend_pool_bytes_in_use", 60.0)
    failed_reads = _metric_sum(vllm.get("/metrics"), "pixelwire_worker_errors_total") > _metric_sum(
        worker_before, "pixelwire_worker_errors_total"
    )
    # A failed READ quarantines its receive slot for twice the read timeout:
    # no use waiting for the worker's pool then.
    worker_in_use = _wait_zero(vllm, "pixelwire_worker_pool_bytes_in_use", 0.0 if failed_reads else 60.0)
    worker_after = vllm.get("/metrics")
    front_after = frontend.get("/metrics")

    def delta(name: str, before: str, after: str, **labels: str) -> float:
        return stack.metric(after, name, **labels) - stack.metric(before, name, **labels)

    ok = sum(1 for kind, _ in outcomes if kind == "ok")
    failures = _summary(outcomes)
    front_nixl = delta("pixelwire_frontend_images_total", front_before, front_after, path="nixl")
    worker_nixl = delta("pixelwire_worker_images_total", worker_before, worker_after, path="nixl")
    worker_errors = _metric_sum(worker_after, "pixelwire_worker_errors_total") - _metric_sum(
        worker_before, "pixelwire_worker_errors_total"
    )
    released = stack.metric(front_after, "pixelwire_frontend_released_at_request_end_total")
    print(
        f"\nload: {REQUESTS} requests from {CLIENTS} clients (+{WARM_UP} warm-up) in {elapsed:.1f} s: "
        f"{ok} ok, {REQUESTS - ok} failed; warm-up {[kind for kind, _ in warm]}"
    )
    for (kind, message), count in failures.most_common():
        print(f"  {count:4d} x {kind}: {message}")
    for kind, message in {kind: message for kind, message in outcomes if kind != "ok"}.items():
        print(f"  e.g. {kind}: {message}")
    print(
        f"frontend pool: {warm_regions} region(s) after warm-up, {regions} at the end "
        f"({REGION_BYTES >> 20} MiB each); bytes in use afterwards {front_in_use:g}"
    )
    want = 2 * (REQUESTS + WARM_UP)
    print(f"images over NIXL: frontend +{front_nixl:g}, worker +{worker_nixl:g} (want {want})")
    print(
        f"worker errors +{worker_errors:g} {_by_label(worker_after, 'pixelwire_worker_errors_total')}; "
        f"worker pool bytes in use afterwards {worker_in_use:g}; "
        f"frontend released at request end {released:g}"
    )
    # NIXL's own error lines in vLLM's log (e.g. "createXferReq: metadata
    # for remote agent '...' not found"), counted by shape.
    nixl_lines = collections.Counter(
        re.sub(r"'pixelwire-front-[^']*'", "<agent>", line.split("] ", 1)[-1])
        for line in vllm.log.read_text(errors="replace").splitlines()
        if re.search(r"\bE\d{4} .*nixl_agent\.cpp", line)
    )
    print(f"vLLM log, NIXL errors: {dict(nixl_lines) or 'none'}")

    assert [kind for kind, _ in warm] == ["ok"] * WARM_UP, warm
    # The worker knows the frontend's metadata from the warm-up; the load
    # must then change it, under reads in flight.
    assert warm_regions >= 1
    assert regions > warm_regions, "the frontend's pool must grow during the load"
    assert ok == REQUESTS, f"{REQUESTS - ok} of {REQUESTS} requests failed: {dict(failures)}"
    assert front_nixl == worker_nixl == want, "every image goes over NIXL"
    assert worker_errors == 0
    assert front_in_use == 0, "the frontend's pool is empty afterwards"
    assert worker_in_use == 0, "the worker's receive pool is empty afterwards"
