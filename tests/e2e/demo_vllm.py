"""``make demo-vllm``: vLLM's OpenAI server on the tiny Qwen2-VL with
VLLM_MEDIA_CONNECTOR=pixelwire, the pixelwire frontend in front of it, and
one real chat completion with two images (a base64 PNG and an http URL)
sent by the official openai client. Prints the answer and what the metrics
say travelled over NIXL."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import stack


def main() -> None:
    import openai

    work = Path(tempfile.mkdtemp(prefix="pixelwire-demo-"))
    images = work / "images"
    images.mkdir()
    shutil.copy(stack.CORPUS / "flower2.jpg", images / "flower2.jpg")
    print(f"model: {stack.model_dir()}")
    services: list[stack.Service] = []
    with stack.image_server(images) as image_base:
        try:
            env = {"PIXELWIRE_SECRET": "demo-secret", "PIXELWIRE_ALLOW_PRIVATE": "1"}
            vllm = stack.start_vllm("vllm", work, connector="pixelwire", extra_env=env)
            services.append(vllm)
            frontend = stack.start_frontend(
                "frontend", work, vllm.url, "--allowed-domains", "127.0.0.1", "--allow-private",
                env={"PIXELWIRE_SECRET": "demo-secret"},
            )  # fmt: skip
            services.append(frontend)
            print(f"starting vLLM ({vllm.url}) and the frontend ({frontend.url}); logs in {work}")
            started = time.monotonic()
            for service in services:
                service.wait_ready("/health", timeout=600)
            print(f"ready after {time.monotonic() - started:.0f} s")
            client = openai.OpenAI(base_url=f"{frontend.url}/v1", api_key="unused", max_retries=0)
            started = time.monotonic()
            with client:
                response = client.chat.completions.create(
                    model="tiny",
                    temperature=0,
                    max_tokens=8,
                    messages=[
                        {
                            "role": "user",
                            "content": [
                                {"type": "image_url", "image_url": {"url": stack.data_url("hopper.png")}},
                                {"type": "image_url", "image_url": {"url": f"{image_base}/flower2.jpg"}},
                                {"type": "text", "text": "Describe the images."},
                            ],
                        }
                    ],
                )
            elapsed = time.monotonic() - started
            print(f"answer ({elapsed:.2f} s, random tiny model): {response.choices[0].message.content!r}")
            front, worker = frontend.get("/metrics"), vllm.get("/metrics")
            print(
                "frontend: decoded {:.0f} images ({:.0f} pixel bytes) into NIXL memory; "
                "pool in use now {:.0f} B".format(
                    stack.metric(front, "pixelwire_frontend_images_total", path="nixl"),
                    stack.metric(front, "pixelwire_frontend_pixel_bytes_total", path="nixl"),
                    stack.metric(front, "pixelwire_frontend_pool_bytes_in_use"),
                )
            )
            print(
                "vLLM worker: read {:.0f} images over NIXL, {:.0f} decoded from URLs, errors {:.0f}".format(
                    stack.metric(worker, "pixelwire_worker_images_total", path="nixl"),
                    stack.metric(worker, "pixelwire_worker_images_total", path="url"),
                    sum(
                        float(line.rpartition(" ")[2])
                        for line in worker.splitlines()
                        if line.startswith("pixelwire_worker_errors_total")
                    ),
                )
            )
        finally:
            for service in reversed(services):
                service.stop()


if __name__ == "__main__":
    main()
