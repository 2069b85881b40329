"""A model's processor config files, found in its folder or, for a Hub id,
through the Hugging Face cache (or the Hub, where huggingface_hub, the
``hub`` extra, is installed and not offline), and read: what
:mod:`pixelwire.resize` and :mod:`pixelwire.video.sampling` take the
processors' settings from."""

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
    files = " or ".join(IMAGE_PROCESSOR_FILES)
    # Every config file the frontend reads is a small .json.
    download = f"`hf download {model} --include '*.json'`"
    if not hub_installed():
        raise FileNotFoundError(
            f"{model!r} is not a folder and the Hugging Face cache has no {files} for it; reading a model "
            "id from the Hub needs huggingface_hub, which pixelwire installs only with its hub extra: "
            f"pip install 'pixelwire[hub]'; or download the model's configs with {download}, or give "
            "the model's folder"
        )
    if hub_offline():
        raise FileNotFoundError(
            f"{model!r} is not a folder and the Hugging Face cache has no {files} for it, and "
            f"HF_HUB_OFFLINE is set, so the Hub was not asked: download the model's configs first with "
            f"{download} (without HF_HUB_OFFLINE), or give the model's folder"
        )
    raise FileNotFoundError(
        f"{model!r} is not a folder, and neither the Hugging Face cache nor the Hub had its {files}: "
        "check the id (a gated or private model needs `hf auth login`, or HF_TOKEN), or give the "
        "model's folder"
    )


def hub_installed() -> bool:
    """Whether huggingface_hub can be imported (the ``hub`` extra)."""
    try:
        import huggingface_hub  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        return False
    return True


def hub_offline() -> bool:
    """Whether huggingface_hub is told not to reach the Hub (HF_HUB_OFFLINE,
    read as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


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
