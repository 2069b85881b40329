"""Servers on the loopback that a frontend under test talks to: an upstream
that plays vLLM's HTTP side (reading every descriptor over real NIXL with a
real Reader), one that drops connections as uvicorn does, and HTTP servers
that count their hits (an image server, or a trap that must never be
reached)."""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import json
import threading
from typing import Any

import numpy as np
from aiohttp import web

import pixelwire
from pixelwire.resend import NOT_HELD, READ_FAILED
from pixelwire.resent_reference import resent_image
from pixelwire.signing import decode_reference, is_reference, secret_fingerprint

import stack
from frontend_client import SECRET
from reference import CORPUS


def worker_info(**settings: str) -> str:
    """The line a worker's plug-in shows on vLLM's /metrics: by default
    the settings that agree with :func:`frontend_client.started_frontend`
    (its connector, this pixelwire, :data:`SECRET`'s fingerprint), each
    label in ``settings`` replacing its default."""
    labels = {
        "version": pixelwire.__version__,
        "connector": "pixelwire",
        "secret": secret_fingerprint(SECRET),
        "unsigned": "0",
        "private": "0",
        "resize": "none",
        **settings,
    }
    text = ",".join(f'{name}="{value}"' for name, value in labels.items())
    return f"# TYPE pixelwire_worker_info gauge\npixelwire_worker_info{{{text}}} 1.0\n"


INFO = worker_info()
# What a vLLM without the plug-in shows on /metrics: its own metrics only.
VLLM_METRICS = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n"


class Upstream:
    """An OpenAI-shaped server: for each image or video reference it READs
        the pixels over NIXL and answers their shape and SHA-256 (for a resent
        image's reference, the digest and size it names); ``"hang"`` in the model
        name makes it wait forever, ``"held"`` until :meth:`release` (its images
    unread till then), ``"stream"`` answers SSE. Its /metrics
        shows ``metrics_text`` (a worker's info line, or vLLM's metrics alone),
        with ``metrics_status``, which a test may change; its /health answers
        ``health_status``; with ``api_keys`` set, its /v1 routes answer 401 to a
        request without one of them as its Bearer token, as vLLM's --api-key."""

    def __init__(self, *, plugin: bool = True) -> None:
        self.metrics_text = INFO if plugin else VLLM_METRICS
        self.metrics_status = 200
        self.api_keys: list[str] = []
        # While metrics_silent, each /metrics GET is dropped unanswered (as
        # by a vLLM not listening yet); metrics_gate, when a test sets one,
        # holds the next GET (silent or not as it came; metrics_held says it
        # came) until the gate opens.
        self.metrics_silent = False
        self.metrics_gate: threading.Event | None = None
        self.metrics_held = threading.Event()
        self.metrics_dropped = threading.Event()
        self._metrics_lock = threading.Lock()
        self.health_status = 200
        self.refuse_with = ""  # an image request is answered 400 with this message when set
        # The next this many image requests are answered with the plug-in's READ failure, unread.
        self.read_failures = 0
        # The next this many requests with a resent image's reference are
        # answered as by a plug-in that no longer holds it.
        self.not_held = 0
        self.calls = 0
        # Every request but /metrics, /health and the handshake's, as the upstream saw its path.
        self.paths: list[str] = []
        self.options_bodies: list[bytes] = []  # the body of every OPTIONS request, as received
        self.bodies: list[dict[str, Any]] = []  # every chat-shaped body, as the upstream got it
        self.redirect_to = ""
        self.received = threading.Event()
        self.gate = asyncio.Event()
        self.port = stack.free_port()
        self.loop = asyncio.new_event_loop()
        self.reader = pixelwire.Reader(timeout=10)
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self.record])
        # vLLM's chat-shaped routes (the frontend rewrites them all alike).
        for route in ("/v1/chat/completions", "/tokenize", "/pooling", "/v1/embeddings", "/classify"):
            app.router.add_post(route, self.chat)
        app.router.add_route("*", "/redirect", self.redirect)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        self.loop.run_until_complete(self.runner.setup())
        self.loop.run_until_complete(web.TCPSite(self.runner, "127.0.0.1", self.port).start())
        started.set()
        self.loop.run_forever()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @web.middleware
    async def record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        handshake = "(handshake)" in request.headers.get("User-Agent", "")
        if request.path not in ("/metrics", "/health") and not handshake:
            self.paths.append(request.raw_path)
        if request.method == "OPTIONS":
            self.options_bodies.append(await request.read())
        if self.api_keys and request.path.startswith("/v1") and request.method != "OPTIONS":
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or token not in self.api_keys:
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)  # type: ignore[no-any-return]

    async def redirect(self, _request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(self.redirect_to)

    async def metrics(self, request: web.Request) -> web.Response:
        with self._metrics_lock:
            silent, gate = self.metrics_silent, self.metrics_gate
            self.metrics_gate = None
        if gate is not None:
            self.metrics_held.set()
            await asyncio.to_thread(gate.wait, 30)
        if silent:
            assert request.transport is not None
            request.transport.abort()
            self.metrics_dropped.set()
        return web.Response(text=self.metrics_text, status=self.metrics_status)

    async def health(self, _request: web.Request) -> web.Response:
        return web.Response(status=self.health_status)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}], "query": request.query_string}, status=203)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        body = await request.json()
        self.bodies.append(body)
        self.received.set()
        if "hang" in body["model"]:
            await asyncio.sleep(3600)
        if "held" in body["model"]:
            await self.gate.wait()
        if "redirect" in body["model"]:
            raise web.HTTPTemporaryRedirect(self.redirect_to)
        if self.read_failures and "pixelwire:" in json.dumps(body):
            self.read_failures -= 1
            failed = f"{READ_FAILED}READ of 49152 bytes from pixelwire-front-x timed out after 5s"
            error = {"message": failed, "type": "BadRequestError", "code": 400}
            return web.json_response({"error": error}, status=400)
        if self.not_held and "pixelwire:" in json.dumps(body):
            self.not_held -= 1
            error = {"message": f"{NOT_HELD}this worker no longer holds it", "type": "BadRequestError"}
            return web.json_response({"error": {**error, "code": 400}}, status=400)
        if self.refuse_with and "pixelwire:" in json.dumps(body):
            # As vLLM answers the ValueError its plug-in raises.
            return web.json_response({"error": {"message": self.refuse_with, "code": 400}}, status=400)
        images = []
        for message in body["messages"]:
            for part in message["content"] if isinstance(message["content"], list) else []:
                # image_url parts, input_image parts and parts without a type: vLLM loads them all.
                url = part.get("image_url") or part.get("video_url")
                url = url.get("url") if isinstance(url, dict) else url
                if isinstance(url, str):
                    resent = resent_image(decode_reference(url, SECRET)) if is_reference(url) else None
                    if resent is not None:
                        # A resent image's reference: what it names.
                        images.append({"resent": resent.sha256, "bytes": resent.nbytes})
                    elif is_reference(url):
                        # The worker's plug-in asks for PIL images; numpy here otherwise (and for videos).
                        output = "pil" if "pil" in body["model"] and "image_url" in part else "numpy"
                        read = await self.reader.read_decoded(decode_reference(url, SECRET), output=output)
                        pixels = np.asarray(read)
                        images.append(
                            {"shape": list(pixels.shape), "sha": hashlib.sha256(pixels).hexdigest()}
                        )
                    else:
                        images.append({"url": url[:40]})
        if "stream" not in body["model"]:
            return web.json_response({"images": images}, status=201)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(f"data: {json.dumps({'i': i, 'images': images})}\n\n".encode())
            await asyncio.sleep(0.05)
        await response.write(b"data: [DONE]\n\n")
        return response

    def hold_next_metrics(self, gate: threading.Event) -> None:
        """The next /metrics GET waits for ``gate``."""
        with self._metrics_lock:
            self.metrics_held.clear()
            self.metrics_gate = gate

    def release(self) -> None:
        """Lets the ``"held"`` requests go on."""
        self.loop.call_soon_threadsafe(self.gate.set)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        asyncio.run(self.reader.close())


class Counting:
    """A loopback HTTP server that counts its hits; it serves corpus files
    (the image server) or a page that must never be reached (the trap)."""

    def __init__(self) -> None:
        self.hits = 0
        # Bytes a test made, served by name before any corpus file.
        self.made: dict[str, bytes] = {}
        # Files asked for under /held/ are served once this is set.
        self.release = threading.Event()
        self.release.set()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.hits += 1
                if self.path.startswith("/held/"):
                    outer.release.wait(30)
                    self.path = self.path.removeprefix("/held")
                path = CORPUS / self.path.strip("/")
                data = outer.made.get(self.path.strip("/"))
                if data is None:
                    data = path.read_bytes() if self.path.strip("/") and path.is_file() else b"trap"
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_GET

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class ClosingUpstream:
    """An upstream that answers the first request on each connection and
    closes the connection unanswered when a second arrives on it (as
    uvicorn does to a connection after a request that made the app raise)."""

    def __init__(self) -> None:
        self.answered = 0
        self.dropped = 0
        self.port = stack.free_port()
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        assert started.wait(10)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                if served == 1 and not head.startswith(b"GET /metrics"):
                    self.dropped += 1
                    return  # closes without a byte of answer
                served += 1
                payload = INFO.encode() if head.startswith(b"GET /metrics") else b'{"ok": true}'
                if not head.startswith(b"GET /metrics"):
                    self.answered += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._connection, "127.0.0.1", self.port))
        started.set()
        self.loop.run_forever()
        server.close()
        self.loop.run_until_complete(server.wait_closed())
        self.loop.close()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
