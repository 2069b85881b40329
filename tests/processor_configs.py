"""Representative processor configs, as models' ``preprocessor_config.json``
(or ``video_preprocessor_config.json``) hold them, shared by the resize tests."""

QWEN = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14, "merge_size": 2, "resample": 3}

SIGLIP2 = {"image_processor_type": "Siglip2ImageProcessor", "resample": 2}
SIGLIP2 |= {"patch_size": 16, "max_num_patches": 256}
GEMMA3 = {"image_processor_type": "Gemma3ImageProcessor", "resample": 2}
GEMMA3 |= {"size": {"height": 896, "width": 896}}

PIXTRAL = {"image_processor_type": "PixtralImageProcessorFast", "size": {"longest_edge": 1540}, "resample": 3}

KIMI_K25 = {
    "auto_map": {"AutoImageProcessor": "kimi_k25_vision_processing.KimiK25VisionProcessor"},
    "media_proc_cfg": {
        "patch_size": 14,
        "merge_kernel_size": 2,
        "in_patch_limit": 16384,
        "patch_limit_on_one_side": 512,
    },
}

IDEFICS3 = {
    "image_processor_type": "Idefics3ImageProcessor",
    "size": {"longest_edge": 1456},
    "max_image_size": {"longest_edge": 364},
}

ONEVISION_GRID = [[384 * rows, 384 * columns] for rows in range(1, 7) for columns in range(1, 7)]
ONEVISION = {
    "image_processor_type": "LlavaOnevisionImageProcessor",
    "size": {"height": 384, "width": 384},
    "image_grid_pinpoints": ONEVISION_GRID,
    "resample": 3,
}
ONEVISION_MODEL = {
    "vision_config": {"image_size": 384, "patch_size": 14},
    "image_grid_pinpoints": ONEVISION_GRID,
    "vision_aspect_ratio": "anyres_max_9",
}

QWEN3_VIDEO = {"video_processor_type": "Qwen3VLVideoProcessor"}
