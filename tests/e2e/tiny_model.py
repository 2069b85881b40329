"""Builds tiny, randomly initialised vision-language model directories,
offline: Qwen2-VL (the default), Qwen3-VL (processed inputs), and Gemma 3, GLM-4.1V, Mistral 3,
Idefics3 and LLaVA-OneVision for the model-aware resize's other families.

The weights are drawn under a fixed seed (initializer_range 0.02), so the
same image gives the same logprobs on every start and different images give
different ones; vLLM's ``load_format="dummy"`` would not (its logits are flat).

    python tests/e2e/tiny_model.py OUTPUT_DIR [FAMILY]

FAMILY: qwen2-vl (the default), qwen3-vl, gemma3, glm4v, mistral3, idefics3
or llava-onevision.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen's chat layout; iterating over content parts makes vLLM pass them in
# OpenAI form, one {"type": "image"} per image ("video" per video).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ['image', 'image_url'] %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] in ['video', 'video_url'] %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TRAINING_TEXT = [
    "Describe the image in one short sentence.",
    "What is in this picture? A cat, a dog, a flower, a house, a car or a tree.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Colours: red, green, blue, yellow, white, black, grey, orange and purple.",
    "Numbers: zero one two three four five six seven eight nine ten.",
] * 20

MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 16  # at most 16 image tokens an image: fast on two cores

# Gemma 3's image: a square the SigLIP tower takes whole (8x8 patches of 14),
# pooled to 16 tokens.
GEMMA3_SIDE = 112
GEMMA3_TOKENS = 16
GEMMA3_SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
]
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ['image', 'image_url'] %}<start_of_image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# GLM-4.1V's budget counts the temporal patch (2): 8 to 16 image tokens.
GLM4V_MIN_PIXELS = 28 * 28 * 2 * 8
GLM4V_MAX_PIXELS = 28 * 28 * 2 * 16
GLM4V_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "[gMASK]",
    "<sop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|video|>",
]
GLM4V_CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ['image', 'image_url'] %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif part['type'] in ['video', 'video_url'] %}<|begin_of_video|><|video|><|end_of_video|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# The text model every family shares: head_dim 64 (one the CPU attention
# supports), two layers.
TEXT = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
}


def _tokenizer(special_tokens: list[str], chat_template: str, *, newlines: bool = False, **named: Any) -> Any:
    """A byte-level BPE of 512 tokens trained on TRAINING_TEXT, with the
    family's special tokens; ``named`` are its named special tokens.
    ``newlines``: runs of one to four newlines are tokens of their own, as
    in Gemma's vocabulary (vLLM's Gemma 3 processor looks them up)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(TRAINING_TEXT, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **named)
    if newlines:
        tokenizer.add_tokens(["\n" * n for n in range(1, 5)])
    tokenizer.chat_template = chat_template
    return tokenizer


def _save(out: Path, model: Any, processor: Any, tokenizer: Any, eos: int, pad: int) -> None:
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": pad}))


def _rename_weights(out: Path, old: str, new: str) -> None:
    """Weights under ``old`` renamed to ``new`` in ``model.safetensors``."""
    from safetensors.torch import load_file, save_file

    path = out / "model.safetensors"
    weights = load_file(path)
    renamed = {new + k.removeprefix(old) if k.startswith(old) else k: v for k, v in weights.items()}
    save_file(renamed, path, metadata={"format": "pt"})


def build(out: Path) -> None:
    """The tiny Qwen2-VL (images and videos)."""
    import torch
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(
        SPECIAL_TOKENS,
        CHAT_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}

    config = Qwen2VLConfig(
        text_config={
            **TEXT,
            "vocab_size": len(tokenizer),
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12]},
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 1,
            "embed_dim": 64,
            "hidden_size": 128,
            "num_heads": 1,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "initializer_range": 0.02,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen2VLForConditionalGeneration"]
    torch.manual_seed(1234)
    model = Qwen2VLForConditionalGeneration(config).to(torch.float32).eval()

    image_processor = Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    image_processor.size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    video_processor = Qwen2VLVideoProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    processor = Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    _save(out, model, processor, tokenizer, ids["<|im_end|>"], ids["<|endoftext|>"])


def build_gemma3(out: Path) -> None:
    """A tiny Gemma 3: SigLIP tower on a 112x112 square (bilinear, no
    pan-and-scan: the processor's defaults), 16 image tokens."""
    import torch
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        Gemma3Processor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(
        GEMMA3_SPECIAL_TOKENS,
        GEMMA3_CHAT_TEMPLATE,
        newlines=True,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GEMMA3_SPECIAL_TOKENS}
    config = Gemma3Config(
        text_config={
            **TEXT,
            "vocab_size": len(tokenizer),
            "head_dim": 64,
            "query_pre_attn_scalar": 64,
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
            "bos_token_id": ids["<bos>"],
            "eos_token_id": ids["<end_of_turn>"],
            "pad_token_id": ids["<pad>"],
        },
        vision_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 1,
            "image_size": GEMMA3_SIDE,
            "patch_size": 14,
            "vision_use_head": False,
        },
        mm_tokens_per_image=GEMMA3_TOKENS,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
        tie_word_embeddings=True,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    torch.manual_seed(1234)
    model = Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    # transformers initialises the projection to zeros (images would not
    # change the answer); drawn like every other weight instead.
    with torch.no_grad():
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(std=0.02)
    image_processor = Gemma3ImageProcessor(size={"height": GEMMA3_SIDE, "width": GEMMA3_SIDE})
    processor = Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=GEMMA3_CHAT_TEMPLATE,
        image_seq_length=GEMMA3_TOKENS,
    )
    _save(out, model, processor, tokenizer, ids["<end_of_turn>"], ids["<pad>"])
    # transformers 5.19 saves the SigLIP tower without its vision_model
    # level; Gemma 3's published checkpoints (and vLLM's loader) have it.
    _rename_weights(out, "vision_tower.", "vision_tower.vision_model.")


def build_glm4v(out: Path) -> None:
    """A tiny GLM-4.1V: GLM's smart_resize (factor 28, temporal patch 2),
    8 to 16 image tokens."""
    import torch
    from transformers import (
        Glm4vConfig,
        Glm4vForConditionalGeneration,
        Glm4vImageProcessor,
        Glm4vProcessor,
        Glm4vVideoProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(
        GLM4V_SPECIAL_TOKENS,
        GLM4V_CHAT_TEMPLATE,
        eos_token="<|user|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=GLM4V_SPECIAL_TOKENS[1:],
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in GLM4V_SPECIAL_TOKENS}
    config = Glm4vConfig(
        text_config={
            **TEXT,
            "vocab_size": len(tokenizer),
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [4, 6, 6],
                "partial_rotary_factor": 0.5,
            },
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 1,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 1,
            "out_hidden_size": TEXT["hidden_size"],
            "image_size": 112,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
    )
    config.architectures = ["Glm4vForConditionalGeneration"]
    torch.manual_seed(1234)
    model = Glm4vForConditionalGeneration(config).to(torch.float32).eval()
    size = {"shortest_edge": GLM4V_MIN_PIXELS, "longest_edge": GLM4V_MAX_PIXELS}
    processor = Glm4vProcessor(
        image_processor=Glm4vImageProcessor(size=size),
        tokenizer=tokenizer,
        video_processor=Glm4vVideoProcessor(size=size),
        chat_template=GLM4V_CHAT_TEMPLATE,
    )
    _save(out, model, processor, tokenizer, ids["<|user|>"], ids["<|endoftext|>"])


# Mistral 3's image: its longest edge fitted to 112 on a grid of 28 (patch
# 14, spatial merge 2): at most 4x4 image tokens, with a break per row.
MISTRAL3_LONGEST_EDGE = 112
MISTRAL3_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]
MISTRAL3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}[INST]"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ['image', 'image_url'] %}[IMG]"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}[/INST]"
    "{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


def build_mistral3(out: Path) -> None:
    """A tiny Mistral 3: a Pixtral tower (patch 14) whose patches are merged
    2x2, PixtralProcessor's longest edge 112."""
    import torch
    from transformers import (
        Mistral3Config,
        Mistral3ForConditionalGeneration,
        PixtralImageProcessor,
        PixtralProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(
        MISTRAL3_SPECIAL_TOKENS,
        MISTRAL3_CHAT_TEMPLATE,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<unk>",
        additional_special_tokens=MISTRAL3_SPECIAL_TOKENS[3:],
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in MISTRAL3_SPECIAL_TOKENS}
    config = Mistral3Config(
        text_config={
            **TEXT,
            "model_type": "mistral",
            "vocab_size": len(tokenizer),
            "head_dim": 64,
            "bos_token_id": ids["<s>"],
            "eos_token_id": ids["</s>"],
            "pad_token_id": ids["<unk>"],
        },
        vision_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 1,
            "head_dim": 64,
            "image_size": MISTRAL3_LONGEST_EDGE,
            "patch_size": 14,
        },
        image_token_index=ids["[IMG]"],
        spatial_merge_size=2,
        tie_word_embeddings=False,
    )
    config.architectures = ["Mistral3ForConditionalGeneration"]
    torch.manual_seed(1234)
    model = Mistral3ForConditionalGeneration(config).to(torch.float32).eval()
    image_processor = PixtralImageProcessor(
        size={"longest_edge": MISTRAL3_LONGEST_EDGE}, patch_size={"height": 14, "width": 14}
    )
    processor = PixtralProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=14,
        spatial_merge_size=2,
        chat_template=MISTRAL3_CHAT_TEMPLATE,
    )
    _save(out, model, processor, tokenizer, ids["</s>"], ids["<unk>"])


# Idefics3's tiles: 56 pixels (4x4 patches of 14, merged 2x2: 4 image tokens
# each); the longest edge 112, so at most 2x2 tiles and the global image.
IDEFICS3_TILE = 56
IDEFICS3_LONGEST_EDGE = 112
IDEFICS3_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
]
IDEFICS3_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}:"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ['image', 'image_url'] %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def build_idefics3(out: Path) -> None:
    """A tiny Idefics3: a SigLIP-style tower on 56-pixel tiles, its patches
    merged 2x2 into a Llama; the longest edge 112 (Lanczos, as the
    processor's default)."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(
        IDEFICS3_SPECIAL_TOKENS,
        IDEFICS3_CHAT_TEMPLATE,
        eos_token="<end_of_utterance>",
        pad_token="<|endoftext|>",
        additional_special_tokens=IDEFICS3_SPECIAL_TOKENS[1:],
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in IDEFICS3_SPECIAL_TOKENS}
    config = Idefics3Config(
        text_config={
            **TEXT,
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<end_of_utterance>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 1,
            "image_size": IDEFICS3_TILE,
            "patch_size": 14,
        },
        scale_factor=2,
        image_token_id=ids["<image>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Idefics3ForConditionalGeneration"]
    torch.manual_seed(1234)
    model = Idefics3ForConditionalGeneration(config).to(torch.float32).eval()
    image_processor = Idefics3ImageProcessor(
        size={"longest_edge": IDEFICS3_LONGEST_EDGE}, max_image_size={"longest_edge": IDEFICS3_TILE}
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=(IDEFICS3_TILE // 14) ** 2 // 4,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )
    _save(out, model, processor, tokenizer, ids["<end_of_utterance>"], ids["<|endoftext|>"])


# LLaVA-OneVision's tiles: 56 pixels (4x4 patches of 14: 16 features each),
# on a grid of 1 to 6 tiles a side, as the real one's 384 on 1 to 6.
ONEVISION_TILE = 56
ONEVISION_GRID = [[ONEVISION_TILE * r, ONEVISION_TILE * c] for r in range(1, 7) for c in range(1, 7)]
ONEVISION_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]
ONEVISION_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ['image', 'image_url'] %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_llava_onevision(out: Path) -> None:
    """A tiny LLaVA-OneVision: a SigLIP tower on 56-pixel tiles (anyres
    over a 6x6 grid, then the base tile; bicubic, the processor's default)
    into a Qwen2."""
    import torch
    from transformers import (
        LlavaOnevisionConfig,
        LlavaOnevisionForConditionalGeneration,
        LlavaOnevisionImageProcessor,
        LlavaOnevisionProcessor,
        LlavaOnevisionVideoProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(
        ONEVISION_SPECIAL_TOKENS,
        ONEVISION_CHAT_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=ONEVISION_SPECIAL_TOKENS[1:],
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ONEVISION_SPECIAL_TOKENS}
    config = LlavaOnevisionConfig(
        text_config={
            **TEXT,
            "model_type": "qwen2",
            "vocab_size": len(tokenizer),
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "model_type": "siglip_vision_model",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 1,
            "image_size": ONEVISION_TILE,
            "patch_size": 14,
            "vision_use_head": False,
        },
        image_token_index=ids["<image>"],
        video_token_index=ids["<video>"],
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9",
        image_grid_pinpoints=ONEVISION_GRID,
        tie_word_embeddings=False,
    )
    config.architectures = ["LlavaOnevisionForConditionalGeneration"]
    torch.manual_seed(1234)
    model = LlavaOnevisionForConditionalGeneration(config).to(torch.float32).eval()
    image_processor = LlavaOnevisionImageProcessor(
        size={"height": ONEVISION_TILE, "width": ONEVISION_TILE}, image_grid_pinpoints=ONEVISION_GRID
    )
    video_processor = LlavaOnevisionVideoProcessor(size={"height": ONEVISION_TILE, "width": ONEVISION_TILE})
    processor = LlavaOnevisionProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        num_image_tokens=(ONEVISION_TILE // 14) ** 2,
        vision_feature_select_strategy="full",
        chat_template=ONEVISION_CHAT_TEMPLATE,
        vision_aspect_ratio="anyres_max_9",
    )
    _save(out, model, processor, tokenizer, ids["<|im_end|>"], ids["<|endoftext|>"])
    # As Gemma 3's: the published checkpoints (and vLLM's loader) keep the
    # SigLIP tower's vision_model level.
    _rename_weights(out, "vision_tower.", "vision_tower.vision_model.")


# Qwen3-VL's grid: patch 16, merged 2x2 (factor 32); at most 16 image tokens.
QWEN3_VL_MIN_PIXELS = 64 * 64
QWEN3_VL_MAX_PIXELS = 32 * 32 * 16


def build_qwen3_vl(out: Path) -> None:
    """A tiny Qwen3-VL: its vision tower (patch 16, spatial merge 2, one
    deepstack layer) into a Qwen3 text model; Qwen2VLImageProcessor with
    Qwen3-VL's grid and normalisation (mean and std 0.5)."""
    import torch
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(
        SPECIAL_TOKENS,
        CHAT_TEMPLATE,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    config = Qwen3VLConfig(
        text_config={
            **TEXT,
            "vocab_size": len(tokenizer),
            "head_dim": 64,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [8, 12, 12],
                "mrope_interleaved": True,
            },
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 1,
            "out_hidden_size": TEXT["hidden_size"],
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0],
            "initializer_range": 0.02,
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    torch.manual_seed(1234)
    model = Qwen3VLForConditionalGeneration(config).to(torch.float32).eval()
    size = {"shortest_edge": QWEN3_VL_MIN_PIXELS, "longest_edge": QWEN3_VL_MAX_PIXELS}
    image_processor = Qwen2VLImageProcessor(
        size=size, patch_size=16, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3
    )
    video_processor = Qwen3VLVideoProcessor(
        size={"shortest_edge": QWEN3_VL_MIN_PIXELS * 2, "longest_edge": QWEN3_VL_MAX_PIXELS * 2}
    )
    processor = Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    _save(out, model, processor, tokenizer, ids["<|im_end|>"], ids["<|endoftext|>"])


BUILDERS: dict[str, Callable[[Path], None]] = {
    "mistral3": build_mistral3,
    "qwen2-vl": build,
    "qwen3-vl": build_qwen3_vl,
    "gemma3": build_gemma3,
    "glm4v": build_glm4v,
    "idefics3": build_idefics3,
    "llava-onevision": build_llava_onevision,
}


def ensure(out: Path, family: str = "qwen2-vl") -> Path:
    """The model directory of ``family``, built once."""
    if not (out / ".complete").exists():
        BUILDERS[family](out)
        (out / ".complete").write_text("ok\n")
    return out


if __name__ == "__main__":
    print(ensure(Path(sys.argv[1]), *sys.argv[2:3]))
