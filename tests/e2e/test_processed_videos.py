"""Processed videos, in process: a video pixelwire sampled and resized
(published by a frontend and read over NIXL, or decoded by the plug-in in
worker mode) handed to vLLM 0.32's own multimodal processor is exactly
what that processor makes of vLLM's own loader's frames:
``pixel_values_videos`` and ``video_grid_thw`` ``torch.equal``, the same
prompt token ids (Qwen3-VL's carry each frame group's timestamp, from the
loader's metadata; Qwen2.5-VL's ``second_per_grid_ts`` from it), and the
HF video processor never called for it. For the tiny Qwen2-VL (patch 14,
each frame resized alone), its files as a Qwen2.5-VL (vLLM's
``Qwen2_5_VLMultiModalProcessor``) and the tiny Qwen3-VL (patch 16, the
budget over the whole video), at the model's own small
budget (frames downsized) and at a budget that keeps them, with vLLM's
device normalisation on (uint8 rows) and off (float32 rows). Clips are
made here, with an odd frame count (the last temporal group filled with
the last frame).

A processed video beside one of vLLM's own loader in one request is
vLLM's own too. The comparison catches a wrong setting (the merge windows, the temporal
patch, the float values' rescale). And fail closed: where vLLM's processor
would not make those rows (here one of another budget), the frames go to
it as any video's, and the output is its own of them."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import pixelwire

import stack
import video_clips as clips_module

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

SECRET = "processed-videos-test"
PROCESSORS = {
    "qwen2-vl": "Qwen2VLVideoProcessor",
    # The tiny Qwen2-VL's files as a Qwen2.5-VL (processor level only:
    # its processor adds second_per_grid_ts).
    "qwen2.5-vl": "Qwen2VLVideoProcessor",
    "qwen3-vl": "Qwen3VLVideoProcessor",
}
# A video processor budget that keeps these clips' frames (both families'
# rounding aside): Qwen2-VL's per frame, Qwen3-VL's over the whole video.
KEEPING = {
    "qwen2-vl": {"shortest_edge": 3136, "longest_edge": 12845056},
    "qwen2.5-vl": {"shortest_edge": 3136, "longest_edge": 12845056},
    "qwen3-vl": {"shortest_edge": 4096, "longest_edge": 25165824},
}
# 2.5 s at 10 fps: the loaders keep an odd count of frames of some.
CLIPS = {
    "moving_160x120.mp4": ["-f", "lavfi", "-i", "testsrc2=size=160x120:rate=10", "-frames:v", "25"],
    "odd_202x118.mp4": ["-f", "lavfi", "-i", "mandelbrot=size=202x118:rate=10", "-frames:v", "23"],
}
for _args in CLIPS.values():
    _args += ["-c:v", "libx264", "-pix_fmt", "yuv420p"]
PROMPT = "<|vision_start|><|video_pad|><|vision_end|>What happens?"


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    return clips_module.make_all(CLIPS, tmp_path_factory.mktemp("processed_video_clips"))


@pytest.fixture(scope="module", params=list(PROCESSORS))
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _model_with(base: Path, folder: Path, *, config: Any = None, processor: Any = None) -> str:
    """The model in ``base`` with its ``config.json`` and processor config
    changed by ``config`` and ``processor`` (its other files linked, not
    copied)."""
    folder.mkdir(parents=True, exist_ok=True)
    changed = {"config.json": config, "processor_config.json": processor}
    for path in base.iterdir():
        change = changed.get(path.name)
        if change is None:
            (folder / path.name).symlink_to(path)
            continue
        settings = json.loads(path.read_text())
        change(settings)
        (folder / path.name).write_text(json.dumps(settings))
    return str(folder)


def _as_qwen2_5_vl(config: dict[str, Any]) -> None:
    config.update(model_type="qwen2_5_vl", architectures=["Qwen2_5_VLForConditionalGeneration"])
    config["text_config"]["model_type"] = "qwen2_5_vl_text"
    vision = config["vision_config"]
    vision.update(model_type="qwen2_5_vl", out_hidden_size=config["text_config"]["hidden_size"])
    vision.update(intermediate_size=128, fullatt_block_indexes=[0], window_size=112)


@pytest.fixture(scope="module")
def models(family: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The tiny model as built (its small budget: frames downsized) and
    with a budget that keeps the frames."""
    folder = tmp_path_factory.mktemp(f"processed_video_{family}")
    base = stack.model_dir("qwen2-vl" if family == "qwen2.5-vl" else family)
    if family == "qwen2.5-vl":

        def processor_class(settings: dict[str, Any]) -> None:
            settings["processor_class"] = "Qwen2_5_VLProcessor"

        base = Path(_model_with(base, folder / "base", config=_as_qwen2_5_vl, processor=processor_class))

    def keeping(settings: dict[str, Any]) -> None:
        settings["video_processor"]["size"] = KEEPING[family]

    yield {"downsizing": str(base), "keeping": _model_with(base, folder / "keeping", processor=keeping)}
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def served_as(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Makes this process a vLLM API server started with ``--model`` (and
    ``extra`` flags), with the pixelwire connector, a secret and the seam
    installed."""
    import pixelwire.vllm
    from pixelwire.vllm import processed_videos, video, worker_settings

    monkeypatch.setenv("PIXELWIRE_SECRET", SECRET)
    monkeypatch.setenv("VLLM_MEDIA_CONNECTOR", "pixelwire")

    def clear() -> None:
        # Every setting the plug-in keeps from the command line, images'
        # too: vLLM's own media tests later in the session serve no model.
        video.worker_video_resize_policy.cache_clear()
        processed_videos.worker_video_layout.cache_clear()
        worker_settings.worker_resize_policy.cache_clear()

    def serve(model: str, *extra: str) -> None:
        monkeypatch.setattr(sys, "argv", ["api_server.py", "--model", model, *extra])
        clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pixelwire.vllm.register()

    yield serve
    clear()


def _processor(model: str, on_device: bool) -> Any:
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        config = ModelConfig(model=model, mm_device_do_normalize=on_device)
        return MULTIMODAL_REGISTRY.create_processor(config)


def _video_processor_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that grows by a name each time an HF video processor runs."""
    import transformers

    calls: list[str] = []
    for name in PROCESSORS.values():
        cls = getattr(transformers, name)
        original = cls._preprocess

        def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(type(self).__name__)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "_preprocess", counted)
    return calls


def _url(data: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(data).decode()


async def _vllms_own(data: bytes, processor_name: str) -> Any:
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    return await MEDIA_CONNECTOR_REGISTRY.name2class["http"]().fetch_video_async(
        _url(data), video_processor=processor_name
    )


async def _ours(data: bytes, processor_name: str, where: str) -> Any:
    """The video as the plug-in's connector hands it to vLLM: read from a
    frontend's reference, or decoded in worker mode."""
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    from pixelwire.signing import encode_reference
    from pixelwire.video.sampling import VideoSampling
    from pixelwire.vllm.video import vllm_video_settings, worker_video_resize_policy

    connector = MEDIA_CONNECTOR_REGISTRY.name2class["pixelwire"]()
    if where == "worker":
        return await connector.fetch_video_async(_url(data), video_processor=processor_name)
    kwargs, loader = vllm_video_settings({}, processor_name)
    sampling = VideoSampling.from_video_kwargs(kwargs, loader)
    async with pixelwire.Publisher() as publisher:
        decoded = await publisher.decode_and_publish_video(
            data, sampling=sampling, resize=worker_video_resize_policy()
        )
        reference = encode_reference(decoded.to_dict(), SECRET.encode())
        return await connector.fetch_video_async(reference, video_processor=processor_name)


def _apply(processor: Any, videos: list[Any]) -> Any:
    tokenizer = processor.info.get_tokenizer()
    prompt = tokenizer.encode(PROMPT * len(videos))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return processor(prompt, processor.info.parse_mm_data({"video": videos}))


def _fields(out: Any, index: int) -> dict[str, Any]:
    item = out["mm_kwargs"]["video"][index]
    return {key: item[key].data for key in item if key != "video_embeds"}


def _differences(got: Any, expected: Any, count: int) -> list[str]:
    import torch

    wrong = []
    if got["prompt_token_ids"] != expected["prompt_token_ids"]:
        wrong.append("prompt token ids")
    for index in range(count):
        ours, theirs = _fields(got, index), _fields(expected, index)
        if set(ours) != set(theirs):
            wrong.append(f"video {index}: fields {sorted(ours)} != {sorted(theirs)}")
            continue
        for key, value in theirs.items():
            mine = ours[key]
            if not isinstance(value, torch.Tensor):
                same = type(mine) is type(value) and mine == value  # Qwen3-VL's timestamps: a list
            else:
                same = (
                    isinstance(mine, torch.Tensor) and mine.dtype == value.dtype and torch.equal(mine, value)
                )
            if not same:
                wrong.append(
                    f"video {index}: {key} {getattr(mine, 'shape', mine)} {getattr(mine, 'dtype', '')}"
                )
    return wrong


@pytest.mark.parametrize("budget", ["downsizing", "keeping"])
@pytest.mark.parametrize("normalised", ["on-device", "by-processor"])
def test_processed_videos_equal_vllms_processor_output(
    clips: dict[str, bytes],
    models: dict[str, str],
    family: str,
    budget: str,
    normalised: str,
    served_as: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each clip, alone and both in one request: the frontend's and worker
    mode's videos give vLLM's processor output on vLLM's own loader's video,
    torch.equal, with the same prompt token ids, and no HF video processor
    runs for them."""
    from pixelwire.vllm.processed_videos import ProcessedVideo

    on_device = normalised == "on-device"
    model = models[budget]
    served_as(model, *(() if on_device else ("--no-mm-device-do-normalize",)))
    processor = _processor(model, on_device)
    name = PROCESSORS[family]
    theirs = {clip: asyncio.run(_vllms_own(data, name)) for clip, data in clips.items()}
    calls = _video_processor_calls(monkeypatch)
    failures = []
    for where in ("frontend", "worker"):
        ours = {clip: asyncio.run(_ours(data, name, where)) for clip, data in clips.items()}
        for clip, video in ours.items():
            frames, full = video.media[0], theirs[clip].media[0]
            assert isinstance(frames, ProcessedVideo), (clip, where)
            assert video.media[1] == theirs[clip].media[1], (clip, where)
            # The budget does what it is named for: smaller frames, or the
            # loader's kept but for the rounding to the merge grid.
            if budget == "downsizing":
                assert frames.shape[1] * frames.shape[2] < full.shape[1] * full.shape[2] / 2, clip
            else:
                sides = zip(frames.shape[1:3], full.shape[1:3], strict=True)
                assert all(abs(a - b) <= 16 for a, b in sides), clip
        for chosen in [[clip] for clip in clips] + [list(clips)]:
            expected = _apply(processor, [theirs[clip] for clip in chosen])
            if family == "qwen2.5-vl":
                assert "second_per_grid_ts" in _fields(expected, 0), "compared too"
            calls.clear()
            got = _apply(processor, [ours[clip] for clip in chosen])
            if calls:
                failures.append(f"{chosen} ({where}): the HF video processor ran {calls}")
            failures += [f"{chosen} ({where}): {wrong}" for wrong in _differences(got, expected, len(chosen))]
    assert not failures, failures


# (what is wrong, the change): each gives rows of the right shape or the
# right values elsewhere, which the comparison above must tell apart.
WRONG = [
    ("merge size 1", {"merge_size": 1}),
    ("frames in one group each", {"temporal_patch_size": 1}),
    ("rescale 1/256", {"rescale": 1 / 256}),
]


@pytest.mark.parametrize(("wrong_name", "change"), WRONG, ids=[w[0] for w in WRONG])
def test_the_comparison_catches_a_wrong_setting(
    clips: dict[str, bytes], models: dict[str, str], family: str, served_as: Any, wrong_name: str, change: Any
) -> None:
    """Rows laid out with one setting wrong (the merge windows, the
    temporal patch, the rescale of the float values) are not vLLM's."""
    import dataclasses

    import torch

    from pixelwire.vllm.processed_videos import video_rows, worker_video_layout

    model = models["downsizing"]
    served_as(model, "--no-mm-device-do-normalize")
    processor = _processor(model, False)
    name = PROCESSORS[family]
    data = clips["moving_160x120.mp4"]
    want = _fields(_apply(processor, [asyncio.run(_vllms_own(data, name))]), 0)["pixel_values_videos"]
    frames = asyncio.run(_ours(data, name, "worker")).media[0]
    layout = worker_video_layout()
    assert layout is not None and layout.normalisation is not None
    ctx = processor.info.ctx
    assert torch.equal(video_rows(ctx, layout, frames)[0], want), "the right settings give vLLM's rows"
    if "rescale" in change:
        values = dataclasses.replace(layout.normalisation, rescale=change["rescale"])
        wrong = dataclasses.replace(layout, normalisation=values)
    else:
        wrong = dataclasses.replace(layout, **change)
    rows, _ = video_rows(ctx, wrong, frames)
    same = rows.shape == want.shape and torch.equal(rows, want)
    assert not same, wrong_name


def test_a_video_for_another_processor_goes_to_vllms_processor(
    clips: dict[str, bytes],
    models: dict[str, str],
    family: str,
    served_as: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fail closed: frames tagged for the model the plug-in serves, handed
    to a vLLM processor of another budget, are not laid out: the HF video
    processor runs on them, and the output is its own of those frames."""
    import numpy as np

    served_as(models["keeping"])
    name = PROCESSORS[family]
    data = clips["moving_160x120.mp4"]
    video = asyncio.run(_ours(data, name, "worker"))
    frames, metadata = video.media
    processor = _processor(models["downsizing"], True)
    plain = _apply(processor, [(np.array(frames), dict(metadata))])
    calls = _video_processor_calls(monkeypatch)
    got = _apply(processor, [video])
    assert calls, "the processor made the rows itself"
    assert not _differences(got, plain, 1)


def test_a_request_mixing_processed_and_other_videos_is_vllms_own(
    clips: dict[str, bytes],
    models: dict[str, str],
    family: str,
    served_as: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A processed video beside one of vLLM's own loader, either order:
    the processor runs for the other one alone, and every item and the
    prompt token ids are vLLM's own."""
    served_as(models["downsizing"])
    processor = _processor(models["downsizing"], True)
    name = PROCESSORS[family]
    first, second = clips
    theirs = [asyncio.run(_vllms_own(clips[clip], name)) for clip in (first, second)]
    ours = asyncio.run(_ours(clips[first], name, "frontend"))
    calls = _video_processor_calls(monkeypatch)
    _apply(processor, [theirs[1]])
    alone = len(calls)  # what vLLM's processing of the other video alone runs
    assert alone >= 1
    for videos, expected in (([ours, theirs[1]], theirs), ([theirs[1], ours], theirs[::-1])):
        calls.clear()
        got = _apply(processor, videos)
        assert len(calls) == alone, calls
        assert not _differences(got, _apply(processor, expected), 2)
