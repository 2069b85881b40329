"""Builds a tiny, randomly initialised Qwen2-VL model directory, offline.

The weights are drawn under a fixed seed (initializer_range 0.02), so the
same image gives the same logprobs on every start and different images give
different ones; vLLM's ``load_format="dummy"`` would not (its logits are flat).

    python tests/e2e/tiny_model.py OUTPUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(TRAINING_TEXT, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}

    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,  # head_dim 64: one the CPU attention supports
            "num_key_value_heads": 1,
            "max_position_embeddings": 2048,
            "initializer_range": 0.02,
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
    model.save_pretrained(out, safe_serialization=True)

    image_processor = Qwen2VLImageProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    image_processor.size = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    video_processor = Qwen2VLVideoProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    processor = Qwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"]})
    )
    (out / ".complete").write_text("ok\n")


def ensure(out: Path) -> Path:
    """The model directory, built once."""
    if not (out / ".complete").exists():
        build(out)
    return out


if __name__ == "__main__":
    print(ensure(Path(sys.argv[1])))
