"""The deploy recipes run as written, on one host: the README's one-host
recipe (vLLM with the plug-in on the loopback, the frontend in front of
it, each waited for a bounded time) and docs/deploy.md's HAProxy recipe
(clients -> HAProxy -> two frontends -> HAProxy -> vLLM). Their shell
blocks are taken from the docs (``doc_recipes``) and run in one bash,
given only the variables the docs read: free ports, and the tiny Qwen2-VL
as the model, on vLLM's CPU build (the README's CPU block). One image
request through the frontend and one through the balancer are answered
over NIXL; with vLLM stopped, the balancer answers OpenAI's error JSON."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from doc_recipes import all_recipes

import stack

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

# The order a reader runs them in: the HAProxy recipe uses the one-host
# recipe's variables, wait_for and vLLM.
RECIPES = ("settings", "cpu-box", "one-host", "haproxy")
PORTS = ("VLLM_PORT", "FRONTEND_PORT", "LB_PORT", "FRONTEND2_PORT", "FRONTEND3_PORT", "VLLM_LB_PORT")
# How long the recipes may take in all: vLLM's start on a loaded 2-core box
# is most of it (the recipes' own waits are longer, for a real model).
RECIPES_SECONDS = 900


@dataclass
class Deployed:
    folder: Path
    ports: dict[str, int]
    model: str

    def url(self, port: str) -> str:
        return f"http://127.0.0.1:{self.ports[port]}"


def _post_chat(url: str, body: dict[str, Any]) -> tuple[int, str, str]:
    """The status, content type and text of the answer to a chat completion POST."""
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers.get("Content-Type", ""), error.read().decode(errors="replace")


def _image_request(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": stack.data_url("hopper.png")}},
                    {"type": "text", "text": "Describe the image."},
                ],
            }
        ],
        "max_tokens": 4,
        "temperature": 0,
    }


def _stop(group: int, folder: Path) -> None:
    """Stops what the recipes started: HAProxy (a daemon, by its pid file)
    and the process group of the bash that ran them (vLLM, the frontends)."""
    pid_file = folder / "haproxy" / "haproxy.pid"
    if pid_file.exists():
        for pid in pid_file.read_text().split():
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    recipes = all_recipes()
    script = "\n".join(["set -e", *(recipes[name] for name in RECIPES)])
    folder = tmp_path_factory.mktemp("deploy-recipes")
    ports = {name: stack.free_port() for name in PORTS}
    model = str(stack.model_dir())
    env = {
        **os.environ,
        # `python` and `pixelwire` are vLLM's environment's, as the README installs them.
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
        "MODEL": model,
        **{name: str(port) for name, port in ports.items()},
    }
    started = time.monotonic()
    with (folder / "recipes.log").open("w") as log:
        bash = subprocess.Popen(
            ["bash", "-c", script],
            cwd=folder,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = bash.wait(timeout=RECIPES_SECONDS)
        logs = "\n".join(
            f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
            for path in sorted(folder.glob("*.log"))
        )
        assert code == 0, f"the recipes exited {code}:\n{logs}"
        print(f"recipes ran in {time.monotonic() - started:.1f} s")
        yield Deployed(folder, ports, model)
    finally:
        _stop(bash.pid, folder)


def test_the_one_host_recipe_serves_an_image_over_nixl(deployed: Deployed) -> None:
    status, _, text = _post_chat(deployed.url("FRONTEND_PORT"), _image_request(deployed.model))
    assert status == 200, text
    assert json.loads(text)["choices"][0]["message"]["content"], text
    metrics = urllib.request.urlopen(f"{deployed.url('FRONTEND_PORT')}/metrics", timeout=30).read().decode()
    assert stack.metric(metrics, "pixelwire_frontend_images_total", path="nixl") >= 1


def test_the_haproxy_recipe_serves_through_both_tiers(deployed: Deployed) -> None:
    status, _, text = _post_chat(deployed.url("LB_PORT"), _image_request(deployed.model))
    assert status == 200, text
    assert json.loads(text)["choices"][0]["message"]["content"], text


def test_with_vllm_down_the_balancer_answers_openai_json(deployed: Deployed) -> None:
    """Runs last: it stops vLLM. Until the health checks take the frontends
    out, they answer themselves (502 once vLLM is gone); then HAProxy
    answers its errorfile. Every answer is JSON, every error OpenAI's."""
    os.kill(int((deployed.folder / "vllm.pid").read_text()), signal.SIGTERM)
    deadline = time.monotonic() + 60
    seen = []
    while True:
        status, content_type, text = _post_chat(deployed.url("LB_PORT"), _image_request(deployed.model))
        seen.append(status)
        assert "application/json" in content_type, (status, content_type, text)
        answer = json.loads(text)
        assert status == 200 or answer["error"]["message"], (status, answer)
        if status == 503:
            break
        assert time.monotonic() < deadline, f"no 503 from the balancer in 60 s: {seen}"
        time.sleep(0.5)
    assert answer["error"]["type"] == "ServiceUnavailableError", answer
