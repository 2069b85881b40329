"""What vLLM's API server spends on an image's pixels, in process: vLLM 0.32's
multimodal processor (``processor.apply``, what the API server runs for a
request's media) on

- ``loader``: vLLM's own loader's image (the full picture; decoding not counted);
- ``resized``: the frontend's model-aware resize of it (``--no-processed-inputs``);
- ``processed``: the frontend's processed inputs, read over NIXL from a
  publisher in this process (the READ and the one copy out of the receive
  memory counted), handed to the processor through the plug-in's seam;

for JPEG and PNG photos at 1080p and 4K, at Qwen2-VL's default budget
(``max_pixels`` 12845056) and a downsizing one (1003520), with the tiny
Qwen2-VL's processor (the processor's work depends on its config, not on
the model's weights). CPU time of this process (``time.process_time``:
every thread, the reader's included), the median of ``--repeats``
alternating runs, one torch thread as in vLLM's API server.

Run in vLLM's environment:

    python benches/processed_inputs.py --model MODEL --photo PHOTO --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import time
import warnings
from typing import Any

BUDGETS = (12845056, 1003520)
SIZES = {"1080p": (1920, 1080), "4k": (3840, 2160)}
SECRET = b"processed-inputs-bench"


def _inputs(photo: str) -> dict[str, bytes]:
    from PIL import Image, ImageOps

    with Image.open(photo) as opened:
        base = opened.convert("RGB")
    made = {}
    for size_name, size in SIZES.items():
        picture = ImageOps.fit(base, size, Image.Resampling.LANCZOS)
        for fmt, options in (("JPEG", {"quality": 90}), ("PNG", {"compress_level": 6})):
            out = io.BytesIO()
            picture.save(out, fmt, **options)
            made[f"{fmt.lower()}-{size_name}"] = out.getvalue()
    return made


def _serve_as(model: str, budget: int) -> None:
    """This process as a vLLM API server with the plug-in, for ``model`` at ``budget``."""
    import pixelwire.vllm
    from pixelwire.vllm import worker_settings

    os.environ["PIXELWIRE_SECRET"] = SECRET.decode()
    os.environ["VLLM_MEDIA_CONNECTOR"] = "pixelwire"
    kwargs = json.dumps({"max_pixels": budget})
    sys.argv = ["api_server.py", "--model", model, "--mm-processor-kwargs", kwargs]
    worker_settings.worker_resize_policy.cache_clear()
    pixelwire.vllm.register()


class Served:
    """vLLM's processor, the resize policy and the patch layout of ``model`` at ``budget``."""

    def __init__(self, model: str, budget: int) -> None:
        from vllm.config import ModelConfig
        from vllm.multimodal import MULTIMODAL_REGISTRY

        from pixelwire.processed import patch_layout
        from pixelwire.resize import image_resize_policy

        _serve_as(model, budget)
        kwargs = {"max_pixels": budget}
        self.budget = budget
        self.processor = MULTIMODAL_REGISTRY.create_processor(
            ModelConfig(model=model, mm_processor_kwargs=kwargs)
        )
        policy = image_resize_policy(model, kwargs)
        layout = patch_layout(model, kwargs, policy)
        assert policy is not None and layout is not None
        self.policy, self.layout = policy, layout
        tokenizer = self.processor.info.get_tokenizer()
        self.prompt = tokenizer.encode("<|vision_start|><|image_pad|><|vision_end|>Describe it.")

    def apply(self, image: Any) -> Any:
        return self.processor(self.prompt, self.processor.info.parse_mm_data({"image": [image]}))

    def cpu_ms(self, image: Any) -> float:
        started = time.process_time()
        self.apply(image)
        return (time.process_time() - started) * 1e3


async def _processed_ms(served: Served, publisher: Any, data: bytes) -> float:
    """CPU ms of a processed image's load (the READ, over NIXL from this
    process's publisher) and the processor's pass through the seam; the
    frontend's publish is not counted."""
    from pixelwire.signing import encode_reference
    from pixelwire.vllm.connector import PixelwireMediaConnector

    decoded = await publisher.decode_and_publish(data, layout="PATCHES", resize=served.layout)
    reference = encode_reference(decoded.to_dict(), SECRET)
    started = time.process_time()
    carrier = await PixelwireMediaConnector().fetch_image_async(reference)
    served.apply(carrier)
    return (time.process_time() - started) * 1e3


async def _measure(served: Served, inputs: dict[str, bytes], repeats: int) -> list[dict[str, Any]]:
    from PIL import Image

    import pixelwire

    rows = []
    async with pixelwire.Publisher(pool_bytes=1 << 30) as publisher:
        for name, data in inputs.items():
            loaded = Image.open(io.BytesIO(data)).convert("RGB")
            height, width = loaded.height, loaded.width
            steps = served.policy.steps(height, width)
            resized = Image.fromarray(pixelwire.decode_image(data, resize=steps, resize_kernel="torchvision"))
            timings: dict[str, list[float]] = {"loader": [], "resized": [], "processed": []}
            await _processed_ms(served, publisher, data)  # the first READ connects to the publisher
            for _ in range(repeats):
                timings["loader"].append(served.cpu_ms(loaded))
                timings["resized"].append(served.cpu_ms(resized))
                timings["processed"].append(await _processed_ms(served, publisher, data))
            medians = {path: statistics.median(values) for path, values in timings.items()}
            target = list(served.layout.target(height, width))
            rows.append({"budget": served.budget, "input": name, "size": [width, height], "target": target})
            rows[-1].update(medians)
            print(
                f"max_pixels {served.budget} {name}: loader {medians['loader']:.1f} ms, resized "
                f"{medians['resized']:.1f} ms, processed {medians['processed']:.2f} ms "
                f"({medians['loader'] / medians['processed']:.0f}x less than the loader's)"
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--photo", required=True)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    inputs = _inputs(args.photo)
    results: list[dict[str, Any]] = []
    for budget in BUDGETS:
        results.extend(asyncio.run(_measure(Served(args.model, budget), inputs, args.repeats)))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"results": results, "repeats": args.repeats, "load": os.getloadavg()}, out, indent=1)


if __name__ == "__main__":
    main()
