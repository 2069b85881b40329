"""Model-aware resize, end to end: for each image
processor family and setting, the processor's outputs on pixelwire's resized
image equal its outputs on vLLM's own loader's full image, exactly
(``torch.equal`` on every key).

Images: every corpus file both vLLM's loader and pixelwire decode (RGB), and
real corpus photos upscaled to 1080p and 4K (JPEG q90 and PNG, plus a JPEG
with EXIF orientation 6). Processors are built with transformers the way
vLLM gets them by default (the torchvision backend), plus the PIL backend
with pixelwire's Pillow kernel, or are vLLM's own where vLLM runs its own
(Kimi-K2.5's); each policy comes from the processor's own config
(``to_json_string``, as a ``preprocessor_config.json`` holds it; for vLLM's
own, the checkpoint's config it is built from) through
``pixelwire.resize.image_policy_from_config``.

The approximate policy (``--resize-approximate``: LLaVA-OneVision, whose
processor resizes the original twice) is held to its own promise: the same
tiles, exactly, and the same prompt tokens as vLLM counts them; only the
base tile differs, within a bound on photos.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from PIL import Image
from resize_corpus import Case

import pixelwire
from pixelwire.resize import ResizePolicy, image_policy_from_config

pytestmark = pytest.mark.vllm

QWEN_MIN_PIXELS = 56 * 56


@dataclass(frozen=True)
class Setting:
    id: str
    cls: str  # transformers class name (torchvision backend; "...Pil" for the PIL backend)
    kwargs: dict[str, Any] = field(hash=False)
    family: str
    # The processor's own settings (processor_config.json's top level)
    processor_config: dict[str, Any] = field(default_factory=dict, hash=False)
    # For a processor vLLM builds itself: the preprocessor_config.json it is built from.
    checkpoint_config: dict[str, Any] | None = field(default=None, hash=False)
    # The model's config.json, where the policy reads it (anyres)
    model_config: dict[str, Any] | None = field(default=None, hash=False)

    def policy(self) -> ResizePolicy | None:
        """The policy of this setting's processor config (as its
        preprocessor_config.json would hold it) and processor settings;
        approximate for the family that has only an approximate one."""
        config = self.checkpoint_config or json.loads(_processor(self).to_json_string())
        return image_policy_from_config(
            config,
            kernel=self.kernel,  # type: ignore[arg-type]
            processor_config=self.processor_config,
            model_config=self.model_config,
            approximate=self.family == "anyres",
        )

    @property
    def kernel(self) -> str:
        return "pillow" if self.cls.endswith("Pil") or self.family == "navit" else "torchvision"


def _qwen(max_pixels: int, backend: str = "") -> Setting:
    return Setting(
        f"qwen2vl-max{max_pixels}{'-pil' if backend else ''}",
        "Qwen2VLImageProcessor" + backend,
        {
            "size": {"shortest_edge": QWEN_MIN_PIXELS, "longest_edge": max_pixels},
            "patch_size": 14,
            "merge_size": 2,
        },
        "smart",
    )


def _siglip(side: int, resample: int, backend: str = "") -> Setting:
    name = {3: "bicubic", 2: "bilinear"}[resample]
    return Setting(
        f"siglip-{side}-{name}{'-pil' if backend else ''}",
        "SiglipImageProcessor" + backend,
        {"size": {"height": side, "width": side}, "resample": resample},
        "fixed",
    )


def _clip(edge: int, backend: str = "") -> Setting:
    return Setting(
        f"clip-{edge}{'-pil' if backend else ''}",
        "CLIPImageProcessor" + backend,
        {"size": {"shortest_edge": edge}, "crop_size": {"height": edge, "width": edge}},
        "shortest_edge",
    )


def _gemma3(side: int, backend: str = "") -> Setting:
    """Gemma 3 without pan-and-scan (its default): one bilinear resize to a
    square."""
    return Setting(
        f"gemma3-{side}{'-pil' if backend else ''}",
        "Gemma3ImageProcessor" + backend,
        {"size": {"height": side, "width": side}, "do_pan_and_scan": False},
        "fixed",
    )


def _siglip2(max_num_patches: int, backend: str = "") -> Setting:
    """SigLIP2 NaFlex: a resize to the largest patch grid of max_num_patches."""
    return Setting(
        f"siglip2-naflex-{max_num_patches}{'-pil' if backend else ''}",
        "Siglip2ImageProcessor" + backend,
        {"patch_size": 16, "max_num_patches": max_num_patches},
        "max_num_patches",
    )


def _glm4v(max_pixels: int, backend: str = "") -> Setting:
    """GLM-4.1V: GLM's smart_resize (its pixel budget counts the temporal patch)."""
    return Setting(
        f"glm4v-max{max_pixels}{'-pil' if backend else ''}",
        "Glm4vImageProcessor" + backend,
        {
            "size": {"shortest_edge": 112 * 112, "longest_edge": max_pixels},
            "patch_size": 14,
            "merge_size": 2,
            "temporal_patch_size": 2,
        },
        "smart",
    )


def _got_ocr2(side: int) -> Setting:
    """GOT-OCR2 without crop_to_patches (its default): one bicubic resize."""
    return Setting(
        f"got-ocr2-{side}",
        "GotOcr2ImageProcessor",
        {"size": {"height": side, "width": side}, "crop_to_patches": False},
        "fixed",
    )


def _pixtral(longest_edge: int, patch: int, merge: int, backend: str = "") -> Setting:
    """Pixtral (patch 16) and Mistral 3 (patch 14, spatial merge 2): the
    longest edge fitted, then the patch grid. vLLM calls the image processor
    through PixtralProcessor, which passes its own patch_size x
    spatial_merge_size as the image processor's patch_size; so does this."""
    grid = patch * merge
    return Setting(
        f"pixtral-{longest_edge}-patch{patch}x{merge}{'-pil' if backend else ''}",
        "PixtralImageProcessor" + backend,
        {"size": {"longest_edge": longest_edge}, "patch_size": {"height": grid, "width": grid}},
        "longest_edge",
        {"patch_size": patch, "spatial_merge_size": merge},
    )


def _idefics3(
    longest_edge: int, tile: int, backend: str = "", cls: str = "Idefics3", split: bool = True
) -> Setting:
    """Idefics3 and SmolVLM: the longest edge to ``longest_edge``, then (with
    splitting) that image to multiples of the tile side, both Lanczos."""
    return Setting(
        f"{cls.lower()}-{longest_edge}-tile{tile}{'' if split else '-nosplit'}{'-pil' if backend else ''}",
        f"{cls}ImageProcessor" + backend,
        {
            "size": {"longest_edge": longest_edge},
            "max_image_size": {"longest_edge": tile},
            "do_image_splitting": split,
        },
        "longest_edge_tiles",
    )


# vLLM's own image processors: class name -> module.
_VLLM_PROCESSORS = {"KimiK25FusedVisionProcessor": "vllm.transformers_utils.processors.kimi_k25_vision_fused"}


def _kimi_k25(patch_limit: int, side: int = 512) -> Setting:
    """Kimi-K2.5: vLLM's own fused processor (the one vLLM 0.32 runs for it,
    numba being installed), built from media_proc_cfg as the checkpoint's
    preprocessor_config.json holds it (16384 patches, 512 a side)."""
    media = {
        "patch_size": 14,
        "merge_kernel_size": 2,
        "in_patch_limit": patch_limit,
        "patch_limit_on_one_side": side,
        "fixed_output_tokens": None,
        "in_patch_limit_each_frame": 4096,
        "in_patch_limit_video": None,
        "temporal_merge_kernel_size": 4,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    checkpoint = {
        "auto_map": {"AutoImageProcessor": "kimi_k25_vision_processing.KimiK25VisionProcessor"},
        "media_proc_cfg": media,
    }
    return Setting(
        f"kimi-k25-{patch_limit}-side{side}",
        "vllm:KimiK25FusedVisionProcessor",
        {"media_proc_cfg": media},
        "navit",
        checkpoint_config=checkpoint,
    )


def _onevision(tile: int, most_tiles: int, backend: str = "") -> Setting:
    """LLaVA-OneVision: tiles of ``tile`` pixels on a grid of 1 to
    ``most_tiles`` a side (transformers' default: 384 and 6), and the
    config.json vLLM counts its tokens with (a SigLIP tower, patch 14)."""
    grid = [
        [tile * rows, tile * columns]
        for rows in range(1, most_tiles + 1)
        for columns in range(1, most_tiles + 1)
    ]
    return Setting(
        f"llava-onevision-{tile}x{most_tiles}{'-pil' if backend else ''}",
        "LlavaOnevisionImageProcessor" + backend,
        {"size": {"height": tile, "width": tile}, "image_grid_pinpoints": grid},
        "anyres",
        model_config={
            "vision_config": {"image_size": tile, "patch_size": 14},
            "image_grid_pinpoints": grid,
            "vision_aspect_ratio": "anyres_max_9",
        },
    )


SETTINGS = [
    _qwen(50176),
    _qwen(1003520),
    _qwen(12845056),
    _siglip(384, 3),
    _siglip(224, 2),  # bilinear: exercises the other filter
    _clip(336),
    _clip(224),
    # transformers' PIL backend, against pixelwire's Pillow kernel
    _qwen(50176, "Pil"),
    _qwen(1003520, "Pil"),
    _qwen(12845056, "Pil"),
    _siglip(384, 3, "Pil"),
    _siglip(224, 2, "Pil"),
    _clip(336, "Pil"),
    _clip(224, "Pil"),
    _gemma3(896),
    _gemma3(224),
    _gemma3(896, "Pil"),
    _siglip2(256),
    _siglip2(1024),
    _siglip2(256, "Pil"),
    _glm4v(100352),
    _glm4v(2007040),
    _glm4v(100352, "Pil"),
    _got_ocr2(384),
    _pixtral(1024, 16, 1),  # Pixtral-12B
    _pixtral(1540, 14, 2),  # Mistral Small 3.1
    _pixtral(1024, 16, 1, "Pil"),
    # Idefics3-8B, SmolVLM-Instruct; SmolVLM-256M/500M's 2048 on 512 tiles
    # passes too but costs 2 min per backend, too much for CI
    _idefics3(1456, 364),
    _idefics3(1536, 384, cls="SmolVLM"),
    _idefics3(1456, 364, split=False),
    _idefics3(728, 364, "Pil"),  # a smaller longest edge (2 tiles), for the slower PIL backend
    _kimi_k25(16384),  # Kimi-K2.5's own: 4K photos scaled down, 1080p ones left alone
    _kimi_k25(4096, 256),  # smaller budgets, where 1080p photos are scaled down too
]


@pytest.fixture(autouse=True)
def _quiet_transformers() -> Iterator[None]:
    """transformers logs "channel dimension is ambiguous" for 1x1 images."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    yield
    logging.set_verbosity(level)


def _processor(setting: Setting) -> Any:
    import importlib

    import transformers

    if setting.cls.startswith("vllm:"):
        name = setting.cls.removeprefix("vllm:")
        return getattr(importlib.import_module(_VLLM_PROCESSORS[name]), name)(**setting.kwargs)
    return getattr(transformers, setting.cls)(**setting.kwargs)


def _outputs(processor: Any, image: Image.Image) -> dict[str, Any]:
    if hasattr(processor, "media_tokens_calculator"):
        # Kimi-K2.5's: one media item a call, as vLLM hands it an image.
        return dict(processor.preprocess([{"type": "image", "image": image}], return_tensors="pt"))
    return dict(processor(images=[image], return_tensors="pt"))


def _compare(expected: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """Per-key differences; empty when every key is torch.equal."""
    import torch

    problems = []
    for key in sorted(set(expected) | set(got)):
        if key not in expected or key not in got:
            problems.append(f"{key}: only in {'pixelwire' if key in got else 'reference'}")
            continue
        a, b = expected[key], got[key]
        if torch.equal(a, b):
            continue
        if a.shape != b.shape:
            problems.append(f"{key}: shape {tuple(a.shape)} vs {tuple(b.shape)}")
        else:
            diff = (a.double() - b.double()).abs().max().item()
            problems.append(f"{key}: max|diff|={diff:g} ({int((a != b).sum())} of {a.numel()} differ)")
    return problems


def test_processor_configs_give_policies() -> None:
    """Every setting's config yields a policy of its family, kernel and
    filter (the parity test below depends on it)."""
    for setting in SETTINGS:
        processor = _processor(setting)
        policy = setting.policy()
        assert policy is not None, setting.id
        assert policy.family == setting.family and policy.kernel == setting.kernel, (setting, policy)
        # Kimi-K2.5's resizes with Pillow's bicubic, fixed (no resample setting).
        resample = int(getattr(processor, "resample", 3))
        assert policy.filter == {1: "lanczos", 2: "bilinear", 3: "bicubic"}[resample], (
            setting,
            policy,
        )


@pytest.mark.parametrize("setting", SETTINGS, ids=[s.id for s in SETTINGS])
def test_processor_outputs_equal_on_resized_images(
    resize_corpus: tuple[list[Case], dict[str, int]], setting: Setting
) -> None:
    cases, _ = resize_corpus
    processor = _processor(setting)
    policy = setting.policy()
    assert policy is not None and policy.family == setting.family, (setting, policy)

    started = time.monotonic()
    checked = equal = resized = 0
    skipped: dict[str, int] = {}
    failures: list[str] = []
    for case in cases:
        height, width = pixelwire.probe_image(case.data)["oriented_size"]
        if (width, height) != case.image.size:
            failures.append(f"{case.name}: oriented size {width}x{height}, vLLM's image {case.image.size}")
            continue
        if setting.family == "smart" and max(height, width) / min(height, width) > 200:
            # the processor's smart_resize raises for these; nothing to compare
            skipped["aspect>200"] = skipped.get("aspect>200", 0) + 1
            continue
        target = policy.target(height, width)
        pixels = pixelwire.decode_image(
            case.data,
            mode="RGB",
            resize=policy.steps(height, width),
            resize_kernel=policy.kernel,
            resize_filter=policy.filter,
        )
        checked += 1
        resized += target != (height, width)
        if pixels.shape != (*target, 3):
            failures.append(f"{case.name}: decoded {pixels.shape}, target {target}")
            continue
        expected = _outputs(processor, case.image)
        got = _outputs(processor, Image.fromarray(pixels))
        problems = _compare(expected, got)
        if problems:
            failures.append(
                f"{case.name}: {width}x{height} -> {target[1]}x{target[0]} "
                f"({policy.kernel}/{policy.filter}): " + "; ".join(problems)
            )
        else:
            equal += 1
    elapsed = time.monotonic() - started
    print(
        f"\n{setting.id} [{policy.identity}]: {checked} checked ({resized} resized), {equal} equal, "
        f"{len(failures)} not equal, skipped {skipped or 0}, {elapsed:.1f} s"
    )
    for failure in failures:
        print("  NOT EQUAL", failure)
    assert not failures, f"{len(failures)} of {checked} images differ; first: {failures[0]}"
    assert checked + sum(skipped.values()) == len(cases)


# The approximate policy's settings: LLaVA-OneVision's own, its PIL
# backend, and the tiny served model's 56-pixel tiles (every photo resized).
APPROXIMATE = [
    _onevision(384, 6),
    _onevision(384, 6, "Pil"),
    _onevision(56, 6),
]
# How far the base tile of a photo may move, in 8-bit steps of a pixel (max,
# and mean over the tile): the bound --resize-approximate promises for
# photos. Line art and text move further (a downscale of a downscale keeps
# less of a sharp edge than one downscale); the test prints how far.
PHOTO_BASE_TILE_MAX_STEPS = 4
PHOTO_BASE_TILE_MEAN_STEPS = 0.5


def _approximate_problems(processor: Any, policy: ResizePolicy, case: Case) -> tuple[list[str], float, float]:
    """How the processor's outputs on the approximately shipped image differ
    from its outputs on vLLM's full image beyond the base tile (other tiles,
    another tile count, another prompt token count as vLLM counts it), and
    the base tile's max and mean difference in 8-bit steps."""
    import torch

    with warnings.catch_warnings():
        # torch's mkldnn module, imported by vLLM's model code, warns of
        # torch.jit on import
        warnings.simplefilter("ignore", DeprecationWarning)
        from vllm.model_executor.models.llava_onevision import LlavaOnevisionProcessingInfo

    height, width = pixelwire.probe_image(case.data)["oriented_size"]
    target = policy.target(height, width)
    pixels = pixelwire.decode_image(
        case.data, mode="RGB", resize=policy.steps(height, width), resize_kernel=policy.kernel,
        resize_filter=policy.filter,
    )  # fmt: skip
    if pixels.shape != (*target, 3):
        return [f"decoded {pixels.shape}, target {target}"], 0.0, 0.0
    expected = _outputs(processor, case.image)
    got = _outputs(processor, Image.fromarray(pixels))
    if target == (height, width):
        return _compare(expected, got), 0.0, 0.0
    want, have = expected["pixel_values"][0], got["pixel_values"][0]
    if want.shape != have.shape:
        return [f"pixel_values shape {tuple(want.shape)} vs {tuple(have.shape)}"], 0.0, 0.0
    problems = [] if torch.equal(want[1:], have[1:]) else ["the grid tiles differ"]
    tiles = want.shape[0] - 1
    rows_columns = []
    for size in ((height, width), target):
        best = _best_resolution(policy, *size)
        rows, columns = best[0] // policy.height, best[1] // policy.width
        rows_columns.append(
            LlavaOnevisionProcessingInfo._get_num_unpadded_features(
                None,  # type: ignore[arg-type]  # it reads nothing of its instance
                original_height=size[0],
                original_width=size[1],
                npatches=policy.tile_patches,
                num_patch_height=rows,
                num_patch_width=columns,
            )
        )
    if rows_columns[0] != rows_columns[1]:
        problems.append(f"vLLM's unpadded features {rows_columns[0]} vs {rows_columns[1]} ({tiles} tiles)")
    std = torch.tensor(processor.image_std).view(3, 1, 1)
    steps = (want[0] - have[0]).abs() * std * 255
    return problems, float(steps.max()), float(steps.mean())


def _best_resolution(policy: ResizePolicy, height: int, width: int) -> tuple[int, int]:
    """transformers' own pick of the grid resolution for a (height, width) image."""
    from transformers.image_processing_utils import select_best_resolution

    best = select_best_resolution((height, width), [list(pair) for pair in policy.grid])
    return int(best[0]), int(best[1])


@pytest.mark.parametrize("setting", APPROXIMATE, ids=[s.id for s in APPROXIMATE])
def test_the_approximate_resize_changes_only_the_base_tile(
    resize_corpus: tuple[list[Case], dict[str, int]], setting: Setting
) -> None:
    """--resize-approximate for LLaVA-OneVision: on every corpus image, the
    processor's tiles are its own exactly and vLLM counts the same prompt
    tokens; the base tile (resized from the grid-size image, not the
    original) of a photo stays within PHOTO_BASE_TILE_MAX_STEPS /
    PHOTO_BASE_TILE_MEAN_STEPS, and every image's is printed; an image not
    shipped smaller gives every output exactly."""
    cases, _ = resize_corpus
    processor = _processor(setting)
    policy = setting.policy()
    assert policy is not None and policy.family == "anyres" and policy.approximate, policy
    failures: list[str] = []
    moved: dict[str, list[tuple[float, float]]] = {"photos": [], "other images": []}
    for case in cases:
        height, width = pixelwire.probe_image(case.data)["oriented_size"]
        problems, most, mean = _approximate_problems(processor, policy, case)
        photo = "@" in case.name
        if policy.target(height, width) != (height, width):
            moved["photos" if photo else "other images"].append((most, mean))
            if photo and (most > PHOTO_BASE_TILE_MAX_STEPS + 1e-3 or mean > PHOTO_BASE_TILE_MEAN_STEPS):
                problems.append(f"base tile max {most:.2f}, mean {mean:.3f} 8-bit steps")
        if problems:
            failures.append(f"{case.name} {width}x{height}: " + "; ".join(problems))
    print(f"\n{setting.id} [{policy.identity}]: {len(cases)} checked")
    for kind, steps in moved.items():
        if steps:
            print(
                f"  {kind}: {len(steps)} shipped smaller, base tile max {max(m for m, _ in steps):.2f} "
                f"8-bit steps, mean {max(m for _, m in steps):.3f} at most"
            )
    for failure in failures:
        print("  BEYOND", failure)
    assert moved["photos"], "no photo was shipped smaller: nothing approximate was checked"
    assert not failures, f"{len(failures)} images: first {failures[0]}"


def test_a_wrong_grid_changes_the_approximate_tiles(resize_corpus: tuple[list[Case], dict[str, int]]) -> None:
    """The approximate test can fail: a policy with another grid than the
    processor's gives other tiles on the 4K photos."""
    cases, _ = resize_corpus
    policy = _onevision(384, 4).policy()
    assert policy is not None
    processor = _processor(_onevision(384, 6))
    photos = [case for case in cases if "@3840x2160" in case.name and case.name.endswith(".png")]
    assert photos
    for case in photos:
        problems, _, _ = _approximate_problems(processor, policy, case)
        assert problems, f"{case.name}: a 4-tile grid's resize gave the 6-tile grid's outputs"


TILED = [s for s in SETTINGS if s.family == "longest_edge_tiles"]


@pytest.mark.parametrize("setting", TILED, ids=[s.id for s in TILED])
def test_idefics3_counts_the_shipped_images_tiles_as_the_originals(
    resize_corpus: tuple[list[Case], dict[str, int]], setting: Setting
) -> None:
    """vLLM counts an Idefics3 / SmolVLM image's tiles, and so its prompt's
    image tokens, from the image's size (``get_number_of_image_patches``),
    not from the processor's outputs: the shipped size must give the
    original's count."""
    cases, _ = resize_corpus
    processor = _processor(setting)
    policy = setting.policy()
    assert policy is not None
    failures = []
    for case in cases:
        height, width = pixelwire.probe_image(case.data)["oriented_size"]
        shipped = policy.target(height, width)
        original = processor.get_number_of_image_patches(height, width)
        if processor.get_number_of_image_patches(*shipped) != original:
            failures.append(f"{case.name}: {height}x{width} -> {shipped}")
    assert not failures, f"{len(failures)} differ; first: {failures[0]}"


# A policy from one setting, a processor run with another: (policy's
# setting, processor's setting). Each must make the parity test fail.
WRONG = [
    (_gemma3(224), _gemma3(896)),
    (_gemma3(896), Setting("gemma3-896-pan-and-scan", "Gemma3ImageProcessor", {
        "size": {"height": 896, "width": 896}, "do_pan_and_scan": True,
        "pan_and_scan_min_crop_size": 256, "pan_and_scan_max_num_crops": 4,
        "pan_and_scan_min_ratio_to_activate": 1.2}, "fixed")),
    (_siglip2(256), _siglip2(1024)),
    (_siglip2(256), _siglip2(256, "Pil")),  # the torchvision kernel for the PIL backend
    (_qwen(100352), _glm4v(100352)),  # Qwen's smart_resize for GLM's
    (_pixtral(1024, 16, 1), _pixtral(1540, 14, 2)),
    # the image processor's patch_size without the processor's spatial
    # merge, at a longest edge where the two grids part for 16:9 photos
    # (at 1540 both give 868x1540)
    (_pixtral(1000, 14, 1), _pixtral(1000, 14, 2)),
    (_pixtral(1024, 16, 1), _pixtral(1024, 16, 1, "Pil")),
    (_idefics3(1456, 364), _idefics3(1536, 384, cls="SmolVLM")),
    (_idefics3(1456, 364), _idefics3(1456, 364, split=False)),  # the tiles' resize without splitting
    (_idefics3(1456, 364), _idefics3(1456, 364, "Pil")),
    (_kimi_k25(4096, 256), _kimi_k25(16384)),
    # bicubic where the processor runs Lanczos
    (Setting("idefics3-1456-tile364-bicubic", "Idefics3ImageProcessor", {
        "size": {"longest_edge": 1456}, "max_image_size": {"longest_edge": 364}, "resample": 3},
        "longest_edge_tiles"), _idefics3(1456, 364)),
]  # fmt: skip


@pytest.mark.parametrize(("policy_of", "processor_of"), WRONG, ids=[f"{a.id}-for-{b.id}" for a, b in WRONG])
def test_a_wrong_setting_changes_the_outputs(
    resize_corpus: tuple[list[Case], dict[str, int]], policy_of: Setting, processor_of: Setting
) -> None:
    """The parity test can fail: a policy read from another setting (another
    size, patch budget or patch grid, pan-and-scan left out, another
    backend's kernel) gives other outputs on the 1080p and 4K photos."""
    cases, _ = resize_corpus
    policy = policy_of.policy()
    assert policy is not None
    processor = _processor(processor_of)
    photos = [case for case in cases if "@" in case.name and case.name.endswith(".png")]
    assert photos
    for case in photos:
        height, width = pixelwire.probe_image(case.data)["oriented_size"]
        pixels = pixelwire.decode_image(
            case.data, mode="RGB", resize=policy.steps(height, width), resize_kernel=policy.kernel,
            resize_filter=policy.filter,
        )  # fmt: skip
        problems = _compare(_outputs(processor, case.image), _outputs(processor, Image.fromarray(pixels)))
        assert problems, f"{case.name}: {policy_of.id}'s resize gave {processor_of.id}'s outputs"
