"""Starts the pieces of a real serving stack for the end-to-end tests and
``make demo-vllm``: vLLM's OpenAI server on the tiny model, the pixelwire
frontend, and a local HTTP server for images."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pixelwire.bench import services

import tiny_model

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parents[2] / "shared" / "corpus" / "pillow"
CACHE = Path(os.environ.get("PIXELWIRE_E2E_CACHE", Path.home() / ".cache" / "pixelwire"))
SECRET = "e2e-test-secret"


def model_dir(family: str = "qwen2-vl") -> Path:
    """The tiny model of ``family`` (``tiny_model.BUILDERS``), built once per
    version of its recipe."""
    recipe = hashlib.sha256((HERE / "tiny_model.py").read_bytes()).hexdigest()[:12]
    return tiny_model.ensure(CACHE / f"tiny-{family}-{recipe}", family)


def data_url(name: str) -> str:
    """A corpus file as a base64 ``data:`` URL."""
    kind = {"jpg": "jpeg", "tif": "tiff"}.get(name.rsplit(".", 1)[-1], name.rsplit(".", 1)[-1])
    return f"data:image/{kind};base64,{base64.b64encode((CORPUS / name).read_bytes()).decode()}"


def peak_rss(service: Service) -> int:
    """The service process's peak resident memory (VmHWM), in bytes."""
    status = Path(f"/proc/{service.pid}/status").read_text()
    (line,) = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024


def free_port() -> int:
    return services.free_port("127.0.0.1")


class Service(services.Service):
    """A server on the loopback (``pixelwire.bench.services.Service``, which
    ``pixelwire bench serve`` starts its servers with), on ``port``."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        port: int,
        log_dir: Path,
        host: str = "127.0.0.1",
    ) -> None:
        super().__init__(name, argv, env, f"http://{host}:{port}", log_dir)
        self.port = port


def start_vllm(
    name: str,
    log_dir: Path,
    *,
    connector: str,
    extra_env: dict[str, str] | None = None,
    extra_args: tuple[str, ...] = (),
    host: str = "127.0.0.1",
    launcher: tuple[str, ...] = (),
    family: str = "qwen2-vl",
) -> Service:
    """vLLM's OpenAI server on the tiny model of ``family``; ``connector``
    is VLLM_MEDIA_CONNECTOR ("http" is vLLM's own loader). ``launcher``
    prefixes the command (e.g. ``ip netns exec NS``: a host of its own,
    where it listens on ``host``, port 8000)."""
    port = 8000 if launcher else free_port()
    # Videos are tested on the tiny Qwen2-VL only.
    limits = {"image": 4, "video": 1} if family == "qwen2-vl" else {"image": 4}
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_MEDIA_CONNECTOR": connector,
        "NIXL_LOG_LEVEL": "WARN",
        **(extra_env or {}),
    }
    argv = [
        *launcher, sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir(family)), "--served-model-name", "tiny",
        "--host", host, "--port", str(port),
        "--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "4",
        "--enforce-eager", "--limit-mm-per-prompt", json.dumps(limits), "--seed", "0", *extra_args,
    ]  # fmt: skip
    return Service(name, argv, env, port, log_dir, host)


def start_frontend(
    name: str,
    log_dir: Path,
    upstream: str,
    *args: str,
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
    launcher: tuple[str, ...] = (),
) -> Service:
    """``pixelwire frontend``; ``host`` and ``launcher`` as for :func:`start_vllm`."""
    port = 8000 if launcher else free_port()
    argv = [
        *launcher, sys.executable, "-m", "pixelwire.cli", "frontend",
        "--upstream", upstream, "--host", host, "--port", str(port), *args,
    ]  # fmt: skip
    # Tests see a pool that empties when its images are read: the cache of
    # published images is off unless a test turns it on (--cache-bytes).
    quiet = {"NIXL_LOG_LEVEL": "WARN", "PIXELWIRE_CACHE_BYTES": "0"}
    return Service(name, argv, {**os.environ, **quiet, **(env or {})}, port, log_dir, host)


def image_server(root: Path) -> contextlib.AbstractContextManager[str]:
    """Serves ``root`` over HTTP on the loopback; yields its base URL."""
    return services.image_server(root, "127.0.0.1")


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text, 0 when absent."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        metric_name, _, label_text = key.partition("{")
        if metric_name != name:
            continue
        found = ",".join(sorted(label_text.rstrip("}").split(","))) if label_text else ""
        if found == want:
            return float(value)
    return 0.0


# For the helpers below (added after the module's first ones).
from collections.abc import Callable  # noqa: E402


@contextlib.contextmanager
def recording_server(
    respond: Callable[[http.server.BaseHTTPRequestHandler], None],
) -> Iterator[tuple[str, list[str]]]:
    """A threaded HTTP server on the loopback that records every request
    ("METHOD path", any method, any path) before ``respond(handler)``
    answers it; yields its base URL and the (live) list of requests. A
    client that goes away mid-answer is not an error."""
    requests: list[str] = []
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            with lock:
                requests.append(f"{self.command} {self.path}")
            try:
                respond(self)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                self.close_connection = True

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _any

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a client that vanished: nothing to report

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requests
    finally:
        server.shutdown()
        server.server_close()


def chat(
    url: str, image_urls: list[str], *, max_tokens: int = 8, stream: bool = False
) -> list[tuple[str, float]]:
    """(token, logprob) of a greedy chat completion of ``max_tokens`` about
    ``image_urls``, from the OpenAI server at ``url`` (its model "tiny");
    ``stream``: gathered from its server-sent events."""
    if not stream:
        response = completion(url, image_urls, max_tokens=max_tokens)
        return [(t.token, t.logprob) for t in response.choices[0].logprobs.content]
    out: list[tuple[str, float]] = []
    with _client(url) as client:
        for chunk in client.chat.completions.create(**_chat_args(image_urls, max_tokens), stream=True):
            if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                out.extend((t.token, t.logprob) for t in chunk.choices[0].logprobs.content)
    return out


def completion(url: str, image_urls: list[str], *, max_tokens: int = 8) -> Any:
    """The whole response (usage included) of :func:`chat`'s completion."""
    with _client(url) as client:
        return client.chat.completions.create(**_chat_args(image_urls, max_tokens))


def _client(url: str) -> Any:
    """An OpenAI client of the server at ``url``, to be closed after its
    completion: an open client's sockets would be reported (as errors,
    with filterwarnings=error) when collected."""
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _chat_args(image_urls: list[str], max_tokens: int) -> dict[str, Any]:
    parts: list[dict[str, object]] = [{"type": "image_url", "image_url": {"url": u}} for u in image_urls]
    parts.append({"type": "text", "text": "Describe the image."})
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": parts}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "logprobs": True,
        "seed": 0,
    }


def post_chat_raw(
    service: Service, body: dict[str, Any], *, timeout: float = 120, api_key: str | None = None
) -> tuple[int, Any]:
    """POST ``body`` to ``service``'s /v1/chat/completions (with ``api_key``
    as its Bearer token, if given): the status and the raw answer, or an
    error's JSON."""
    headers = {"Content-Type": "application/json"}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(
        f"{service.url}/v1/chat/completions", data=json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read())


def post_chat(
    service: Service, body: dict[str, Any], api_key: str | None = None
) -> tuple[int, dict[str, Any]]:
    """:func:`post_chat_raw` with the answer as JSON, errors included."""
    status, answer = post_chat_raw(service, body, api_key=api_key)
    return status, json.loads(answer) if isinstance(answer, bytes) else answer
