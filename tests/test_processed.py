"""Processed inputs at the frontend (``pixelwire.processed``): which models
get a patch layout, and what the publisher ships for one: the processor's
patch rows of the resized image, laid out as transformers'
``Qwen2VLImageProcessor`` lays them out (the reference below spells out its
reshape and permute with numpy), read back over NIXL unchanged; and the
descriptor that names them. The comparison with vLLM's own processor is the
vLLM group's (tests/e2e/test_processed_inputs.py)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable

import numpy as np
import pytest
from PIL import Image

import pixelwire
from pixelwire._native import join_patch_rows
from pixelwire.descriptor import parse_descriptor
from pixelwire.processed import Normalisation, PatchLayout, patch_layout, processed_identity
from pixelwire.resize import image_resize_policy
from pixelwire.resize.families.smart import SmartPolicy

from reference import CORPUS

POLICY = SmartPolicy(factor=28, min_pixels=3136, max_pixels=50176)
LAYOUT = PatchLayout(14, 2, 2, POLICY)
IMAGES = ["hopper.png", "flower2.jpg", "pil_sample_cmyk.jpg"]


def processor_rows(rgb: np.ndarray, patch: int, temporal: int, merge: int) -> np.ndarray:
    """Qwen2VLImageProcessor's patch rows of an (H, W, 3) image: CHW, the
    picture repeated along the temporal patch, reshaped and permuted as the
    processor does."""
    height, width, channels = rgb.shape
    gh, gw = height // patch, width // patch
    frames = np.repeat(rgb.transpose(2, 0, 1)[None], temporal, axis=0)  # (T, C, H, W)
    blocks = frames.reshape(1, temporal, channels, gh // merge, merge, patch, gw // merge, merge, patch)
    rows = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return rows.reshape(gh * gw, channels * temporal * patch * patch)


def test_the_qwen2_vl_processors_get_a_patch_layout(qwen2_vl_folder: Callable[..., str]) -> None:
    """Qwen2-VL and Qwen2.5-VL with the torchvision backend get one, whose
    identity names the grid and the resize (budget included); another
    model, the PIL backend, a kwarg changing the grid or no resize, none."""
    model = qwen2_vl_folder()
    policy = image_resize_policy(model)
    layout = patch_layout(model, None, policy)
    assert layout is not None and layout.grid == (14, 2, 2)
    assert layout.identity == processed_identity(14, 2, 2, policy.identity)
    assert "max=12845056" in layout.identity
    other_budget = image_resize_policy(model, {"max_pixels": 1003520})
    assert patch_layout(model, {"max_pixels": 1003520}, other_budget).identity != layout.identity  # type: ignore[union-attr]
    assert patch_layout(model, {"use_fast": False}, policy) is None
    assert patch_layout(model, {"backend": "pil"}, policy) is None
    assert patch_layout(model, {"patch_size": 16}, policy) is None, "the grid no longer fits the resize"
    assert patch_layout(model, None, None) is None
    assert patch_layout(qwen2_vl_folder("qwen2_5_vl"), None, policy) is not None
    assert patch_layout(qwen2_vl_folder("gemma3"), None, policy) is None, "another model: not covered"


def test_qwen3_vl_gets_its_own_grid(qwen2_vl_folder: Callable[..., str]) -> None:
    """Qwen3-VL (dense and MoE): Qwen2VLImageProcessor with patch 16, so a
    factor of 32, and an identity of its own; its config's grid must fit
    the resize."""
    for model_type in ("qwen3_vl", "qwen3_vl_moe"):
        model = qwen2_vl_folder(model_type, patch_size=16)
        policy = image_resize_policy(model)
        layout = patch_layout(model, None, policy)
        assert layout is not None and layout.grid == (16, 2, 2) and layout.resize.factor == 32
        assert "patch=16" in layout.identity and "factor=32" in layout.identity
        assert layout.grid_thw(64, 96) == [1, 4, 6]
        assert patch_layout(model, {"patch_size": 14}, policy) is None, "the grid no longer fits the resize"


# Glm4vImageProcessor's class defaults: its budget from size alone.
GLM = {
    "image_processor_type": "Glm4vImageProcessor",
    "size": {"shortest_edge": 12544, "longest_edge": 11760000},
}


def test_glm4v_gets_qwen2_vls_rows_of_its_own_resize(qwen2_vl_folder: Callable[..., str]) -> None:
    """GLM-4.1V and GLM-4.5V (Glm4vImageProcessor): the rows Qwen2-VL's
    processor lays out, of an image resized by GLM's smart resize (its
    budget counts the temporal patch: a 4K photo is shrunk to fit half of
    it), named by an identity of their own; a temporal patch the resize
    does not count, the PIL backend, or Qwen's resize for a GLM model (and
    GLM's for a Qwen model): none."""
    for model_type in ("glm4v", "glm4v_moe"):
        model = qwen2_vl_folder(model_type, **GLM)
        policy = image_resize_policy(model)
        assert isinstance(policy, SmartPolicy) and policy.temporal_factor == 2
        layout = patch_layout(model, None, policy)
        assert layout is not None and layout.grid == (14, 2, 2) and layout.rows == "glm4v_patches"
        assert layout.identity == processed_identity(14, 2, 2, policy.identity, rows="glm4v_patches")
        assert (
            layout.identity.startswith("glm4v_patches:uint8:patch=14:") and ":temporal=2" in layout.identity
        )
        height, width = layout.target(2160, 3840)
        assert 2 * height * width <= 11760000 < 2 * 2160 * 3840
        floats = patch_layout(model, None, policy, device_normalize=False)
        assert floats is not None and floats.normalisation == Normalisation(
            "torchvision", CLIP_MEAN, CLIP_STD, 1 / 255
        )
        assert patch_layout(model, {"temporal_patch_size": 3}, policy) is None, "the resize counts 2"
        assert patch_layout(model, {"use_fast": False}, policy) is None
    glm_policy = image_resize_policy(qwen2_vl_folder("glm4v", **GLM))
    qwen_policy = image_resize_policy(qwen2_vl_folder())
    assert patch_layout(qwen2_vl_folder(), None, glm_policy) is None
    assert patch_layout(qwen2_vl_folder("glm4v", **GLM), None, qwen_policy) is None


@pytest.mark.parametrize("name", IMAGES)
def test_decode_image_lays_out_the_processors_rows(name: str) -> None:
    """decode_image(patches=) gives the rows the processor makes of the
    resized image, and the reference would see a wrong grid."""
    data = (CORPUS / name).read_bytes()
    height, width = pixelwire.probe_image(data)["oriented_size"]
    target = LAYOUT.target(height, width)
    resized = pixelwire.decode_image(data, resize=target)
    rows = pixelwire.decode_image(data, resize=target, patches=LAYOUT.grid)
    assert rows.shape == (target[0] * target[1] // 196, 1176, 1)
    np.testing.assert_array_equal(rows[:, :, 0], processor_rows(resized, 14, 2, 2))
    assert not np.array_equal(rows[:, :, 0], processor_rows(resized, 14, 2, 2)[::-1])


def test_patch_rows_need_rgb_on_the_merge_grid() -> None:
    data = (CORPUS / "hopper.png").read_bytes()
    with pytest.raises(ValueError, match="merge windows"):
        pixelwire.decode_image(data, resize=(100, 100), patches=(14, 2, 2))
    with pytest.raises(ValueError, match="mode RGB"):
        pixelwire.decode_image(data, mode="L", resize=(112, 112), patches=(14, 2, 2))
    with pytest.raises(ValueError, match="1 to 1024"):
        pixelwire.decode_image(data, resize=(112, 112), patches=(0, 2, 2))


def test_the_publisher_ships_the_rows_and_the_descriptor_names_them() -> None:
    """Published one at a time and in a batch, each image's slot holds its
    rows with each patch once (3 bytes a pixel of the target size, what the
    pixels would take), which a reader gets back unchanged and
    join_patch_rows turns into the processor's own rows; the descriptor
    carries the processor's identity, the grid and the resize, and a
    PATCHES layout needs a patch layout."""
    sources = [(CORPUS / name).read_bytes() for name in IMAGES]

    async def main() -> None:
        async with pixelwire.Publisher() as publisher, pixelwire.Reader() as reader:
            alone = [await publisher.decode_and_publish(d, layout="PATCHES", resize=LAYOUT) for d in sources]
            batch = await publisher.decode_and_publish_many(sources, layout="PATCHES", resize=LAYOUT)
            for name, data, one, many in zip(IMAGES, sources, alone, batch, strict=True):
                assert isinstance(one, pixelwire.Decoded) and isinstance(many, pixelwire.Decoded), name
                height, width = pixelwire.probe_image(data)["oriented_size"]
                th, tw = LAYOUT.target(height, width)
                resized = pixelwire.decode_image(data, resize=(th, tw))
                travelled, expected = processor_rows(resized, 14, 1, 2), processor_rows(resized, 14, 2, 2)
                for decoded in (one, many):
                    assert decoded.layout == "PATCHES" and decoded.size == th * tw * 3
                    assert decoded.processed == {
                        "processor": LAYOUT.identity,
                        "grid_thw": [1, th // 14, tw // 14],
                        "patch": [14, 2, 2],
                    }
                    assert decoded.resize == {"policy": POLICY.identity, "source": [height, width]}
                    remote = parse_descriptor(decoded.to_dict())
                    assert remote.processed is not None and remote.processed.pixels == th * tw
                    got = (await reader.read_decoded(decoded.to_dict(), output="numpy"))[:, :, 0]
                    np.testing.assert_array_equal(got, travelled, err_msg=name)
                    joined = join_patch_rows([got], [2])[:, :, 0]
                    np.testing.assert_array_equal(joined, expected, err_msg=name)
            with pytest.raises(ValueError, match="PATCHES layout"):
                await publisher.decode_and_publish(sources[0], layout="PATCHES", resize=POLICY)
            with pytest.raises(ValueError, match="PATCHES layout"):
                await publisher.decode_and_publish(sources[0], resize=LAYOUT)

    asyncio.run(main())


def test_joined_rows_are_each_parts_rows_with_their_copies() -> None:
    """join_patch_rows: travelled rows (each patch once) with their temporal
    copies made, beside rows already whole, in order, as one array; parts
    that would land at other row lengths, or that are not rows, are refused."""
    rgb = np.random.default_rng(3).integers(0, 256, (56, 28, 3), dtype=np.uint8)
    once, twice = processor_rows(rgb, 14, 1, 2), processor_rows(rgb, 14, 2, 2)
    joined = join_patch_rows([once, twice, once], [2, 1, 2])
    np.testing.assert_array_equal(joined[:, :, 0], np.concatenate([twice, twice, twice]))
    with pytest.raises(ValueError, match="do not join"):
        join_patch_rows([once, twice], [1, 1])
    with pytest.raises(ValueError, match="C-contiguous"):
        join_patch_rows([twice[:, ::2]], [1])
    with pytest.raises(ValueError, match="one each"):
        join_patch_rows([once], [2, 2])


CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
FLOATS = PatchLayout(14, 2, 2, POLICY, Normalisation("torchvision", CLIP_MEAN, CLIP_STD, 1 / 255))


def torchvision_normalised(rgb: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """transformers 5.19's TorchvisionBackend.rescale_and_normalize of an
    (H, W, 3) uint8 image, in numpy float32: the rescale fused into the
    mean and std (``torch.tensor(mean) * (1.0 / rescale_factor)``, float32),
    then torchvision's ``normalize``: ``(x - mean) / std``, float32."""
    scale = np.float32(1.0 / (1 / 255))
    fused_mean = np.array(mean, np.float32) * scale
    fused_std = np.array(std, np.float32) * scale
    return (rgb.astype(np.float32) - fused_mean) / fused_std


def test_without_device_normalisation_the_layout_makes_float_rows(
    qwen2_vl_folder: Callable[..., str],
) -> None:
    """With vLLM's device normalisation off, the layout's rows are the
    processor's float32 values: its config's mean, std and rescale (the
    class defaults where silent), named in the identity; a processor that
    does not rescale or normalise, or the PIL backend, gets none."""
    model = qwen2_vl_folder()
    policy = image_resize_policy(model)
    floats = patch_layout(model, None, policy, device_normalize=False)
    assert floats is not None and floats.normalisation == Normalisation(
        "torchvision", CLIP_MEAN, CLIP_STD, 1 / 255
    )
    # They travel as the image's bytes: the pools hold what the pixels would.
    assert floats.dtype == "uint8" and floats.bytes_per_pixel == 3
    assert "qwen2_vl_patches:float32:torchvision:mean=0.48145466,0.4578275,0.40821073:" in floats.identity
    assert floats.identity != patch_layout(model, None, policy).identity  # type: ignore[union-attr]
    half = patch_layout(
        model, {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}, policy, device_normalize=False
    )
    assert half is not None and half.normalisation == Normalisation(
        "torchvision", (0.5,) * 3, (0.5,) * 3, 1 / 255
    )
    for off in (
        {"do_normalize": False},
        {"do_rescale": False},
        {"image_std": [0.5, 0, 0.5]},
        {"use_fast": False},
    ):
        assert patch_layout(model, off, policy, device_normalize=False) is None, off
    assert patch_layout(qwen2_vl_folder(do_normalize=False), None, policy, device_normalize=False) is None


@pytest.mark.parametrize("name", IMAGES)
def test_float_rows_are_the_processors_values_bit_for_bit(name: str) -> None:
    """decode_image(patches=, normalize=) gives the float32 rows the
    torchvision backend makes of the resized image, bit for bit; every byte
    value, in every channel, too."""
    data = (CORPUS / name).read_bytes()
    height, width = pixelwire.probe_image(data)["oriented_size"]
    target = FLOATS.target(height, width)
    resized = pixelwire.decode_image(data, resize=target)
    rows = pixelwire.decode_image(data, resize=target, patches=FLOATS.grid, normalize=FLOATS.native_normalize)
    assert rows.dtype == np.float32 and rows.shape == (target[0] * target[1] // 196, 1176, 1)
    want = processor_rows(torchvision_normalised(resized, CLIP_MEAN, CLIP_STD), 14, 2, 2)
    assert np.array_equal(rows[:, :, 0].view(np.uint32), want.view(np.uint32))
    # Every byte value in every channel: a 16x16 image of 256 values a channel.
    every = np.stack([np.roll(np.arange(256, dtype=np.uint8), 85 * c).reshape(16, 16) for c in range(3)], -1)
    every = np.tile(every, (2, 2, 1))  # 32x32: one merge window of 16-pixel patches
    encoded = io.BytesIO()
    Image.fromarray(every).save(encoded, format="PNG")
    png = encoded.getvalue()
    imagenet = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    for mean, std in ((CLIP_MEAN, CLIP_STD), ((0.5,) * 3, (0.5,) * 3), imagenet):
        got = pixelwire.decode_image(png, patches=(16, 2, 2), normalize=("torchvision", mean, std, 1 / 255))
        want = processor_rows(torchvision_normalised(every, mean, std), 16, 2, 2)
        assert np.array_equal(got[:, :, 0].view(np.uint32), want.view(np.uint32))


def test_float_rows_travel_as_bytes_and_are_made_as_their_copies_are() -> None:
    """Published for float rows, the rows travel as the resized image's
    bytes (three a pixel, as its pixels would: the descriptor says uint8 and
    names the float32 values); join_patch_rows(normalize=) makes the
    processor's float32 rows of them, with their temporal copies, bit for
    bit, in one pass; a bad normalisation is refused."""
    data = (CORPUS / "flower2.jpg").read_bytes()

    async def main() -> None:
        async with pixelwire.Publisher() as publisher, pixelwire.Reader() as reader:
            decoded = await publisher.decode_and_publish(data, layout="PATCHES", resize=FLOATS)
            height, width = pixelwire.probe_image(data)["oriented_size"]
            th, tw = FLOATS.target(height, width)
            assert decoded.size == th * tw * 3
            assert decoded.processed is not None and decoded.processed.get("dtype", "uint8") == "uint8"
            assert decoded.processed["processor"] == FLOATS.identity
            remote = parse_descriptor(decoded.to_dict())
            assert remote.processed is not None and remote.processed.dtype == "uint8"
            got = (await reader.read_decoded(decoded.to_dict(), output="numpy"))[:, :, 0]
            resized = pixelwire.decode_image(data, resize=(th, tw))
            np.testing.assert_array_equal(got, processor_rows(resized, 14, 1, 2))
            normalised = torchvision_normalised(resized, CLIP_MEAN, CLIP_STD)
            joined = join_patch_rows([got, got], [2, 2], normalize=FLOATS.native_normalize)
            assert joined.shape[2] == 4
            joined_rows = joined.reshape(joined.shape[0], -1).view(np.float32)
            want = processor_rows(normalised, 14, 2, 2)
            np.testing.assert_array_equal(
                joined_rows.view(np.uint32), np.concatenate([want, want]).view(np.uint32)
            )
            with pytest.raises(ValueError, match="std non-zero"):
                join_patch_rows([got], [2], normalize=("torchvision", CLIP_MEAN, (0.5, 0.0, 0.5), 1 / 255))
            with pytest.raises(ValueError, match="backend"):
                join_patch_rows([got], [2], normalize=("cuda", CLIP_MEAN, CLIP_STD, 1 / 255))

    asyncio.run(main())
