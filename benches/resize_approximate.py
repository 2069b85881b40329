#!/usr/bin/env python
"""What the approximate resize (``--resize-approximate``) changes for a
processor that resizes the original twice: LLaVA-OneVision
(``LlavaOnevisionImageProcessor``, anyres) resizes the original to the best
grid resolution, cuts it into 384-pixel tiles, and resizes the original
again to 384x384 for the base tile. The approximate policy ships the grid
resize, made exactly as the processor makes it, where that is smaller: the
tiles stay exact, but the base tile is then a resize of the resized image,
and the processor (and vLLM's prompt) sees the shipped size where it saw
the original's.

For each input it reports max |d| and mean |d| of ``pixel_values`` (base
tile and grid tiles, after rescale and normalise, as the model gets them),
whether the tile count changes, and the number of image tokens
LLaVA-OneVision's processor gives the prompt for the original's size and for
the shipped size (``LlavaOnevisionProcessor._get_number_of_features``, 729
tokens a tile as in llava-onevision-qwen2-0.5b, ``anyres_max_9``).

``--processor next`` asks the same of LLaVA-NeXT (llava-v1.6's settings:
336-pixel tiles, five grids of up to three tiles, the base tile a square
resize), for which pixelwire has no policy: what shipping its grid size,
wherever that is smaller, would change (no token count).

Run with the vLLM venv's python (transformers, torch), from the repository:

    PYTHONPATH=python VLLM_VENV/bin/python benches/resize_approximate.py [--processor next] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import types
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "pillow"
PHOTOS = ["exif_gps_typeerror.jpg", "iptc.jpg"]
# (width, height): landscape and portrait video-call and phone sizes, a
# square, VGA, an odd size, a 12 MP photo and 1440p.
SIZES = [
    (1920, 1080),
    (3840, 2160),
    (1080, 1920),
    (1000, 1000),
    (640, 480),
    (853, 480),
    (4000, 3000),
    (2560, 1440),
]
TOKENS_PER_TILE = 729
ASPECT = "anyres_max_9"


def _tokens(processor: Any, height: int, width: int) -> int:
    """The image tokens LLaVA-OneVision's processor puts in the prompt for
    an image of (height, width)."""
    from transformers.models.llava_onevision.processing_llava_onevision import LlavaOnevisionProcessor

    owner = types.SimpleNamespace(
        image_processor=processor, num_image_tokens=TOKENS_PER_TILE, vision_aspect_ratio=ASPECT
    )
    owner._get_unpadded_features = types.MethodType(LlavaOnevisionProcessor._get_unpadded_features, owner)
    side = processor.size.height
    return int(LlavaOnevisionProcessor._get_number_of_features(owner, height, width, side, side))


def _shipped(processor: Any, image: Any) -> Any:
    """The image ``--resize-approximate`` ships: pixelwire's approximate
    policy for this processor (``image_policy_from_config``, read from the processor's
    config and a checkpoint's SigLIP tower) gives the size, the processor's
    own resize makes the pixels (pixelwire's native resize gives the same
    bytes: tests/e2e/test_resize_parity.py); the original where the policy
    keeps it."""
    from transformers.image_utils import SizeDict

    from pixelwire.resize import image_policy_from_config

    side = processor.size.height
    policy = image_policy_from_config(
        json.loads(processor.to_json_string()),
        model_config={
            "vision_config": {"image_size": side, "patch_size": 14},
            "image_grid_pinpoints": processor.image_grid_pinpoints,
        },
        approximate=True,
    )
    assert policy is not None
    height, width = image.shape[-2:]
    target = policy.target(int(height), int(width))
    if target == (height, width):
        return image
    return processor.resize(image, SizeDict(height=target[0], width=target[1]), resample=processor.resample)


def _grid_size(processor: Any, image: Any) -> Any:
    """The what-if for a processor without a policy: the original resized to
    its grid resolution by the processor's own resize, wherever that is
    smaller; else the original."""
    from transformers.image_processing_utils import get_patch_output_size, select_best_resolution
    from transformers.image_utils import ChannelDimension, SizeDict

    height, width = image.shape[-2:]
    best = select_best_resolution((height, width), processor.image_grid_pinpoints)
    new_height, new_width = get_patch_output_size(image, best, ChannelDimension.FIRST)
    if new_height * new_width >= height * width:
        return image
    return processor.resize(image, SizeDict(height=new_height, width=new_width), resample=processor.resample)


def measure(which: str = "onevision") -> list[dict[str, Any]]:
    import numpy as np
    import torch
    from PIL import Image, ImageOps
    from transformers import LlavaNextImageProcessor, LlavaOnevisionImageProcessor

    if which == "next":
        side = 336
        grid = [[side, 2 * side], [2 * side, side], [2 * side, 2 * side], [3 * side, side], [side, 3 * side]]
        processor = LlavaNextImageProcessor(
            size={"shortest_edge": side}, crop_size={"height": side, "width": side}, image_grid_pinpoints=grid
        )
    else:
        processor = LlavaOnevisionImageProcessor()
    rows = []
    for name in PHOTOS:
        with Image.open(CORPUS / name) as photo:
            base = ImageOps.exif_transpose(photo).convert("RGB")
        for width, height in SIZES:
            fitted = np.asarray(ImageOps.fit(base, (width, height), Image.Resampling.LANCZOS))
            original = torch.from_numpy(fitted.copy()).permute(2, 0, 1).contiguous()
            shipped = _grid_size(processor, original) if which == "next" else _shipped(processor, original)
            exact = processor(original, return_tensors="pt")["pixel_values"][0]
            approx = processor(shipped, return_tensors="pt")["pixel_values"][0]
            row: dict[str, Any] = {
                "input": f"{name}@{width}x{height}",
                "shipped": list(shipped.shape[-2:]),
                "tiles": [int(exact.shape[0]), int(approx.shape[0])],
                "tokens": (
                    ["-", "-"]
                    if which == "next"
                    else [_tokens(processor, height, width), _tokens(processor, *shipped.shape[-2:])]
                ),
            }
            if exact.shape == approx.shape:
                d = (exact - approx).abs()
                row["base_max_d"] = float(d[0].max())
                row["base_mean_d"] = float(d[0].mean())
                row["tiles_max_d"] = float(d[1:].max())
                # pixel_values are normalised: the base tile's largest
                # difference in 8-bit steps of the channel it is in
                steps = d[0] * torch.tensor(processor.image_std).view(3, 1, 1) * 255
                row["base_max_d_8bit_steps"] = math.ceil(float(steps.max()) - 1e-3)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processor", choices=["onevision", "next"], default="onevision")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = measure(args.processor)
    print(
        "| input | shipped (h, w) | tiles exact / approx | tokens exact / approx | base tile max |d| "
        "(8-bit steps) | base tile mean |d| | grid tiles max |d| |"
    )
    print("| --- | --- | --- | --- | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['input']} | {row['shipped']} | {row['tiles'][0]} / {row['tiles'][1]} | "
            f"{row['tokens'][0]} / {row['tokens'][1]} | {row.get('base_max_d', float('nan')):.3f} "
            f"({row.get('base_max_d_8bit_steps', '-')}) | {row.get('base_mean_d', float('nan')):.4f} | "
            f"{row.get('tiles_max_d', float('nan')):.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
