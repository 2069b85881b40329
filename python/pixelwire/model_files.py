"""A model's processor config files, found in its folder or, for a Hub id,
through the Hugging Face cache (or the Hub, where huggingface_hub is
installed and not offline), and read: what :mod:`pixelwire.resize` and
:mod:`pixelwire.video.sampling` take the processors' settings from."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def video_processor_config(model: str) -> dict[str, Any] | None:
    """``model``'s video processor config, or None when it has none."""
    places = (("video_preprocessor_config.json", None), ("processor_config.json", "video_processor"))
    for name, part in places:
        path = find_model_file(model, name)
        if path is None:
            continue
        found = json.loads(path.read_text())
        if part is not None:
            found = found.get(part) if isinstance(found, dict) else None
        if isinstance(found, dict):
            return found
    return None


IMAGE_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def image_processor_config(model: str) -> dict[str, Any]:
    for name in IMAGE_PROCESSOR_FILES:
        path = find_model_file(model, name)
        if path is None:
            continue
        config = json.loads(path.read_text())
        if name == "processor_config.json" and isinstance(config, dict):
            config = config.get("image_processor")
        if not isinstance(config, dict):
            raise ValueError(f"{path} holds no image processor config")
        return config
    if Path(model).expanduser().is_dir():
        raise FileNotFoundError(f"{model!r}: the folder has no {' or '.join(IMAGE_PROCESSOR_FILES)}")
    raise FileNotFoundError(
        f"{model!r} is not a folder, and neither the Hugging Face cache nor the Hub had its "
        f"{' or '.join(IMAGE_PROCESSOR_FILES)} (the Hub is not asked with HF_HUB_OFFLINE=1 set, or without "
        f"huggingface_hub installed): check the id, or download it first with `huggingface-cli download "
        f"{model} preprocessor_config.json` (unset HF_HUB_OFFLINE for that), or give the model's folder"
    )


def model_config(model: str) -> dict[str, Any]:
    """The model's ``config.json``; empty without one."""
    path = find_model_file(model, "config.json")
    config = json.loads(path.read_text()) if path is not None else {}
    return config if isinstance(config, dict) else {}


def processor_settings(model: str) -> dict[str, Any]:
    """The processor's own settings: the top level of
    ``processor_config.json`` without its processors' parts; empty without
    that file."""
    path = find_model_file(model, "processor_config.json")
    config = json.loads(path.read_text()) if path is not None else {}
    if not isinstance(config, dict):
        return {}
    return {key: value for key, value in config.items() if not isinstance(value, dict)}


def find_model_file(model: str, name: str) -> Path | None:
    """``name`` of ``model``: in its folder, or through the Hugging Face
    cache for a Hub id; None when it has no such file."""
    local = Path(model).expanduser()
    if local.is_dir():
        return local / name if (local / name).is_file() else None
    try:
        from huggingface_hub import hf_hub_download  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return _from_hub_cache(model, name)
    try:
        return Path(hf_hub_download(model, name))
    except Exception:  # noqa: BLE001 - missing file, offline, no token: the cache may still have it
        return _from_hub_cache(model, name)


def _from_hub_cache(model: str, name: str) -> Path | None:
    """A file of a Hub id from the Hugging Face cache (its documented
    layout), for installs without huggingface_hub or offline."""
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
    )
    repo = Path(hub) / ("models--" + model.replace("/", "--"))
    ref = repo / "refs" / "main"
    snapshots = [repo / "snapshots" / ref.read_text().strip()] if ref.is_file() else []
    snapshots += sorted((repo / "snapshots").glob("*")) if (repo / "snapshots").is_dir() else []
    for snapshot in snapshots:
        if (snapshot / name).is_file():
            return snapshot / name
    return None
