"""The `pixelwire` command line as a newcomer meets it: a user's mistake is
one line saying what to do (exit status 2), never a traceback; every
option says what it does and its default; sizes take units; building the
parser imports no benchmark it does not run."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pixelwire import cli

from reference import CORPUS

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [["decode"], ["demo"], ["frontend"], ["bench", "transfer"], ["bench", "serve"]]


def _help_text(command: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``pixelwire COMMAND --help`` prints."""
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def _options(text: str) -> dict[str, str]:
    """Each option of a --help text: its invocation and its help."""
    section = text.split("options:\n", 1)[1]
    entries: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        if re.match(r"  -", line):
            invocation, _, help_text = line.strip().partition("  ")
            current = invocation
            entries[current] = help_text.strip()
        elif current is not None and line.strip():
            entries[current] += " " + line.strip()
    return entries


def _cli(
    *args: str, env: dict[str, str] | None = None, prelude: str = ""
) -> subprocess.CompletedProcess[str]:
    """``pixelwire ARGS`` in a fresh interpreter, after ``prelude``."""
    code = f"{prelude}\nimport sys\nfrom pixelwire.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def _one_line_error(done: subprocess.CompletedProcess[str], command: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pixelwire {command}: error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_option_has_help_and_shows_its_default(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    options = _options(_help_text(command, capsys))
    assert options
    for invocation, text in options.items():
        assert text, f"{' '.join(command)} {invocation} has no help"
        flag = " " not in invocation.split(",")[-1].strip()  # no metavar: on or off
        if not flag and "required" not in text:
            assert "default" in text, f"{' '.join(command)} {invocation}: no default shown in {text!r}"


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_description_ends_its_sentences(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    text = _help_text(command, capsys)
    description = text.split("\n\n", 1)[1].split("options:", 1)[0].split("positional arguments:")[0]
    assert description.strip(), f"{' '.join(command)} has no description"
    assert description.strip()[-1] in ".)", (
        f"{' '.join(command)}'s description stops at {description[-40:]!r}"
    )


def test_sizes_take_units() -> None:
    parse = cli.build_parser(["frontend"]).parse_args
    args = parse(["frontend", "--upstream", "http://u", "--pool-bytes", "1GiB", "--region-bytes", "64MiB"])
    assert (args.pool_bytes, args.region_bytes) == (1 << 30, 64 << 20)
    args = parse(["frontend", "--upstream", "http://u", "--max-request-bytes", "2G"])
    assert args.max_request_bytes == 2_000_000_000
    args = cli.build_parser(["bench", "serve"]).parse_args(
        ["bench", "serve", "--model", "m", "--frontend-pool-bytes", "512MiB"]
    )
    assert args.frontend_pool_bytes == 512 << 20


def test_a_size_without_a_known_unit_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["frontend", "--upstream", "http://u", "--pool-bytes", "1 gallon"])
    assert exited.value.code == 2
    assert "is not a size" in capsys.readouterr().err


def test_building_the_parser_imports_only_the_benchmark_asked_for() -> None:
    code = (
        "import sys\nfrom pixelwire import cli\n"
        "cli.build_parser(sys.argv[1:])\n"
        "print(sorted(m for m in sys.modules if m.startswith('pixelwire.bench.')))"
    )

    def imported(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True)
        return done.stdout.strip()

    assert imported("decode", "x.png") == "[]"
    assert imported("bench", "transfer") != "[]" and "pixelwire.bench.serve'" not in imported(
        "bench", "transfer"
    )
    assert "pixelwire.bench.serve" in imported("bench", "serve")


def test_decode_takes_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("hopper.png", "flower2.jpg"):
        shutil.copy(CORPUS / name, tmp_path / name)
    (tmp_path / "notes.txt").write_text("not an image")
    assert cli.main(["decode", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "hopper.png" in out and "flower2.jpg" in out and "notes.txt" not in out


def test_decode_exits_1_when_any_file_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A script's `pixelwire decode` must see that one of its files failed."""
    shutil.copy(CORPUS / "hopper.png", tmp_path / "hopper.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    assert cli.main(["decode", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "hopper.png" in captured.out and "broken.png" in captured.out
    assert "1 of 2 files failed to decode" in captured.err


def test_decode_of_a_missing_path_or_an_empty_folder_is_one_line(tmp_path: Path) -> None:
    line = _one_line_error(_cli("decode", str(tmp_path / "nope.png")), "decode")
    assert "nope.png: no such file or folder" in line
    line = _one_line_error(_cli("decode", str(tmp_path)), "decode")
    assert "holds no image files" in line


def _empty_hub_cache(tmp_path: Path, **more: str) -> dict[str, str]:
    return {
        **dict(os.environ),
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HOME": str(tmp_path / "hf"),
        **more,
    }


def test_a_hub_model_without_huggingface_hub_names_the_hub_extra(tmp_path: Path) -> None:
    """The documented install (the wheel alone) has no huggingface_hub: the
    error names the extra that brings it, and the `hf` command (not the
    deprecated huggingface-cli)."""
    hide_hub = "import sys\nsys.modules['huggingface_hub'] = None"
    done = _cli(
        "frontend", "--upstream", "http://127.0.0.1:9", "--model", "nobody/no-such-model",
        env=_empty_hub_cache(tmp_path), prelude=hide_hub,
    )  # fmt: skip
    line = _one_line_error(done, "frontend")
    assert "nobody/no-such-model" in line and "pip install 'pixelwire[hub]'" in line
    assert "hf download nobody/no-such-model --include '*.json'" in line
    assert "huggingface-cli" not in line


def test_the_hub_extra_is_declared() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(r.startswith("huggingface_hub") for r in project["optional-dependencies"]["hub"])


def test_a_hub_model_missing_from_the_cache_offline_names_the_download_and_hf_hub_offline(
    tmp_path: Path,
) -> None:
    pytest.importorskip("huggingface_hub")
    env = _empty_hub_cache(tmp_path, HF_HUB_OFFLINE="1")
    done = _cli("frontend", "--upstream", "http://127.0.0.1:9", "--model", "nobody/no-such-model", env=env)
    line = _one_line_error(done, "frontend")
    assert "nobody/no-such-model" in line and "HF_HUB_OFFLINE" in line
    assert "hf download nobody/no-such-model --include '*.json'" in line
    assert "huggingface-cli" not in line


@pytest.mark.parametrize(
    ("upstream", "words"),
    [
        ("127.0.0.1:8511", "give http://127.0.0.1:8511"),
        ("http://127.0.0.1:8000/v1", "give vLLM's server address, http://127.0.0.1:8000, without /v1"),
        ("http://127.0.0.1:8000/v1/", "without /v1"),
        ("ftp://127.0.0.1/", "is not an http:// or https:// URL"),
        ("http://127.0.0.1:8000?x=1", "has a query or fragment"),
    ],
)  # fmt: skip
def test_an_upstream_the_frontend_cannot_use_is_one_line(upstream: str, words: str) -> None:
    """The likeliest copy-pastes: a host:port without a scheme, and the
    OpenAI base URL (.../v1), which would forward to /v1/v1/...: refused at
    start, before the frontend says it serves."""
    line = _one_line_error(_cli("frontend", "--upstream", upstream), "frontend")
    assert words in line, line
    line = _one_line_error(
        _cli("frontend", "--upstream", "http://127.0.0.1:9", "--upstream-metrics", "127.0.0.1:8000/metrics"),
        "frontend",
    )
    assert "--upstream-metrics" in line and "give http://127.0.0.1:8000/metrics" in line


def test_cache_bytes_over_pool_bytes_is_one_line() -> None:
    """The cache lives inside the pool: more than the pool is a mistake,
    said at start. Given only a smaller pool, the default cache fits it."""
    line = _one_line_error(
        _cli(
            "frontend", "--upstream", "http://127.0.0.1:9", "--pool-bytes", "64MiB", "--cache-bytes", "128MiB"
        ),
        "frontend",
    )
    assert "--cache-bytes (134217728) is over --pool-bytes (67108864)" in line


def test_the_default_cache_fits_a_smaller_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    from pixelwire import frontend

    started: list[Any] = []
    monkeypatch.delenv("PIXELWIRE_CACHE_BYTES", raising=False)
    monkeypatch.setattr(frontend, "run", lambda config, host, port: started.append(config))
    assert cli.main(["frontend", "--upstream", "http://127.0.0.1:9", "--pool-bytes", "64MiB"]) == 0
    assert cli.main(["frontend", "--upstream", "http://127.0.0.1:9"]) == 0
    small, default = started
    assert small.publisher.cache_bytes == 32 << 20 and default.publisher.cache_bytes == 128 << 20


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--mm-processor-kwargs", '{"max_pixels": 1003520', "is not JSON: Expecting"),
        ("--mm-processor-kwargs", "[1, 2]", "is not a JSON object"),
        ("--media-io-kwargs", "{'image': {}}", "is not JSON: Expecting property name"),
    ],
)  # fmt: skip
def test_bad_json_in_a_json_option_says_what_is_wrong(
    option: str, value: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["frontend", "--upstream", "http://127.0.0.1:9", option, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: " in err and words in err and "invalid loads value" not in err, err


def test_frontend_without_nixl_says_what_to_install_before_it_serves() -> None:
    """No traceback, no "frontend on ..." line first: one line naming the
    runtime to install, or worker mode, which needs none."""
    hide_nixl = (
        "import importlib.util as u\nreal = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name.startswith('nixl') else real(name, *a)"
    )
    env = {k: v for k, v in dict(os.environ).items() if k != "PIXELWIRE_NIXL_LIB"}
    done = _cli("frontend", "--upstream", "http://127.0.0.1:9", "--port", "9", env=env, prelude=hide_nixl)
    line = _one_line_error(done, "frontend")
    assert "pip install --no-deps nixl-cu12" in line and "--decode-at worker" in line


def test_resize_approximate_without_a_model_is_one_line() -> None:
    """--resize-approximate resizes for the model --model names: alone, a
    one-line error, not a frontend that quietly ships full size."""
    line = _one_line_error(
        _cli("frontend", "--upstream", "http://127.0.0.1:9", "--resize-approximate"), "frontend"
    )
    assert "--resize-approximate" in line and "--model" in line


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-connections", "0"), ("--max-connections-per-client", "-1"), ("--header-timeout", "0"),
     ("--min-body-rate", "0")],
)  # fmt: skip
def test_connection_bounds_that_would_refuse_everyone_are_one_line(flag: str, value: str) -> None:
    line = _one_line_error(_cli("frontend", "--upstream", "http://127.0.0.1:9", flag, value), "frontend")
    assert f"{flag} must be positive" in line


def test_bench_serve_outside_vllms_environment_says_where_to_run_it() -> None:
    hide_vllm = (
        "import importlib.util as u\nreal = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name == 'vllm' else real(name, *a)"
    )
    done = _cli("bench", "serve", "--model", "m", prelude=hide_vllm)
    line = _one_line_error(done, "bench serve")
    assert "vLLM is not installed" in line and "vLLM's virtualenv" in line


def test_demo_without_nixl_says_what_to_install() -> None:
    hide_nixl = (
        "import importlib.util as u\nreal = u.find_spec\n"
        "u.find_spec = lambda name, *a: None if name.startswith('nixl') else real(name, *a)"
    )
    env = {k: v for k, v in dict(os.environ).items() if k != "PIXELWIRE_NIXL_LIB"}
    done = _cli("demo", "--per-size", "1", env=env, prelude=hide_nixl)
    line = _one_line_error(done, "demo")
    assert "pip install --no-deps nixl-cu12" in line


def test_a_covered_model_ships_processed_inputs_unless_told_not(
    qwen2_vl_folder: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pixelwire frontend --model` of a Qwen2-VL model ships its processor's
    outputs by default (uint8 rows; the float32 ones with --no-mm-device-do-normalize),
    its resized pixels with --no-processed-inputs, and nothing processed for
    a model it does not cover."""
    from pixelwire import cli, frontend

    started: list[Any] = []
    monkeypatch.setattr(frontend, "run", lambda config, host, port: started.append(config))
    upstream = ("frontend", "--upstream", "http://127.0.0.1:9")
    assert cli.main([*upstream, "--model", qwen2_vl_folder()]) == 0
    assert cli.main([*upstream, "--model", qwen2_vl_folder(), "--no-processed-inputs"]) == 0
    assert cli.main([*upstream, "--model", qwen2_vl_folder("gemma3")]) == 0
    assert cli.main([*upstream, "--model", qwen2_vl_folder(), "--no-mm-device-do-normalize"]) == 0
    processed, pixels, other, floats = started
    assert processed.processed is not None and processed.processed.resize == processed.resize
    assert processed.processed.normalisation is None
    assert floats.processed is not None and floats.processed.normalisation is not None
    assert "float32" in floats.processed.identity
    assert pixels.processed is None and pixels.resize is not None
    assert other.processed is None and other.resize is not None


def test_the_media_per_request_cap_keeps_its_old_spelling() -> None:
    """``--max-media-per-request`` caps every medium; the name it had when
    it was taken for images only sets the same setting."""
    from pixelwire.frontend_command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for flag in ("--max-media-per-request", "--max-images-per-request"):
        assert parser.parse_args(["--upstream", "http://vllm", flag, "5"]).max_media_per_request == 5
