"""Processed inputs, in process: what the frontend publishes for an image
(``layout="PATCHES"``), read by the plug-in's connector over NIXL and handed
to vLLM 0.32's own multimodal processor, is exactly what that processor
makes of vLLM's own loader's image: ``pixel_values`` and ``image_grid_thw``
``torch.equal``, the same prompt token ids, the same cache hashes across
repeats, and the HF processor never called for it. Over the resize corpus
(:mod:`resize_corpus`), for the tiny Qwen2-VL (``Qwen2VLMultiModalProcessor``,
patch 14), the tiny Qwen3-VL (``Qwen3VLMultiModalProcessor``, patch 16,
mean and std 0.5) and the tiny GLM-4.1V (``Glm4vMultiModalProcessor``,
patch 14, GLM's smart resize, whose budget counts the temporal patch), each
at its processor's default budget (12,845,056, 16,777,216 and 11,760,000
pixels, where most images keep their size) and at a downsizing one (over
the images it resizes otherwise: the rest take the default's path), with
vLLM's device normalisation on (uint8 rows) and off (the processor's
float32 normalised rows, bit for bit, made at the worker from rows that
travel as the image's bytes, so they fit the default pools), with vLLM's
processor cache off, processor-only and LRU. Each image's reference output
is made once and the frontend's and worker mode's compared with it. With
transformers' PIL backend no rows are made: the image takes the pixel path,
resized as Pillow resizes.

And fail closed: a processed image reaches vLLM only when vLLM's processor
would have made the same one; another setting is refused with the setting
named, never answered on other rows."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from PIL import Image
from resize_corpus import Case

import pixelwire
from pixelwire.processed import PatchLayout, patch_layout
from pixelwire.resize import image_resize_policy

import stack

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

DOWNSIZING_BUDGET = 1003520
# Each family's processor default (Qwen2-VL's, Qwen3-VL's: 1080p and 4K
# photos ship whole; Glm4vImageProcessor's class default, 28*28*15000,
# over two frames: 1080p photos ship whole).
DEFAULT_BUDGETS = {"qwen2-vl": 12845056, "qwen3-vl": 16777216, "glm4v": 11760000}
FAMILIES = list(DEFAULT_BUDGETS)
SECRET = "processed-inputs-test"
QWEN_PROMPT = "<|vision_start|><|image_pad|><|vision_end|>Describe it."
# vLLM's placeholder for GLM-4.1V's images (Glm4vForConditionalGeneration.get_placeholder_str).
GLM_PROMPT = "<|begin_of_image|><|image|><|end_of_image|>Describe it."


def _is_glm(model: str) -> bool:
    return "tiny-glm4v-" in model


def _kwargs(model: str, budget: int) -> dict[str, Any]:
    """--mm-processor-kwargs with the pixel budget ``budget``: Qwen's
    max_pixels; GLM's processor takes its budget from size alone (both
    edges: a call's size replaces the processor's)."""
    if _is_glm(model):
        return {"size": {"shortest_edge": 112 * 112, "longest_edge": budget}}
    return {"max_pixels": budget}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def model(family: str) -> str:
    return str(stack.model_dir(family))


@pytest.fixture
def served_as(monkeypatch: pytest.MonkeyPatch, model: str) -> Iterator[Any]:
    """Makes this process a vLLM API server started with ``--model`` and
    the given ``--mm-processor-kwargs`` (what the plug-in reads its settings
    from), with the pixelwire connector, a secret and the seam installed."""
    import pixelwire.vllm
    from pixelwire.vllm import worker_settings

    monkeypatch.setenv("PIXELWIRE_SECRET", SECRET)
    monkeypatch.setenv("VLLM_MEDIA_CONNECTOR", "pixelwire")

    def serve(kwargs: dict[str, Any], *extra: str) -> None:
        argv = ["api_server.py", "--model", model, "--mm-processor-kwargs", json.dumps(kwargs), *extra]
        monkeypatch.setattr(sys, "argv", argv)
        worker_settings.worker_resize_policy.cache_clear()
        with warnings.catch_warnings():
            # vLLM's model modules, imported by the seam, warn of torch's deprecations.
            warnings.simplefilter("ignore", DeprecationWarning)
            pixelwire.vllm.register()

    yield serve
    worker_settings.worker_resize_policy.cache_clear()


def _processor(model: str, kwargs: dict[str, Any], **settings: Any) -> Any:
    """vLLM's own multimodal processor for the tiny model."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        config = ModelConfig(model=model, mm_processor_kwargs=kwargs, **settings)
        return MULTIMODAL_REGISTRY.create_processor(config)


# Where the rows are normalised: on vLLM's device (uint8 rows), or by the
# processor (float32 rows: vLLM started with --no-mm-device-do-normalize).
NORMALISED = ["on-device", "by-processor"]


def _on_device(normalised: str) -> bool:
    return normalised == "on-device"


def _vllm_flags(normalised: str) -> tuple[str, ...]:
    return () if _on_device(normalised) else ("--no-mm-device-do-normalize",)


def _layout(model: str, budget: int, normalised: str = "on-device") -> PatchLayout:
    policy = image_resize_policy(model, _kwargs(model, budget))
    layout = patch_layout(model, _kwargs(model, budget), policy, device_normalize=_on_device(normalised))
    assert layout is not None
    return layout


async def _loaded_in_worker_mode(items: list[bytes]) -> list[Any]:
    """Each image as the plug-in's connector loads its ``data:`` URL itself
    (worker mode): decoded into the processor's patch rows natively."""
    from pixelwire.vllm.connector import PixelwireMediaConnector

    loaded = []
    for data in items:
        url = "data:application/octet-stream;base64," + base64.b64encode(data).decode()
        loaded.append(await PixelwireMediaConnector().fetch_image_async(url))
    return loaded


async def _published_and_read(
    items: list[bytes], layout: PatchLayout, publisher: pixelwire.Publisher | None = None
) -> list[Any]:
    """Each image published as the frontend publishes it (by ``publisher``,
    else by one opened for them), then loaded by the plug-in's connector
    from its signed reference."""
    from pixelwire.signing import encode_reference
    from pixelwire.vllm.connector import PixelwireMediaConnector

    if publisher is None:
        async with pixelwire.Publisher() as publisher:
            return await _published_and_read(items, layout, publisher)
    carriers = []
    for data in items:
        decoded = await publisher.decode_and_publish(data, layout="PATCHES", resize=layout)
        reference = encode_reference(decoded.to_dict(), SECRET.encode())
        carriers.append(await PixelwireMediaConnector().fetch_image_async(reference))
    return carriers


@contextlib.contextmanager
def _one_at_a_time(layout: PatchLayout) -> Iterator[Callable[[bytes, str], Any]]:
    """Loads one image at a time, as the frontend publishes it and the
    plug-in reads it (``"frontend"``) or as the plug-in loads it itself
    (``"worker"``), on one event loop with one publisher for all: a
    publisher per image would set up a NIXL agent, and the reader's
    connection to it, for each image."""
    with asyncio.Runner() as runner:
        publisher = pixelwire.Publisher().open()

        def load(data: bytes, where: str) -> Any:
            if where == "frontend":
                return runner.run(_published_and_read([data], layout, publisher))[0]
            return runner.run(_loaded_in_worker_mode([data]))[0]

        try:
            yield load
        finally:
            runner.run(publisher.close())


def _hf_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by the images of each call of the HF processor
    with images (every processor calls it through vLLM's context)."""
    from vllm.multimodal.processing.context import InputProcessingContext

    calls: list[int] = []
    original = InputProcessingContext.call_hf_processor

    def counted(self: Any, hf_processor: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        if data.get("images"):
            calls.append(len(data["images"]))
        return original(self, hf_processor, data, *args, **kwargs)

    monkeypatch.setattr(InputProcessingContext, "call_hf_processor", counted)
    return calls


def _prompt(processor: Any) -> str:
    return GLM_PROMPT if _is_glm(processor.info.ctx.model_config.model) else QWEN_PROMPT


def _apply(processor: Any, images: list[Any], cache: Any = None) -> Any:
    tokenizer = processor.info.get_tokenizer()
    prompt = tokenizer.encode(_prompt(processor) * len(images))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return processor(prompt, processor.info.parse_mm_data({"image": images}), cache=cache)


def _item(out: Any, index: int) -> tuple[Any, Any]:
    item = out["mm_kwargs"]["image"][index]
    return item["pixel_values"].data, item["image_grid_thw"].data


@pytest.mark.parametrize("budget", ["default", "downsizing"])
@pytest.mark.parametrize("normalised", NORMALISED)
def test_processed_images_equal_vllms_processor_output(
    resize_corpus: tuple[list[Case], dict[str, int]],
    served_as: Any,
    family: str,
    model: str,
    normalised: str,
    budget: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every corpus image (at the downsizing budget, every one it resizes
    otherwise): the rows and grid made at the frontend (read over
    NIXL, through the default pools) and by the plug-in itself (worker
    mode) are vLLM's processor output on vLLM's own loader's image (made
    once for both), torch.equal, with the same prompt token ids, and vLLM's
    HF processor is not called for them."""
    import torch

    cases, _ = resize_corpus
    pixels = DEFAULT_BUDGETS[family] if budget == "default" else DOWNSIZING_BUDGET
    served_as(_kwargs(model, pixels), *_vllm_flags(normalised))
    processor = _processor(model, _kwargs(model, pixels), mm_device_do_normalize=_on_device(normalised))
    layout = _layout(model, pixels, normalised)
    calls = _hf_calls(monkeypatch)
    failures: list[str] = []
    whole = 0
    # The processor's smart_resize raises for aspect ratios over 200: nothing to compare.
    sizes = [pixelwire.probe_image(case.data)["oriented_size"] for case in cases]
    kept = [(case, size) for case, size in zip(cases, sizes, strict=True) if max(size) / min(size) <= 200]
    if budget == "downsizing":
        # An image the downsizing budget gives the size the default budget
        # gives it is resized, laid out and normalised exactly as in the
        # default budget's cell (same target, same rows and grid; only the
        # budget the descriptor names differs, checked on every image
        # here): it is compared there. Here: every image this budget
        # resizes otherwise.
        default = _layout(model, DEFAULT_BUDGETS[family], normalised)
        kept = [(case, size) for case, size in kept if layout.target(*size) != default.target(*size)]
        photos = {case.name for case in cases if "@" in case.name}  # resize_corpus's 1080p and 4K photos
        assert photos and photos <= {case.name for case, _ in kept}, "every photo is downsized"
    cases = [case for case, _ in kept]

    with _one_at_a_time(layout) as load:
        for case in cases:
            height, width = pixelwire.probe_image(case.data)["oriented_size"]
            expected = _apply(processor, [case.image])
            want_rows, want_grid = _item(expected, 0)
            # Kept its size, but for the rounding to the merge grid.
            target, half = layout.target(height, width), layout.resize.factor // 2
            whole += abs(target[0] - height) <= half and abs(target[1] - width) <= half
            for where in ("frontend", "worker"):
                # One at a time: a carrier read from a frontend holds the reader's receive memory.
                carrier = load(case.data, where)
                calls.clear()
                got = _apply(processor, [carrier])
                rows, grid = _item(got, 0)
                if calls:
                    failures.append(f"{case.name} ({where}): the HF processor was called for {calls}")
                same = rows.dtype == want_rows.dtype and torch.equal(rows, want_rows)
                if not (torch.equal(grid, want_grid) and same):
                    failures.append(
                        f"{case.name} ({where}): rows {tuple(rows.shape)} {rows.dtype}, grid {grid.tolist()}"
                    )
                if got["prompt_token_ids"] != expected["prompt_token_ids"]:
                    failures.append(f"{case.name} ({where}): prompt token ids differ")
                del carrier, got, rows
            del expected, want_rows
    dtype = "uint8" if _on_device(normalised) else "float32"
    print(f"\n{family}, {dtype}, budget {pixels}: {len(cases)} images, {whole} kept their size (on the grid)")
    assert not failures, failures
    if budget == "default":
        assert whole > len(cases) // 2, "at the default budget most images keep their size"


def test_float_rows_of_photos_kept_whole_fit_the_default_pools(
    resize_corpus: tuple[list[Case], dict[str, int]], served_as: Any, family: str, model: str
) -> None:
    """Without device normalisation, at the default budget (GLM's: one that
    keeps 4K photos whole over its two frames), the largest corpus photos
    (kept whole) published and read at once through the
    default 256 MiB pools, as one request's images: the rows travel as the
    images' bytes (the descriptor's size is three bytes a pixel, where
    float32 would take twelve: more than the pools hold for them together),
    and the seam hands vLLM the processor's float rows, torch.equal."""
    import torch

    from pixelwire.caches.worker_images import reset_worker_image_cache

    cases, _ = resize_corpus
    frames = 2 if family == "glm4v" else 1
    budget = frames * DEFAULT_BUDGETS["qwen3-vl"] if family == "glm4v" else DEFAULT_BUDGETS[family]
    served_as(_kwargs(model, budget), "--no-mm-device-do-normalize")
    processor = _processor(model, _kwargs(model, budget), mm_device_do_normalize=False)
    layout = _layout(model, budget, "by-processor")
    by_size = sorted(cases, key=lambda case: -case.image.width * case.image.height)
    largest = [case for case in by_size if frames * case.image.width * case.image.height <= budget][:3]
    pixels = sum(case.image.width * case.image.height for case in largest)
    assert pixels * 12 > 256 << 20, "as float32 they would not fit the default pools together"
    reset_worker_image_cache()  # none of the rows an earlier test lent stays in the reader's pool
    carriers = asyncio.run(_published_and_read([case.data for case in largest], layout))
    for case, carrier in zip(largest, carriers, strict=True):
        target = layout.target(case.image.height, case.image.width)
        assert carrier.rows.dtype == np.uint8 and carrier.rows.nbytes == target[0] * target[1] * 3
    expected = _apply(processor, [case.image for case in largest])
    got = _apply(processor, carriers)
    assert got["prompt_token_ids"] == expected["prompt_token_ids"]
    for index in range(len(largest)):
        rows, grid = _item(got, index)
        want_rows, want_grid = _item(expected, index)
        assert rows.dtype == want_rows.dtype and torch.equal(rows, want_rows), largest[index].name
        assert torch.equal(grid, want_grid)


@pytest.mark.parametrize("cache_kind", ["none", "processor_only", "lru"])
@pytest.mark.parametrize("normalised", NORMALISED)
def test_a_request_mixing_processed_and_other_images_is_vllms_own(
    resize_corpus: tuple[list[Case], dict[str, int]],
    served_as: Any,
    model: str,
    cache_kind: str,
    normalised: str,
    family: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Several images in one request, processed and not, in any order, twice
    (the second time from vLLM's processor cache where it has one): every
    item, the prompt token ids and the cache hashes are those of vLLM's own
    images; the HF processor sees only the unprocessed ones, and none on a
    cache hit."""
    import torch
    from vllm.multimodal.cache import MultiModalProcessorOnlyCache
    from vllm.multimodal.cache.lru import LruKeyReplicatedSenderCache

    cases, _ = resize_corpus
    by_name = {case.name: case for case in cases}
    chosen = [by_name["exif_gps_typeerror@1920x1080.jpg"], by_name["hopper.png"], by_name["flower2.jpg"]]
    budget = DEFAULT_BUDGETS[family]
    served_as(_kwargs(model, budget), *_vllm_flags(normalised))
    processor = _processor(model, _kwargs(model, budget), mm_device_do_normalize=_on_device(normalised))
    config = processor.info.ctx.model_config
    cache = {
        "none": None,
        "processor_only": MultiModalProcessorOnlyCache(config),
        "lru": LruKeyReplicatedSenderCache(config),
    }[cache_kind]
    layout = _layout(model, budget, normalised)
    carriers = asyncio.run(_published_and_read([chosen[0].data, chosen[2].data], layout))
    mixed = [carriers[0], chosen[1].image, carriers[1]]
    expected = _apply(processor, [case.image for case in chosen])
    calls = _hf_calls(monkeypatch)
    hashes = []
    for round_ in range(2):
        calls.clear()
        got = _apply(processor, mixed, cache)
        assert got["prompt_token_ids"] == expected["prompt_token_ids"]
        for index in range(3):
            if got["mm_kwargs"]["image"][index] is None:
                # A sender cache's hit: the engine's side of the cache holds the item.
                assert cache_kind == "lru" and round_ == 1, (round_, index)
                continue
            rows, grid = _item(got, index)
            want_rows, want_grid = _item(expected, index)
            assert torch.equal(grid, want_grid) and torch.equal(rows, want_rows), (round_, index)
        hashes.append(got["mm_hashes"]["image"])
        assert calls == ([1] if cache is None or round_ == 0 else []), (round_, calls)
    assert hashes[0] == hashes[1], "a repeat keys vLLM's caches alike"
    assert len(set(hashes[0])) == 3


# A family whose patch is not the family's own.
OTHER_GRID = {"qwen2-vl": "qwen3-vl", "qwen3-vl": "qwen2-vl", "glm4v": "qwen3-vl"}


def test_a_processor_setting_unlike_the_frontends_is_refused(
    resize_corpus: tuple[list[Case], dict[str, int]], served_as: Any, family: str, model: str
) -> None:
    """Rows made for another budget or another model's grid (or with
    device normalisation off at vLLM, or a request's own
    mm_processor_kwargs) are refused with the setting named: the
    comparison would catch a wrong setting."""
    from pixelwire.vllm.connector import PixelwireMediaConnector  # noqa: F401 - registered below
    from pixelwire.vllm.processed_inputs import processed_image

    cases, _ = resize_corpus
    photo = next(case for case in cases if case.name == "exif_gps_typeerror@1920x1080.png")
    budget = DEFAULT_BUDGETS[family]
    served_as(_kwargs(model, budget))
    rows = _layout(model, budget).rows  # the family's name for its rows
    (carrier,) = asyncio.run(_published_and_read([photo.data], _layout(model, budget)))
    other_budget = _processor(model, _kwargs(model, DOWNSIZING_BUDGET))
    with pytest.raises(ValueError, match=rf"processed this image for .*max={budget}.*--no-processed-inputs"):
        _apply(other_budget, [carrier])
    # uint8 rows where vLLM's processor normalises (float32 rows), and the other way.
    not_on_device = _processor(model, _kwargs(model, budget), mm_device_do_normalize=False)
    with pytest.raises(ValueError, match=rf"for {rows}:uint8.*makes {rows}:float32"):
        _apply(not_on_device, [carrier])
    served_as(_kwargs(model, budget), "--no-mm-device-do-normalize")
    (floats,) = asyncio.run(_published_and_read([photo.data], _layout(model, budget, "by-processor")))
    served_as(_kwargs(model, budget))
    with pytest.raises(ValueError, match=rf"for {rows}:float32.*makes {rows}:uint8"):
        _apply(_processor(model, _kwargs(model, budget)), [floats])
    # Float rows of another mean (the processor's config or kwargs say otherwise).
    other_mean = {**_kwargs(model, budget), "image_mean": [0.5, 0.5, 0.25]}
    with pytest.raises(ValueError, match=r"for .*float32:torchvision:mean=.*but this vLLM's processor makes"):
        _apply(_processor(model, other_mean, mm_device_do_normalize=False), [floats])
    same = _processor(model, _kwargs(model, budget))
    tokenizer = same.info.get_tokenizer()
    with pytest.raises(ValueError, match="its own mm_processor_kwargs"):
        same(
            tokenizer.encode(_prompt(same)),
            same.info.parse_mm_data({"image": [carrier]}),
            hf_processor_mm_kwargs={"max_pixels": budget},
        )
    # Rows of another family's grid (patch 14 against 16) at the same
    # budget: refused by the connector, and by the seam if they got there.
    other = _layout(str(stack.model_dir(OTHER_GRID[family])), budget)
    refused = rf"processed this image for .*patch={other.patch_size}.*this vLLM takes"
    with pytest.raises(ValueError, match=refused):
        asyncio.run(_published_and_read([photo.data], other))
    grid = carrier.image_grid_thw[0].tolist()
    forged = processed_image(b"forged", carrier.rows, grid, other.identity, copies=carrier.copies)
    with pytest.raises(ValueError, match=rf"for .*patch={other.patch_size}.*but this vLLM's processor makes"):
        _apply(same, [forged])
    # The connector refuses rows made for another setting before any READ.
    served_as(_kwargs(model, DOWNSIZING_BUDGET))
    with pytest.raises(ValueError, match=rf"this vLLM takes {rows}.*max=1003520"):
        asyncio.run(_published_and_read([photo.data], _layout(model, budget)))
    served_as(_kwargs(model, budget), "--no-mm-device-do-normalize")
    with pytest.raises(ValueError, match=rf"this vLLM takes {rows}:float32:torchvision"):
        asyncio.run(_published_and_read([photo.data], _layout(model, budget)))
    served_as({**_kwargs(model, budget), "do_normalize": False}, "--no-mm-device-do-normalize")
    with pytest.raises(ValueError, match="this vLLM takes no processed inputs"):
        asyncio.run(_published_and_read([photo.data], _layout(model, budget)))


def test_only_the_covered_processors_get_a_patch_layout(model: str) -> None:
    """The PIL backend (use_fast false), a processor that does not
    normalise without vLLM's device normalisation, a request that does
    not resize, and another family's processor (Gemma 3's): no patch
    layout."""
    policy = image_resize_policy(model)
    assert patch_layout(model, {}, policy) is not None
    assert patch_layout(model, {"use_fast": False}, policy) is None
    assert patch_layout(model, {"use_fast": False}, policy, device_normalize=False) is None
    assert patch_layout(model, {"do_normalize": False}, policy, device_normalize=False) is None
    assert patch_layout(model, {}, None) is None
    gemma = str(stack.model_dir("gemma3"))
    assert patch_layout(gemma, {}, image_resize_policy(gemma)) is None


PIL_IMAGES = ["exif_gps_typeerror@1920x1080.jpg", "hopper.png", "flower2.jpg", "app13-multiple.jpg"]


def test_the_pil_backend_takes_pixels_resized_as_pillow_resizes(
    resize_corpus: tuple[list[Case], dict[str, int]], served_as: Any, family: str, model: str
) -> None:
    """vLLM's processor loaded with transformers' PIL backend (use_fast
    false): detected on both sides, no processed rows (its rows are floats
    of Pillow's resize, whatever the device normalisation), and the image
    takes today's path: resized as Pillow resizes, at the frontend (read
    over NIXL) and in worker mode, so vLLM's PIL processor output is its
    output on vLLM's own loader's image, torch.equal. The torchvision
    kernel's resize would not be (the comparison catches it), and uint8
    rows made for the torchvision backend are refused, the backend named."""
    import torch

    from pixelwire.signing import encode_reference
    from pixelwire.vllm.connector import PixelwireMediaConnector

    cases, _ = resize_corpus
    by_name = {case.name: case for case in cases}
    chosen = [by_name[name] for name in PIL_IMAGES]
    pil = {**_kwargs(model, DOWNSIZING_BUDGET), "use_fast": False}
    served_as(pil)
    processor = _processor(model, pil)
    assert type(processor.info.get_hf_processor().image_processor).__name__.endswith("ImageProcessorPil")
    policy = image_resize_policy(model, pil)
    assert policy is not None and policy.kernel == "pillow"
    assert patch_layout(model, pil, policy) is None
    assert patch_layout(model, pil, policy, device_normalize=False) is None

    async def frontend(data: bytes) -> Any:
        async with pixelwire.Publisher() as publisher:
            decoded = await publisher.decode_and_publish(data, resize=policy)
            return await PixelwireMediaConnector().fetch_image_async(
                encode_reference(decoded.to_dict(), SECRET.encode())
            )

    torchvision_differs = 0
    for case in chosen:
        expected = _item(_apply(processor, [case.image]), 0)
        for image in (asyncio.run(frontend(case.data)), *asyncio.run(_loaded_in_worker_mode([case.data]))):
            rows, grid = _item(_apply(processor, [image]), 0)
            assert torch.equal(grid, expected[1]) and torch.equal(rows, expected[0]), case.name
        target = policy.target(case.image.height, case.image.width)
        resized = pixelwire.decode_image(case.data, resize=target, resize_kernel="torchvision")
        rows, _ = _item(_apply(processor, [Image.fromarray(resized)]), 0)
        torchvision_differs += not torch.equal(rows, expected[0])
    assert torchvision_differs, "the torchvision kernel's resize would have been caught"
    served_as(_kwargs(model, DOWNSIZING_BUDGET))
    (carrier,) = asyncio.run(_published_and_read([chosen[0].data], _layout(model, DOWNSIZING_BUDGET)))
    with pytest.raises(ValueError, match=r"makes no rows pixelwire makes \(the PIL backend"):
        _apply(processor, [carrier])
