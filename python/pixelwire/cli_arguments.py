"""What every `pixelwire` command's options share: the error a command
prints as one line (:class:`CommandError`), the argparse types of sizes
and JSON objects, and the help's layout (:class:`HelpFormatter`)."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from pixelwire.sizes import parse_bytes


class CommandError(Exception):
    """A mistake in how a command was called or set up: printed as one line
    (``pixelwire <command>: error: ...``), exit status 2, no traceback."""


def size_argument(text: str) -> int:
    """An argparse type: :func:`pixelwire.sizes.parse_bytes`, its message kept."""
    try:
        return parse_bytes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def json_object_argument(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object, as vLLM's JSON options take; what is
    wrong with the text is said, with where."""
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object ({{...}})")
    return value


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions by paragraph (each filled to the width, a list kept as
    written), and each option's default after its help unless the help
    names it already."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.strip().split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.lstrip().startswith("- ") for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(
                    textwrap.fill(
                        " ".join(paragraph.split()), width, initial_indent=indent, subsequent_indent=indent
                    )
                )
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or "default" in text
            or action.default in (None, False, argparse.SUPPRESS)
        ):
            return text
        shown = ", ".join(map(str, action.default)) if isinstance(action.default, list) else "%(default)s"
        return f"{text} (default: {shown})"
