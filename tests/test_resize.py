"""The model-aware resize: policies read from processor configs, and the
native resize behind ``decode_image(resize=...)`` and ``Publisher``.

Bit-exactness against transformers' torchvision and PIL backends is checked
in the vLLM group (tests/e2e/test_resize_parity.py), where torch is."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from processor_configs import (
    GEMMA3,
    IDEFICS3,
    KIMI_K25,
    ONEVISION,
    ONEVISION_GRID,
    ONEVISION_MODEL,
    PIXTRAL,
    QWEN,
    QWEN3_VIDEO,
    SIGLIP2,
)

import pixelwire
from pixelwire.resize import (
    image_policy_from_config,
    image_resize_policy,
    video_policy_from_config,
    video_resize_policy,
)
from pixelwire.resize.families.max_num_patches import size_for_max_num_patches
from pixelwire.resize.families.smart import smart_resize, temporal_smart_resize
from pixelwire.video.sampling import model_video_loader


def _jpeg(width: int, height: int) -> bytes:
    gradient = np.linspace(0, 255, width * height * 3, dtype=np.float64).reshape(height, width, 3)
    out = io.BytesIO()
    Image.fromarray(gradient.astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def test_qwen_policy_reads_size_then_overrides_in_vllms_order() -> None:
    """size edges, then min/max_pixels; --mm-processor-kwargs size, then its
    min/max_pixels, as vLLM merges them."""
    config = {**QWEN, "size": {"shortest_edge": 3136, "longest_edge": 12544}}
    policy = image_policy_from_config(config)
    assert policy is not None and (policy.factor, policy.min_pixels, policy.max_pixels) == (28, 3136, 12544)
    assert image_policy_from_config({**config, "max_pixels": 50176}).max_pixels == 50176  # type: ignore[union-attr]
    overridden = image_policy_from_config(
        {**config, "max_pixels": 50176}, {"size": {"longest_edge": 1003520}}
    )
    assert overridden is not None and overridden.max_pixels == 1003520
    both = image_policy_from_config(config, {"size": {"longest_edge": 1}, "max_pixels": 12845056})
    assert both is not None and both.max_pixels == 12845056
    assert policy.identity != overridden.identity


def test_qwen_targets_follow_smart_resize() -> None:
    """The issue's example: a 3840x2160 photo at max_pixels=1003520 is
    resized to 1316x728 (2.9 MB of pixels instead of 24.9 MB)."""
    policy = image_policy_from_config({**QWEN, "size": {"shortest_edge": 3136, "longest_edge": 1003520}})
    assert policy is not None
    assert policy.target(2160, 3840) == (728, 1316)
    assert smart_resize(100, 100, 28, 56 * 56, 28 * 28 * 1280) == (112, 112)
    with pytest.raises(ValueError, match="aspect ratio"):
        policy.target(10, 2500)


def test_fixed_and_shortest_edge_policies() -> None:
    siglip = image_policy_from_config(
        {"image_processor_type": "SiglipImageProcessor", "size": {"height": 384, "width": 384}, "resample": 3}
    )
    assert siglip is not None and siglip.target(1080, 1920) == (384, 384)
    clip = image_policy_from_config(
        {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 336}, "resample": 3}
    )
    assert clip is not None
    assert clip.target(1080, 1920) == (336, int(336 * 1920 / 1080))
    assert clip.target(1920, 1080) == (int(336 * 1920 / 1080), 336)


def test_siglip2_naflex_resizes_by_its_patch_budget_not_a_size() -> None:
    """Siglip2ImageProcessor ignores ``size``: its target comes from
    max_num_patches (a size in the config or the kwargs must not make it a
    fixed-size policy), and a resized image is its own target."""
    for size in (None, {"height": 224, "width": 224}):
        config = {**SIGLIP2, "size": size}
        for kwargs in ({}, {"size": {"height": 384, "width": 384}}):
            policy = image_policy_from_config(config, kwargs)
            assert policy is not None and policy.family == "max_num_patches", (size, kwargs, policy)
            assert policy.filter == "bilinear" and policy.identity.startswith("max_num_patches:256:patch=16:")
    policy = image_policy_from_config(SIGLIP2, {"max_num_patches": 1024})
    assert policy is not None and policy.max_num_patches == 1024
    target = policy.target(1080, 1920)
    assert target == size_for_max_num_patches(1080, 1920, 16, 1024) == (384, 672)
    assert (target[0] // 16) * (target[1] // 16) <= 1024 and policy.target(*target) == target
    assert image_policy_from_config({**SIGLIP2, "max_num_patches": 0}) is None


def test_gemma3_is_a_fixed_size_without_pan_and_scan() -> None:
    """Gemma 3 resizes to its size; with pan-and-scan (config or kwargs) it
    resizes crops of the original too, so it gets no policy."""
    policy = image_policy_from_config({**GEMMA3, "do_pan_and_scan": None})
    assert policy is not None and policy.family == "fixed" and policy.target(1080, 1920) == (896, 896)
    assert policy.filter == "bilinear"
    assert image_policy_from_config({**GEMMA3, "do_pan_and_scan": True}) is None
    assert image_policy_from_config(GEMMA3, {"do_pan_and_scan": True}) is None


def test_got_ocr2_is_a_fixed_size_without_crop_to_patches() -> None:
    """GOT-OCR2 resizes to its size; with crop_to_patches (Aya Vision) it
    resizes the original to tiles and again to a thumbnail: no policy."""
    got = {"image_processor_type": "GotOcr2ImageProcessor", "size": {"height": 384, "width": 384}}
    policy = image_policy_from_config({**got, "crop_to_patches": False})
    assert policy is not None and policy.family == "fixed" and policy.target(1080, 1920) == (384, 384)
    assert image_policy_from_config({**got, "crop_to_patches": True}) is None


def test_glm4v_counts_the_temporal_patch_in_its_pixel_budget() -> None:
    """Glm4vImageProcessor: a smart resize of its own (another identity
    than Qwen's at the same sizes), from size only."""
    glm = {"image_processor_type": "Glm4vImageProcessor", "patch_size": 14, "merge_size": 2, "resample": 3}
    glm |= {"temporal_patch_size": 2, "size": {"shortest_edge": 12544, "longest_edge": 100352}}
    policy = image_policy_from_config(glm)
    qwen = image_policy_from_config({**QWEN, "size": glm["size"]})
    assert policy is not None and qwen is not None and policy.identity != qwen.identity
    assert policy.identity.startswith("smart:factor=28:min=12544:max=100352:temporal=2:")
    height, width = policy.target(1080, 1920)
    assert 2 * height * width <= 100352 < 2 * qwen.target(1080, 1920)[0] * qwen.target(1080, 1920)[1]
    overridden = image_policy_from_config(glm, {"size": {"longest_edge": 2007040}})
    assert overridden is not None and overridden.max_pixels == 2007040
    assert image_policy_from_config(glm, {"max_pixels": 2007040}) is None


def test_pixtral_fits_the_longest_edge_on_the_processors_patch_grid() -> None:
    """PixtralImageProcessor, as PixtralProcessor calls it: scaled down to
    the longest edge, sides rounded up to the processor's patch_size x
    spatial_merge_size (the image processor's own patch_size is not used);
    never scaled up beyond the grid."""
    mistral3 = {"patch_size": 14, "spatial_merge_size": 2}
    config = {**PIXTRAL, "patch_size": {"height": 14, "width": 14}}
    policy = image_policy_from_config(config, processor_config=mistral3)
    assert policy is not None and policy.family == "longest_edge" and policy.patch_size == 28
    assert policy.identity == "longest_edge:1540x1540:patch=28:torchvision:bicubic"
    assert policy.target(1080, 1920) == (868, 1540)  # 1080 / (1920 / 1540) = 866.25, up to 31 x 28
    assert policy.target(479, 853) == (504, 868)  # within the bound: only the grid
    assert policy.target(1, 5000) == (1, 5000)  # floors to 0 rows: the processor fails on it anyway
    default = image_policy_from_config(config)  # PixtralProcessor's defaults: 16, 1
    assert default is not None and default.patch_size == 16
    smaller = image_policy_from_config(config, {"size": {"longest_edge": 1024}}, processor_config=mistral3)
    assert smaller is not None and smaller.target(2160, 3840) == (588, 1036)
    assert image_policy_from_config(config, processor_config={"spatial_merge_size": 0}) is None


def test_a_size_the_processor_would_resize_again_is_not_shipped() -> None:
    """At an extreme aspect ratio GLM's smart_resize clamps a side to the
    factor and leaves the image over its budget, so the processor would
    resize the shipped image again: it ships at its own size instead."""
    size = {"shortest_edge": 3136, "longest_edge": 100352}
    policy = image_policy_from_config({"image_processor_type": "Glm4vImageProcessor", "size": size})
    assert policy is not None
    assert policy.processor_target(52, 5671) == (28, 2324)
    assert policy.processor_target(28, 2324) != (28, 2324)
    assert policy.target(52, 5671) == (52, 5671)


def test_kimi_k25_scales_down_to_its_patch_budget_with_pillows_bicubic() -> None:
    """Kimi-K2.5's checkpoint names its remote processor in auto_map, with
    media_proc_cfg; the policy is its navit resize (down only, to
    in_patch_limit patches and patch_limit_on_one_side a side, floored),
    with Pillow's bicubic whatever backend is asked for; vLLM hands the
    processor no --mm-processor-kwargs, so they change nothing. A size it
    would move again ships as it is."""
    policy = image_policy_from_config(KIMI_K25, {"in_patch_limit": 1}, kernel="torchvision")
    assert policy is not None and (policy.family, policy.kernel, policy.filter) == (
        "navit",
        "pillow",
        "bicubic",
    )
    assert policy.identity == "navit:16384:side=512:patch=14:pillow:bicubic"
    assert policy.target(2160, 3840) == (1345, 2392)  # vLLM's navit_resize_image gives 2392x1345
    assert policy.target(1080, 1920) == (1080, 1920)  # within the budget: left alone, never scaled up
    assert policy.target(100, 9000) == (79, 7168)  # 512 patches a side, the scale for both
    assert policy.processor_target(2460, 1319) == (2455, 1316)
    assert policy.processor_target(2455, 1316) != (2455, 1316)  # not its own target
    assert policy.target(2460, 1319) == (2460, 1319)
    for broken in ({**KIMI_K25, "media_proc_cfg": None}, {**KIMI_K25, "media_proc_cfg": {"patch_size": 14}}):
        assert image_policy_from_config(broken) is None


def test_idefics3_resizes_the_longest_edge_then_to_whole_tiles() -> None:
    """Idefics3 / SmolVLM: the longest edge to size.longest_edge (the other
    side truncated, then up to even), then to multiples of the tile side;
    the native decoder goes through the first size to the second, and ships
    the second. Lanczos is the processor's default resample."""
    policy = image_policy_from_config(IDEFICS3)
    assert policy is not None and policy.family == "longest_edge_tiles" and policy.filter == "lanczos"
    assert policy.identity == "longest_edge_tiles:1456:tile=364:torchvision:lanczos"
    # 1456 / (1920 / 1080) = 819, up to even; then 820 up to 3 tiles
    assert policy.steps(1080, 1920) == [(820, 1456), (1092, 1456)]
    assert policy.target(1080, 1920) == (1092, 1456)
    assert policy.steps(1920, 1080) == [(1456, 820), (1456, 1092)]
    # scaled up, already on the tile grid: one resize
    assert policy.steps(50, 100) == [(728, 1456)]
    # a shipped image is one the processor leaves as it is
    assert policy.steps(1092, 1456) == [(1092, 1456)]
    smolvlm = image_policy_from_config(
        {**IDEFICS3, "image_processor_type": "SmolVLMImageProcessorFast"},
        {"size": {"longest_edge": 2048}, "max_image_size": {"longest_edge": 512}},
    )
    assert smolvlm is not None and smolvlm.target(2160, 3840) == (1536, 2048)


def test_idefics3_without_splitting_ships_the_first_resize() -> None:
    """Without splitting the processor squares its first result to the tile
    side, which it would do again from a square: the first result ships."""
    policy = image_policy_from_config(IDEFICS3, {"do_image_splitting": False})
    assert policy is not None and policy.tile == 0
    assert policy.steps(1080, 1920) == [(820, 1456)]


def test_idefics3_ships_full_size_where_its_resizes_are_not_idempotent() -> None:
    """A longest edge off the tile grid: the second resize's longest edge
    (1092) is not the first's (1000), so the processor would resize the
    shipped image again; the image ships as it is."""
    policy = image_policy_from_config(IDEFICS3, {"size": {"longest_edge": 1000}})
    assert policy is not None
    assert policy.processor_target(1080, 1920) == (728, 1092)
    assert policy.steps(1080, 1920) == [(1080, 1920)]


# LLaVA-OneVision's processor (transformers 5.19's defaults) and the
# config.json parts vLLM counts its image tokens with.


def test_anyres_gets_a_policy_only_when_approximate(caplog: pytest.LogCaptureFixture) -> None:
    """LLaVA-OneVision resizes the original twice (grid and base tile): no
    exact policy, a log line naming --resize-approximate; asked for, the
    approximate policy, its identity saying so."""
    caplog.set_level(logging.INFO, "pixelwire.resize")
    assert image_policy_from_config(ONEVISION, model_config=ONEVISION_MODEL) is None
    assert "--resize-approximate" in caplog.text
    policy = image_policy_from_config(ONEVISION, model_config=ONEVISION_MODEL, approximate=True)
    assert policy is not None and (policy.family, policy.kernel, policy.filter) == (
        "anyres",
        "torchvision",
        "bicubic",
    )
    assert policy.approximate and policy.tile_patches == 27 and len(policy.grid) == 36
    assert policy.identity.startswith("anyres:384x384:grid=") and policy.identity.endswith(
        ":patches=27:torchvision:bicubic:approximate"
    )
    other = image_policy_from_config(
        ONEVISION,
        {"image_grid_pinpoints": ONEVISION_GRID[:6]},
        model_config={**ONEVISION_MODEL, "image_grid_pinpoints": ONEVISION_GRID[:6]},
        approximate=True,
    )
    assert other is not None and other.identity != policy.identity  # the grid is part of the identity


def test_anyres_ships_the_grid_size_where_it_is_smaller_and_keeps_the_prompt() -> None:
    """The grid-size image ships where it is smaller than the original, each
    side at least twice the base tile's, and the processor would pick the
    same grid for it; a larger grid size ships the original (exact); so does
    a size whose feature grid, which vLLM counts the prompt's image tokens
    from, would change."""
    policy = image_policy_from_config(ONEVISION, model_config=ONEVISION_MODEL, approximate=True)
    assert policy is not None
    assert policy.target(2160, 3840) == (1296, 2304)
    assert policy.target(3000, 4000) == (1728, 2304)
    assert policy.target(4000, 3000) == (2304, 1728)
    assert policy.target(1296, 2304) == (1296, 2304)  # a shipped image is its own target
    assert policy.processor_target(1000, 1000) == (1152, 1152)
    assert policy.target(1000, 1000) == (1000, 1000)  # scaled up by the processor: nothing to save
    # a side under twice the base tile's: the base tile would be a resize by little more than 1
    assert policy.processor_target(2707, 300) == (2304, 256)
    assert policy.target(2707, 300) == (2707, 300)
    # 2596x929 fits 2304x825 in its grid, but vLLM's feature grid for that
    # is 134x48 against the original's 136x48: other prompt tokens
    assert policy.processor_target(2596, 929) == (2304, 825)
    assert policy.target(2596, 929) == (2596, 929)
    assert policy.target(2596, 1000) == (2304, 888)


def test_llava_next_gets_no_approximate_policy() -> None:
    """LLaVA-NeXT's grid sizes are too close to its base tile (its base
    tile would move by up to 15 steps on photos): not even approximately."""
    grid = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
    config = {
        "image_processor_type": "LlavaNextImageProcessor",
        "size": {"shortest_edge": 336},
        "crop_size": {"height": 336, "width": 336},
        "image_grid_pinpoints": grid,
    }
    model = {"vision_config": {"image_size": 336, "patch_size": 14}, "image_grid_pinpoints": grid}
    assert image_policy_from_config(config, model_config=model, approximate=True) is None


def test_anyres_needs_the_checkpoint_vllm_counts_tokens_with(caplog: pytest.LogCaptureFixture) -> None:
    """Without the vision tower's sizes, with config.json's grid not the
    processor's, another vision_aspect_ratio than vLLM's fixed one, or a
    tile that is not square: no policy, and a log line why."""
    caplog.set_level(logging.INFO, "pixelwire.resize")
    broken_models = [
        {},
        {**ONEVISION_MODEL, "image_grid_pinpoints": ONEVISION_GRID[:6]},
        {**ONEVISION_MODEL, "vision_aspect_ratio": "anyres_max_4"},
        {**ONEVISION_MODEL, "vision_config": {"image_size": 336, "patch_size": 14}},
    ]
    for model in broken_models:
        assert image_policy_from_config(ONEVISION, model_config=model, approximate=True) is None
    for config in (
        {**ONEVISION, "size": {"height": 384, "width": 768}},
        {**ONEVISION, "image_grid_pinpoints": [[384, 0]]},
        {**ONEVISION, "image_grid_pinpoints": "384x384"},
    ):
        assert image_policy_from_config(config, model_config=ONEVISION_MODEL, approximate=True) is None
    assert len([r for r in caplog.records if "no model-aware resize" in r.message]) == 7


def test_lanczos_is_taken_only_where_parity_tests_run_it() -> None:
    """Lanczos (resample 1) gives a policy for Idefics3 / SmolVLM only."""
    siglip = {"image_processor_type": "SiglipImageProcessor", "size": {"height": 384, "width": 384}}
    assert image_policy_from_config({**siglip, "resample": 1}) is None
    assert image_policy_from_config({**IDEFICS3, "resample": 3}).filter == "bicubic"  # type: ignore[union-attr]
    assert image_policy_from_config({**IDEFICS3, "size": {"height": 364, "width": 364}}) is None


def test_the_pil_backend_resizes_with_pillow_where_it_is_reproduced() -> None:
    """vLLM's --mm-processor-kwargs ``backend`` "pil" (or the deprecated
    ``use_fast`` false) loads transformers' PIL backend, which resizes with
    Pillow: Qwen2-VL's policy then names the pillow kernel (its identity
    too, so a frontend and a worker disagreeing on the backend do not
    match); a processor whose PIL backend is not reproduced, or another
    backend, gets no policy."""
    qwen = {**QWEN, "size": {"shortest_edge": 3136, "longest_edge": 12544}}
    torchvision = image_policy_from_config(qwen)
    assert torchvision is not None and torchvision.kernel == "torchvision"
    for pil in ({"use_fast": False}, {"backend": "pil"}, {"backend": "pil", "use_fast": True}):
        policy = image_policy_from_config(qwen, pil)
        assert policy is not None and policy.kernel == "pillow", pil
        assert policy.identity == torchvision.identity.replace(":torchvision:", ":pillow:")
    for fast in ({"use_fast": True}, {"backend": "torchvision", "use_fast": False}):
        assert image_policy_from_config(qwen, fast) == torchvision, fast
    assert image_policy_from_config(qwen, {"backend": "cuda"}) is None
    gemma3 = image_policy_from_config(GEMMA3, {"use_fast": False})
    assert gemma3 is not None and gemma3.kernel == "pillow"
    got_ocr2 = {"image_processor_type": "GotOcr2ImageProcessor", "size": {"height": 384, "width": 384}}
    assert image_policy_from_config(got_ocr2) is not None
    assert image_policy_from_config(got_ocr2, {"use_fast": False}) is None


def test_unknown_or_unreproducible_processors_get_no_policy(caplog: pytest.LogCaptureFixture) -> None:
    """No policy means today's behaviour (full resolution), with a log line why."""
    caplog.set_level(logging.INFO, "pixelwire.resize")
    for config in (
        {"image_processor_type": "LlavaNextImageProcessor", "size": {"shortest_edge": 336}},
        {**QWEN, "size": {"shortest_edge": 3136, "longest_edge": 12544}, "do_resize": False},
        {**QWEN, "size": {"shortest_edge": 3136, "longest_edge": 12544}, "resample": 1},
        {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 336, "longest_edge": 600}},
    ):
        assert image_policy_from_config(config) is None
    assert len([r for r in caplog.records if "no model-aware resize" in r.message]) == 4


def test_policies_come_from_a_model_folder(tmp_path: Path) -> None:
    """preprocessor_config.json, or the image_processor part of
    processor_config.json (transformers 5's layout)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "preprocessor_config.json").write_text(
        json.dumps({**QWEN, "size": {"shortest_edge": 3136, "longest_edge": 12544}})
    )
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "processor_config.json").write_text(
        json.dumps({"image_processor": {**QWEN, "size": {"shortest_edge": 3136, "longest_edge": 50176}}})
    )
    a = image_resize_policy(tmp_path / "a")
    b = image_resize_policy(tmp_path / "b", {"max_pixels": 1003520})
    assert a is not None and a.max_pixels == 12544
    assert b is not None and b.max_pixels == 1003520
    (tmp_path / "pixtral").mkdir()
    (tmp_path / "pixtral" / "preprocessor_config.json").write_text(json.dumps(PIXTRAL))
    (tmp_path / "pixtral" / "processor_config.json").write_text(
        json.dumps({"processor_class": "PixtralProcessor", "patch_size": 14, "spatial_merge_size": 2})
    )
    pixtral = image_resize_policy(tmp_path / "pixtral")
    assert pixtral is not None and pixtral.patch_size == 28
    (tmp_path / "onevision").mkdir()
    (tmp_path / "onevision" / "preprocessor_config.json").write_text(json.dumps(ONEVISION))
    (tmp_path / "onevision" / "config.json").write_text(json.dumps(ONEVISION_MODEL))
    assert image_resize_policy(tmp_path / "onevision") is None
    onevision = image_resize_policy(tmp_path / "onevision", approximate=True)
    assert onevision is not None and onevision.tile_patches == 27
    (tmp_path / "c").mkdir()
    with pytest.raises(FileNotFoundError):
        image_resize_policy(tmp_path / "c")


def test_decode_image_resizes_to_the_size_asked_for() -> None:
    data = _jpeg(640, 480)
    full = pixelwire.decode_image(data)
    same = pixelwire.decode_image(data, resize=(480, 640))
    np.testing.assert_array_equal(same, full)
    for kernel in ("torchvision", "pillow"):
        small = pixelwire.decode_image(data, resize=(84, 112), resize_kernel=kernel)  # type: ignore[arg-type]
        assert small.shape == (84, 112, 3)
    # Pillow's arithmetic is the PIL backend's: compare with Pillow itself.
    pillow = np.asarray(Image.fromarray(full).resize((112, 84), Image.Resampling.BICUBIC))
    np.testing.assert_array_equal(
        pixelwire.decode_image(data, resize=(84, 112), resize_kernel="pillow"), pillow
    )
    with pytest.raises(ValueError, match="kernel"):
        pixelwire.decode_image(data, resize=(84, 112), resize_kernel="lanczos")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        pixelwire.decode_image(data, resize=(0, 112))


def test_a_resize_chain_resizes_through_its_first_size() -> None:
    """``resize=[via, size]`` gives what resizing to ``via`` and then that
    image to ``size`` gives, for both kernels and every filter; a chain of
    one is a plain resize; a longer chain, or an intermediate larger than
    both ends (an allocation no caller needs), is refused."""
    data = _jpeg(640, 480)
    for kernel in ("torchvision", "pillow"):
        for filter_ in ("bicubic", "bilinear", "lanczos"):
            options = {"resize_kernel": kernel, "resize_filter": filter_}
            first = pixelwire.decode_image(data, resize=(150, 200), **options)  # type: ignore[arg-type]
            png = io.BytesIO()
            Image.fromarray(first).save(png, "PNG")
            expected = pixelwire.decode_image(png.getvalue(), resize=(364, 364), **options)  # type: ignore[arg-type]
            chained = pixelwire.decode_image(data, resize=[(150, 200), (364, 364)], **options)  # type: ignore[arg-type]
            np.testing.assert_array_equal(chained, expected)
            direct = pixelwire.decode_image(data, resize=(364, 364), **options)  # type: ignore[arg-type]
            assert not np.array_equal(chained, direct)
    np.testing.assert_array_equal(
        pixelwire.decode_image(data, resize=[(84, 112)]), pixelwire.decode_image(data, resize=(84, 112))
    )
    with pytest.raises(ValueError, match="one or two sizes"):
        pixelwire.decode_image(data, resize=[(84, 112), (84, 112), (84, 112)])
    with pytest.raises(ValueError, match="larger than both"):
        pixelwire.decode_image(data, resize=[(4800, 6400), (84, 112)])
    with pytest.raises(ValueError, match="positive"):
        pixelwire.decode_image(data, resize=[(0, 112), (84, 112)])


def test_lanczos_is_pillows() -> None:
    """The Pillow kernel's Lanczos is Pillow's (down and up); the
    torchvision kernel's is checked against torch in the vLLM group."""
    data = _jpeg(641, 479)
    full = pixelwire.decode_image(data)
    for size in ((84, 112), (479, 1000), (900, 300)):
        pillow = np.asarray(Image.fromarray(full).resize(size[::-1], Image.Resampling.LANCZOS))
        np.testing.assert_array_equal(
            pixelwire.decode_image(data, resize=size, resize_kernel="pillow", resize_filter="lanczos"), pillow
        )


def test_publisher_ships_the_target_size_and_records_the_policy() -> None:
    try:
        pixelwire.transfer.nixl_library_path()
    except pixelwire.TransferError as missing:  # pragma: no cover - CI installs it
        pytest.skip(f"NIXL runtime not installed: {missing}")
    data = _jpeg(1920, 1080)
    policy = image_policy_from_config({**QWEN, "size": {"shortest_edge": 3136, "longest_edge": 50176}})
    assert policy is not None

    async def main() -> pixelwire.Decoded:
        async with pixelwire.Publisher() as publisher:
            decoded = await publisher.decode_and_publish(data, resize=policy, layout="RGBX")
            assert isinstance(decoded, pixelwire.Decoded)
            publisher.release(decoded)
            return decoded

    decoded = asyncio.run(main())
    height, width = policy.target(1080, 1920)
    assert decoded.shape == (height, width, 3) and decoded.size == height * width * 4
    assert decoded.to_dict()["pixelwire"]["resize"] == {"policy": policy.identity, "source": [1080, 1920]}


def test_temporal_smart_resize_counts_the_frames_in_its_budget() -> None:
    """Qwen3-VL's video smart_resize (factor 32, Qwen3VLVideoProcessor's
    default budget 131072..786432 pixels over all frames): known values,
    worked by hand from transformers 5.19's arithmetic. A 1080p video gets
    smaller frames the more frames it has; a tiny one is scaled up; fewer
    frames than the temporal patch is the processor's error."""
    low, high = 128 * 32 * 32, 32 * 32 * 768
    assert temporal_smart_resize(4, 240, 320, 32, 2, low, high) == (256, 320)  # within the budget
    # beta = sqrt(4 * 1080 * 1920 / 786432) = 3.2476: 1080 / beta / 32 = 10.39, 1920 / beta / 32 = 18.47
    assert temporal_smart_resize(4, 1080, 1920, 32, 2, low, high) == (320, 576)
    # beta = sqrt(32 * 1080 * 1920 / 786432) = 9.1856: 3.67 and 6.53 factors
    assert temporal_smart_resize(32, 1080, 1920, 32, 2, low, high) == (96, 192)
    # Five frames count as four in the rounding (t_bar), as five in beta:
    # sqrt(5 * 480 * 853 / 786432) = 1.6134 gives 9.30 and 16.52 factors, four frames 10.39 and 18.47.
    assert temporal_smart_resize(5, 480, 853, 32, 2, low, high) == (288, 512)
    assert temporal_smart_resize(4, 480, 853, 32, 2, low, high) == (320, 576)
    # 20x20 is scaled up to 32x32 first; 4 * 32 * 32 < min: beta = sqrt(131072 / 4096) = 5.657
    assert temporal_smart_resize(4, 20, 20, 32, 2, low, high) == (192, 192)
    with pytest.raises(ValueError, match="temporal_factor"):
        temporal_smart_resize(1, 240, 320, 32, 2, low, high)


def test_qwen3_video_policy_is_per_video() -> None:
    """Qwen3VLVideoProcessor's policy: its class defaults where the config
    is silent, an identity of its own, a size that depends on the frame
    count; one frame (under the temporal patch) keeps its size; all of a
    video's frames (which vLLM lets the processor sample again) are sized
    for the count its sampling keeps (fps 2, at least 4), or keep their
    size where that is not known (no source fps, or a fixed num_frames,
    which the processor refuses beside its fps)."""
    policy = video_policy_from_config(QWEN3_VIDEO)
    assert policy is not None
    assert (policy.factor, policy.min_pixels, policy.max_pixels) == (32, 131072, 786432)
    assert policy.temporal_factor == 2 and policy.video_frames and policy.filter == "bicubic"
    identity = "smart:factor=32:min=131072:max=786432:temporal=2:per_video:sample=2fps/4-768"
    identity += ":torchvision:bicubic"
    assert policy.identity == identity
    assert policy.target(1080, 1920, 4) == (320, 576) != policy.target(1080, 1920, 32)
    assert policy.target(320, 576, 4) == (320, 576)  # a resized video is its own target
    assert policy.target(1080, 1920, 1) == (1080, 1920)
    with pytest.raises(ValueError, match="num_frames"):
        policy.target(1080, 1920)
    assert policy.video_target(1080, 1920, 4, 300) == (320, 576)
    assert policy.processor_sampled_frames(24, 25.0) == 4  # int(24 / 25 * 2) = 1, at least 4
    assert policy.processor_sampled_frames(300, 30.0) == 20 and policy.processor_sampled_frames(3, 30.0) == 3
    assert policy.video_target(1080, 1920, 24, 24, 25.0) == (320, 576)
    assert policy.video_target(1080, 1920, 4, 4) == (1080, 1920)  # no fps: the count is not known
    fixed = video_policy_from_config({**QWEN3_VIDEO, "num_frames": 8})
    assert fixed is not None and fixed.processor_sampled_frames(24, 25.0) is None
    assert fixed.video_target(1080, 1920, 24, 24, 25.0) == (1080, 1920) and fixed.identity != policy.identity
    qwen2 = image_policy_from_config({**QWEN, "min_pixels": 3136, "max_pixels": 12544})
    assert qwen2 is not None and qwen2.video_target(1080, 1920, 4, 4) == qwen2.target(1080, 1920)


def test_qwen3_video_policy_reads_its_config_and_refuses_what_it_does_not_reproduce() -> None:
    """size (replacing the default whole), patch, merge and temporal sizes,
    resample and the per-frame pixel cap from the config; no policy where
    the processor does not resize, takes no min/max_pixels aliases, has an
    incomplete size or a resample that is neither bicubic nor bilinear."""
    config = {**QWEN3_VIDEO, "size": {"shortest_edge": 4096, "longest_edge": 25165824}}
    config |= {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 3, "resample": 2}
    policy = video_policy_from_config(config)
    assert policy is not None and policy.filter == "bilinear"
    settings = (policy.factor, policy.min_pixels, policy.max_pixels, policy.temporal_factor)
    assert settings == (28, 4096, 25165824, 3)
    # cap_pixels_per_frame (max_video_tokens 64, factor 32): a frame's share
    # is max(min(65536, 786432 // 4), int(131072 * 1.05)) = 137625 pixels, so
    # beta = sqrt(4 * 1080 * 1920 / 550500) = 3.8816: 8.69 and 15.46 factors.
    capped = video_policy_from_config({**QWEN3_VIDEO, "cap_pixels_per_frame": True, "max_video_tokens": 64})
    assert (
        capped is not None
        and capped.frame_tokens == 64
        and capped.identity.endswith(":cap=64:torchvision:bicubic")
    )
    assert capped.target(1080, 1920, 4) == (256, 480)
    for refused in (
        {"cap_pixels_per_frame": True, "max_video_tokens": 0},
        {"do_resize": False},
        {"max_pixels": 100352},
        {"size": {"longest_edge": 786432}},
        {"resample": 0},
        {"temporal_patch_size": 0},
    ):
        assert video_policy_from_config({**QWEN3_VIDEO, **refused}) is None, refused


def test_video_resize_policy_reads_the_models_video_processor(tmp_path: Path, caplog) -> None:
    """From a model folder: Qwen2VLVideoProcessor's per-frame policy,
    Qwen3VLVideoProcessor's per-video one (also from processor_config.json's
    video_processor part); none, logged, for another processor, with
    --mm-processor-kwargs or with Qwen2-VL's cap_pixels_per_frame."""

    def model(name: str, config: dict[str, object], file: str = "video_preprocessor_config.json") -> Path:
        (tmp_path / name).mkdir()
        (tmp_path / name / file).write_text(json.dumps(config))
        return tmp_path / name

    size = {"shortest_edge": 3136, "longest_edge": 12544}
    qwen2_config = {"video_processor_type": "Qwen2VLVideoProcessor", "size": size}
    qwen2 = video_resize_policy(model("qwen2", qwen2_config))
    assert qwen2 is not None and not qwen2.video_frames and qwen2.identity.startswith("smart:factor=28:")
    qwen3 = video_resize_policy(model("qwen3", {**QWEN3_VIDEO, "size": size}))
    assert qwen3 is not None and qwen3.video_frames and qwen3.identity.startswith("smart:factor=32:min=3136:")
    nested = video_resize_policy(model("nested", {"video_processor": QWEN3_VIDEO}, "processor_config.json"))
    assert nested == video_policy_from_config(QWEN3_VIDEO)
    with caplog.at_level(logging.INFO, logger="pixelwire.resize"):
        assert video_resize_policy(tmp_path / "qwen3", {"fps": 1}) is None
        capped = {"video_processor_type": "Qwen2VLVideoProcessor", "size": size, "cap_pixels_per_frame": True}
        assert video_resize_policy(model("capped", capped)) is None
        llava = model("llava", {"video_processor_type": "LlavaOnevisionVideoProcessor"})
        assert video_resize_policy(llava) is None
    assert "not with --mm-processor-kwargs" in caplog.text and "caps the pixels per frame" in caplog.text
    assert "LlavaOnevisionVideoProcessor is not one pixelwire resizes for" in caplog.text


def test_a_models_video_loader_is_the_one_vllm_registers_for_its_video_processor(tmp_path: Path) -> None:
    """The registry that names the video processors resized for also gives
    the loader vLLM samples their videos with (Cosmos3-Edge's without a
    resize); another processor, or none, gives no loader."""
    for name, loader in (
        ("Qwen2VLVideoProcessor", "qwen2_vl"),
        ("Qwen3VLVideoProcessor", "qwen3_vl"),
        ("Cosmos3EdgeVideoProcessor", "qwen3_vl"),
        ("LlavaOnevisionVideoProcessor", None),
    ):
        (tmp_path / name).mkdir()
        config = {"video_processor_type": name}
        (tmp_path / name / "video_preprocessor_config.json").write_text(json.dumps(config))
        assert model_video_loader(tmp_path / name) == loader, name
    assert model_video_loader(tmp_path) is None
