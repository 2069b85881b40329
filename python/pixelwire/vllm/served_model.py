"""The model this vLLM serves and its ``--mm-processor-kwargs``, which the
plug-in's resize checks need: from vLLM's own command line, with
``PIXELWIRE_MODEL`` / ``PIXELWIRE_MM_PROCESSOR_KWARGS`` as overrides.

The command line because nothing else reaches a plug-in: vLLM 0.32 calls
general plug-ins while it builds its argument parser (before any
configuration exists) and builds media connectors without the model config.
Imports nothing of vLLM, so it is tested without it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pixelwire.config import worker_model_from_env

_MODEL = re.compile(r"^--model(=|$)")
# vLLM's FlexibleArgumentParser reads underscores in option names as dashes
# and ``--opt.key value`` as one key of a dict option.
_KWARGS = re.compile(r"^--mm[-_]processor[-_]kwargs(?P<keys>(\.[^=]+)?)(?P<eq>=|$)")
# vLLM's boolean flag (argparse's BooleanOptionalAction: the last one wins).
_TRUST = re.compile(r"^--(?P<no>no[-_])?trust[-_]request[-_]mm[-_]kwargs$")


@dataclass(frozen=True)
class ServedModel:
    """``model`` (None when it cannot be established: then frontend-resized
    images are refused) and its processor kwargs; ``source`` says where they
    came from, for log lines; ``explicit`` when a variable set the model (a
    model that cannot be read is then an error, not a quiet "no resize")."""

    model: str | None
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = "vLLM's command line"
    explicit: bool = False
    # vLLM's --trust-request-mm-kwargs: a request may bring its own
    # mm_processor_kwargs, which never reach the plug-in. True too where the
    # command line cannot be read for sure (a --config file).
    trusts_request_kwargs: bool = False


def from_command_line(argv: Sequence[str]) -> ServedModel:
    """vLLM's model and ``--mm-processor-kwargs`` as its parser reads
    ``argv``: ``serve M`` (the model right after ``serve``, as vLLM requires)
    or ``--model M`` / ``--model=M``; the kwargs as JSON (``--opt J`` or
    ``--opt=J``) or key by key (``--mm-processor-kwargs.max_pixels 1000``,
    which replaces a JSON value, as in vLLM); the last of each wins. The
    model is None when the command line cannot be read for sure: a
    ``--config`` file, or kwargs that are not JSON."""
    args = list(argv)
    if any(arg == "--config" or arg.startswith("--config=") for arg in args):
        return ServedModel(
            None,
            source="vLLM's command line (settings in a --config file are not read)",
            trusts_request_kwargs=True,
        )
    model: str | None = None
    trusts = False
    whole: dict[str, Any] = {}
    by_key: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg, step = args[i], 1
        if i == 1 and arg == "serve" and i + 1 < len(args) and not args[i + 1].startswith("-"):
            model, step = args[i + 1], 2
        elif _MODEL.match(arg):
            model, step = _value(args, i)
        elif trust := _TRUST.match(arg):
            trusts = not trust["no"]
        elif found := _KWARGS.match(arg):
            value, step = _value(args, i)
            try:
                parsed = json.loads(value or "")
            except ValueError:
                why = f"vLLM's command line ({arg} {value!r} is not JSON)"
                return ServedModel(None, source=why, trusts_request_kwargs=True)
            if found["keys"]:
                _set_nested(by_key, found["keys"].removeprefix(".").split("."), parsed)
            elif isinstance(parsed, dict):
                whole = parsed
            else:
                why = f"vLLM's command line ({arg} {value!r} is not a JSON object)"
                return ServedModel(None, source=why, trusts_request_kwargs=True)
        i += step
    return ServedModel(model, by_key or whole, trusts_request_kwargs=trusts)


def served_model(argv: Sequence[str]) -> ServedModel:
    """The served model: ``PIXELWIRE_MODEL`` and
    ``PIXELWIRE_MM_PROCESSOR_KWARGS`` where set (each overrides its half),
    else vLLM's command line ``argv``."""
    env_model, env_kwargs = worker_model_from_env()
    started = from_command_line(argv)
    if env_model is None and env_kwargs is None:
        return started
    kwargs = env_kwargs if env_kwargs is not None else started.mm_processor_kwargs
    trusts = started.trusts_request_kwargs  # vLLM's own flag, whatever the variables say
    if env_model is None:
        source = f"{started.source}, PIXELWIRE_MM_PROCESSOR_KWARGS"
        return ServedModel(started.model, kwargs, source, trusts_request_kwargs=trusts)
    return ServedModel(env_model, kwargs, "PIXELWIRE_MODEL", explicit=True, trusts_request_kwargs=trusts)


def same_model(one: str, other: str) -> bool:
    """Whether two spellings of a model (a folder or a Hub id) are one."""
    return os.path.normpath(one) == os.path.normpath(other)


def _value(args: list[str], i: int) -> tuple[str | None, int]:
    """The value of option ``args[i]`` (``--opt=v`` or ``--opt v``; None at
    the end) and how many arguments it takes."""
    if "=" in args[i]:
        return args[i].split("=", 1)[1], 1
    if i + 1 < len(args):
        return args[i + 1], 2
    return None, 1


def _set_nested(into: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        if not isinstance(into.get(key), dict):
            into[key] = {}
        into = into[key]
    into[keys[-1]] = value
