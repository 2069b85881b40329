"""The handshake's content (``pixelwire.handshake``): what a worker's info
labels say, and each setting a frontend and a worker can disagree on, named
with the variable or option that would change it."""

from __future__ import annotations

import dataclasses

import pytest

import pixelwire
from pixelwire.config import PublisherSettings
from pixelwire.frontend.settings import FrontendConfig
from pixelwire.handshake import (
    WorkerSettings,
    api_key_mismatches,
    metrics_problem,
    mismatches,
    worker_settings_in,
)
from pixelwire.processed import PatchLayout
from pixelwire.resize.families.anyres import AnyresPolicy
from pixelwire.resize.families.smart import SmartPolicy
from pixelwire.signing import secret_fingerprint

SECRET = b"handshake-secret"
VERSION = pixelwire.__version__
POLICY = SmartPolicy(factor=28, min_pixels=3136, max_pixels=1 << 20)
APPROXIMATE = AnyresPolicy(height=384, width=384, grid=((384, 384),), tile_patches=27)
AGREEING = WorkerSettings(
    version=VERSION, connector="pixelwire", secret=secret_fingerprint(SECRET), unsigned="0", private="0",
    resize="none", processed="none",
)  # fmt: skip
LAYOUT = PatchLayout(14, 2, 2, POLICY)


def _frontend(decode_at: str = "frontend", **settings: object) -> FrontendConfig:
    publisher = PublisherSettings(decode_at=decode_at)  # type: ignore[arg-type]
    return FrontendConfig(upstream="http://vllm", **{"secret": SECRET, "publisher": publisher, **settings})  # type: ignore[arg-type]


def _worker(**labels: str) -> WorkerSettings:
    return dataclasses.replace(AGREEING, **labels)


def test_a_worker_with_the_same_settings_agrees() -> None:
    assert mismatches(_frontend(), AGREEING, VERSION) == []
    # A frontend that does not resize ships full resolution, which any worker takes.
    assert mismatches(_frontend(), _worker(resize=POLICY.identity), VERSION) == []
    assert mismatches(_frontend(resize=POLICY), _worker(resize=POLICY.identity), VERSION) == []
    # Processed inputs the worker takes; a worker that takes them serves a frontend shipping pixels too.
    taking = _worker(resize=POLICY.identity, processed=LAYOUT.identity)
    assert mismatches(_frontend(resize=POLICY, processed=LAYOUT), taking, VERSION) == []
    assert mismatches(_frontend(resize=POLICY), taking, VERSION) == []
    # Unsigned on both sides, the worker accepting them.
    assert mismatches(_frontend(secret=None), _worker(secret="none", unsigned="1"), VERSION) == []


@pytest.mark.parametrize(
    ("frontend", "worker", "setting", "words"),
    [
        ({}, {"connector": "http"}, "connector", "VLLM_MEDIA_CONNECTOR=pixelwire"),
        ({}, {"version": "0.0.1"}, "version", f"frontend {VERSION}, worker 0.0.1"),
        ({}, {"secret": "0123456789abcdef"}, "secret", "PIXELWIRE_SECRET differs: frontend fingerprint"),
        ({}, {"secret": "none", "unsigned": "1"}, "secret", "set the frontend's PIXELWIRE_SECRET on vLLM"),
        ({"secret": None}, {}, "secret", "worker " + secret_fingerprint(SECRET)),
        ({"secret": None}, {"secret": "none"}, "unsigned", "PIXELWIRE_ALLOW_UNSIGNED=1"),
        ({"resize": POLICY}, {}, "resize", "no resize policy"),
        ({"resize": POLICY}, {"resize": "fixed:224x224:torchvision:bicubic"}, "resize",
         "--mm-processor-kwargs"),
        ({"resize": APPROXIMATE}, {}, "resize", "PIXELWIRE_RESIZE_APPROXIMATE=1"),
        ({"processed": LAYOUT}, {}, "processed", "--no-processed-inputs"),
        ({"processed": LAYOUT}, {"processed": "qwen2_vl_patches:uint8:patch=16"}, "processed",
         "--mm-processor-kwargs"),
    ],
    ids=["connector", "version", "secret", "secret-unset-on-worker", "secret-unset-on-frontend", "unsigned",
         "model", "kwargs", "approximate-unset-on-worker", "processed-not-taken", "processed-other"],
)  # fmt: skip
def test_each_disagreement_is_named(
    frontend: dict[str, object], worker: dict[str, str], setting: str, words: str
) -> None:
    found = mismatches(_frontend(**frontend), _worker(**worker), VERSION)
    assert [m.setting for m in found] == [setting]
    assert words in found[0].message, found[0].message


def test_a_vllm_without_the_plugin_disagrees_in_both_modes() -> None:
    (found,) = mismatches(_frontend(), None, VERSION)
    assert found.setting == "connector" and "VLLM_MEDIA_CONNECTOR=pixelwire" in found.message
    # In worker mode vLLM's own loader would fetch the URLs, outside the
    # guard on redirects and without the native decode.
    for worker in (None, _worker(connector="http")):
        (found,) = mismatches(_frontend(decode_at="worker"), worker, VERSION)
        assert found.setting == "connector", found
        assert "VLLM_MEDIA_CONNECTOR=pixelwire" in found.message and "--no-check-upstream" in found.message


def test_worker_mode_compares_the_private_address_policy_only() -> None:
    worker_mode = _frontend(decode_at="worker", secret=None, resize=POLICY)
    stranger = _worker(version="0.0.1", secret="none", resize="none")
    assert mismatches(worker_mode, stranger, VERSION) == []
    (found,) = mismatches(dataclasses.replace(worker_mode, allow_private=True), stranger, VERSION)
    assert found.setting == "private"
    assert "--allow-private" in found.message and "PIXELWIRE_ALLOW_PRIVATE=1" in found.message
    allowing = dataclasses.replace(worker_mode, allow_private=True)
    assert mismatches(allowing, _worker(private="1"), VERSION) == []


def test_the_info_line_is_read_from_metrics_text() -> None:
    labels = AGREEING.labels()
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    page = (
        "# HELP vllm:x y\nvllm:x 3.0\n# TYPE pixelwire_worker_info gauge\n"
        f"pixelwire_worker_info{{{text}}} 1.0\n"
    )
    assert worker_settings_in(page) == AGREEING
    assert worker_settings_in("vllm:x 3.0\n") is None
    assert worker_settings_in(page.replace("} 1.0", "} 0.0")) is None
    # An older plug-in, with only version and connector: the rest reads unknown.
    older = worker_settings_in('pixelwire_worker_info{version="0.0.1",connector="pixelwire"} 1.0\n')
    assert older is not None and older.secret == "unknown"
    assert {m.setting for m in mismatches(_frontend(), older, VERSION)} >= {"version", "secret"}
    assert older.memo == "unknown"


@pytest.mark.parametrize(("cache", "memo"), [(None, "1"), ("0", "0"), ("64MiB", "1")])
def test_a_worker_declares_whether_it_keeps_the_data_urls_it_decoded(
    monkeypatch: pytest.MonkeyPatch, cache: str | None, memo: str
) -> None:
    """The memo label, from PIXELWIRE_WORKER_CACHE_BYTES (on by default):
    a worker-mode frontend sends resent images as references only to a
    worker that shows 1 there. It is no disagreement either way."""
    if cache is None:
        monkeypatch.delenv("PIXELWIRE_WORKER_CACHE_BYTES", raising=False)
    else:
        monkeypatch.setenv("PIXELWIRE_WORKER_CACHE_BYTES", cache)
    declared = WorkerSettings.declared(VERSION, "pixelwire", "none", "none")
    assert declared.memo == memo and declared.labels()["memo"] == memo
    worker_mode = _frontend(decode_at="worker")
    assert mismatches(worker_mode, declared, VERSION) == []


@pytest.mark.parametrize(
    ("status", "text", "words"),
    [
        (404, "Not Found", "answers GET /metrics with 404"),
        (200, "<html>a web server</html>", "neither vLLM's metrics nor the pixelwire plug-in's"),
        (200, "# TYPE dynamo_requests counter\ndynamo_requests_total 3.0\n", "neither vLLM's metrics"),
    ],
    ids=["hidden", "not-vllm", "a-router"],
)  # fmt: skip
def test_a_metrics_page_that_is_not_vllms_is_named_with_the_fix(status: int, text: str, words: str) -> None:
    problem = metrics_problem(status, text)
    assert problem is not None and words in problem, problem
    assert "without /v1" in problem and "--upstream-metrics" in problem and "--no-check-upstream" in problem


def test_vllms_metrics_page_is_read_with_or_without_the_plugin() -> None:
    assert (
        metrics_problem(200, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n")
        is None
    )
    labels = ",".join(f'{k}="{v}"' for k, v in AGREEING.labels().items())
    assert metrics_problem(200, f"pixelwire_worker_info{{{labels}}} 1.0\n") is None


def test_an_api_key_vllm_would_refuse_is_a_disagreement() -> None:
    (without,) = api_key_mismatches(0, refused_without_key=True, refused_keys=0)
    assert (
        without.setting == "api_key" and "--api-key" in without.message and "VLLM_API_KEY" in without.message
    )
    (refused,) = api_key_mismatches(1, refused_without_key=False, refused_keys=1)
    assert refused.setting == "api_key" and "refuses this frontend's API key" in refused.message
    (some,) = api_key_mismatches(3, refused_without_key=False, refused_keys=2)
    assert "2 of this frontend's 3 API keys" in some.message
    # A vLLM without a key takes any; one that takes every key of the frontend agrees.
    assert api_key_mismatches(0, refused_without_key=False, refused_keys=0) == []
    assert api_key_mismatches(2, refused_without_key=False, refused_keys=0) == []
