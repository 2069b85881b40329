"""What vLLM's API server spends in its multimodal processor on a video, in
process: vLLM 0.32's processor (``processor.apply``) on

- ``loader``: vLLM's own loader's frames (full size; decoding not counted);
- ``resized``: pixelwire's frames, resized for the model, as a plain array
  (what the processor got from the plug-in before processed videos);
- ``processed``: the same frames as the plug-in hands them (a processed
  video): the processor lays out their rows through the seam instead of
  running the HF video processor (the layout counted; the decode not).

for each ``--video`` and each ``--model`` (a Qwen2-VL family or Qwen3-VL
model folder: its video processor's budget is the one in its files). CPU
time of this process (``time.process_time``), the median of ``--repeats``
alternating runs, one torch thread as in vLLM's API server.

Run in vLLM's environment:

    python benches/processed_videos.py --model MODEL --video CLIP --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import time
import warnings
from typing import Any

SECRET = "processed-videos-bench"
PROMPT = "<|vision_start|><|video_pad|><|vision_end|>Describe it."


class Served:
    """vLLM's processor for ``model``, with the plug-in registered as its API server's."""

    def __init__(self, model: str) -> None:
        from vllm.config import ModelConfig
        from vllm.multimodal import MULTIMODAL_REGISTRY

        import pixelwire.vllm

        os.environ["PIXELWIRE_SECRET"] = SECRET
        os.environ["VLLM_MEDIA_CONNECTOR"] = "pixelwire"
        sys.argv = ["api_server.py", "--model", model]
        pixelwire.vllm.register()
        self.model = model
        self.processor = MULTIMODAL_REGISTRY.create_processor(ModelConfig(model=model))
        self.video_processor = type(self.processor.info.get_hf_processor().video_processor).__name__
        self.prompt = self.processor.info.get_tokenizer().encode(PROMPT)

    def cpu_ms(self, video: Any) -> float:
        started = time.process_time()
        self.processor(self.prompt, self.processor.info.parse_mm_data({"video": [video]}))
        return (time.process_time() - started) * 1e3


async def _videos(served: Served, data: bytes) -> dict[str, Any]:
    """vLLM's loader's video, and the plug-in's (worker mode) as a
    processed video and as plain frames."""
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY, MediaWithBytes

    from pixelwire.vllm.processed_videos import ProcessedVideo, worker_video_layout
    from pixelwire.vllm.video import worker_video_resize_policy

    worker_video_layout.cache_clear()
    worker_video_resize_policy.cache_clear()
    url = "data:video/mp4;base64," + base64.b64encode(data).decode()
    name, connectors = served.video_processor, MEDIA_CONNECTOR_REGISTRY.name2class
    theirs = await connectors["http"]().fetch_video_async(url, video_processor=name)
    ours = await connectors["pixelwire"]().fetch_video_async(url, video_processor=name)
    frames, metadata = ours.media
    assert isinstance(frames, ProcessedVideo), "the plug-in did not hand this video over processed"
    # A key of its own, so that no cache of vLLM's answers for the other.
    plain = MediaWithBytes((frames.view(type(theirs.media[0])).copy(), metadata), ours.original_bytes + b"-")
    return {"loader": theirs, "resized": plain, "processed": ours}


def _measure(served: Served, name: str, data: bytes, repeats: int) -> dict[str, Any]:
    videos = asyncio.run(_videos(served, data))
    timings: dict[str, list[float]] = {path: [] for path in videos}
    for video in videos.values():
        served.cpu_ms(video)  # warm up
    for _ in range(repeats):
        for path, video in videos.items():
            timings[path].append(served.cpu_ms(video))
    medians = {path: statistics.median(values) for path, values in timings.items()}
    shapes = {path: list(video.media[0].shape) for path, video in videos.items()}
    loader, resized, processed = (medians[path] for path in ("loader", "resized", "processed"))
    print(
        f"{os.path.basename(served.model)} {name}: frames {shapes['loader']} -> {shapes['processed']}; "
        f"loader {loader:.1f} ms, resized {resized:.1f} ms, processed {processed:.2f} ms "
        f"({loader / processed:.0f}x less than the loader's, "
        f"{resized / processed:.1f}x less than resized frames')"
    )
    return {"model": served.model, "video": name, "frames": shapes, **medians}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, action="append")
    parser.add_argument("--video", required=True, action="append")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    import torch

    torch.set_num_threads(1)
    results = []
    for model in args.model:
        served = Served(model)
        for path in args.video:
            with open(path, "rb") as clip:
                results.append(_measure(served, os.path.basename(path), clip.read(), args.repeats))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"results": results, "repeats": args.repeats, "load": os.getloadavg()}, out, indent=1)


if __name__ == "__main__":
    main()
