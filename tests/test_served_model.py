"""pixelwire.vllm.served_model: the plug-in's model and processor kwargs
from vLLM's command line, with PIXELWIRE_MODEL / PIXELWIRE_MM_PROCESSOR_KWARGS
as overrides."""

from __future__ import annotations

import pytest

from pixelwire.vllm.served_model import ServedModel, from_command_line, same_model, served_model

VLLM = "/venv/bin/vllm"
API_SERVER = "/venv/lib/python3.11/site-packages/vllm/entrypoints/openai/api_server.py"


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIXELWIRE_MODEL", raising=False)
    monkeypatch.delenv("PIXELWIRE_MM_PROCESSOR_KWARGS", raising=False)


@pytest.mark.parametrize(
    ("argv", "model", "kwargs"),
    [
        ([VLLM, "serve", "Qwen/Qwen2-VL-2B-Instruct", "--port", "8000"], "Qwen/Qwen2-VL-2B-Instruct", {}),
        ([API_SERVER, "--model", "/models/tiny", "--enforce-eager"], "/models/tiny", {}),
        ([API_SERVER, "--model=/models/tiny"], "/models/tiny", {}),
        ([VLLM, "serve", "--port", "8000", "--model", "m"], "m", {}),
        (
            [VLLM, "serve", "m", "--mm-processor-kwargs", '{"max_pixels": 50176}'],
            "m",
            {"max_pixels": 50176},
        ),
        ([VLLM, "serve", "m", '--mm_processor_kwargs={"max_pixels": 1}'], "m", {"max_pixels": 1}),
        (
            [
                VLLM,
                "serve",
                "m",
                "--mm-processor-kwargs.size.longest_edge",
                "9",
                "--mm_processor_kwargs.a=true",
            ],
            "m",
            {"size": {"longest_edge": 9}, "a": 1},
        ),
        # Key by key replaces a JSON value, as vLLM's parser does.
        (
            [API_SERVER, "--model", "m", "--mm-processor-kwargs", '{"x": 1}', "--mm-processor-kwargs.y", "2"],
            "m",
            {"y": 2},
        ),
        # The last of each wins.
        ([API_SERVER, "--model", "a", "--mm-processor-kwargs", '{"x": 1}', "--model", "b"], "b", {"x": 1}),
        # "serve" only as vLLM's subcommand, not as another option's value.
        ([API_SERVER, "--served-model-name", "serve", "x"], None, {}),
        ([VLLM, "serve"], None, {}),
        ([VLLM, "--model"], None, {}),
        (["pytest", "tests", "-m", "vllm"], None, {}),
    ],
)
def test_the_command_line_names_the_model_and_kwargs(
    argv: list[str], model: str | None, kwargs: dict[str, object]
) -> None:
    """``serve M``, ``--model M``/``--model=M`` and ``--mm-processor-kwargs``
    in each spelling vLLM's parser accepts."""
    assert from_command_line(argv) == ServedModel(model, kwargs)


@pytest.mark.parametrize(
    "argv",
    [
        [VLLM, "serve", "m", "--mm-processor-kwargs", "max_pixels=1"],
        [VLLM, "serve", "m", "--mm-processor-kwargs", "[1]"],
        [VLLM, "serve", "m", "--mm-processor-kwargs.max_pixels", "1M"],
        [VLLM, "serve", "m", "--config", "settings.yaml"],
        [VLLM, "serve", "--config=settings.yaml"],
    ],
)
def test_a_command_line_that_cannot_be_read_for_sure_names_no_model(argv: list[str]) -> None:
    """Kwargs that are not JSON, or a --config file: the model is unknown
    (so resized references are refused), and the reason is given."""
    served = from_command_line(argv)
    assert served.model is None and "command line (" in served.source
    assert served.trusts_request_kwargs, "what cannot be read may trust requests' kwargs"


@pytest.mark.parametrize(
    ("flags", "trusts"),
    [
        ([], False),
        (["--trust-request-mm-kwargs"], True),
        (["--trust_request_mm_kwargs"], True),
        (["--trust-request-mm-kwargs", "--no-trust-request-mm-kwargs"], False),
        (["--no-trust-request-mm-kwargs", "--trust-request-mm-kwargs"], True),
        (["--trust-request-chat-template"], False),
    ],
)
def test_the_command_line_says_whether_vllm_trusts_requests_kwargs(
    flags: list[str], trusts: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's --trust-request-mm-kwargs (a boolean flag: the last spelling
    wins), whatever PIXELWIRE_MODEL says of the model."""
    argv = [VLLM, "serve", "m", *flags]
    assert from_command_line(argv).trusts_request_kwargs is trusts
    monkeypatch.setenv("PIXELWIRE_MODEL", "other")
    assert served_model(argv).trusts_request_kwargs is trusts


def test_the_variables_override_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIXELWIRE_MODEL and PIXELWIRE_MM_PROCESSOR_KWARGS each override their
    half; unset, the command line gives it."""
    argv = [VLLM, "serve", "m", "--mm-processor-kwargs", '{"max_pixels": 1}']
    assert served_model(argv) == ServedModel("m", {"max_pixels": 1})
    monkeypatch.setenv("PIXELWIRE_MODEL", "other")
    assert served_model(argv) == ServedModel("other", {"max_pixels": 1}, "PIXELWIRE_MODEL", explicit=True)
    monkeypatch.setenv("PIXELWIRE_MM_PROCESSOR_KWARGS", "{}")
    assert served_model(argv).mm_processor_kwargs == {}
    monkeypatch.delenv("PIXELWIRE_MODEL")
    assert served_model(argv).model == "m" and served_model(argv).mm_processor_kwargs == {}
    assert not served_model(argv).explicit
    monkeypatch.setenv("PIXELWIRE_MM_PROCESSOR_KWARGS", "[]")
    with pytest.raises(ValueError, match="PIXELWIRE_MM_PROCESSOR_KWARGS"):
        served_model(argv)


def test_spellings_of_one_folder_are_the_same_model() -> None:
    """A trailing slash or a dot does not make another model."""
    assert same_model("/models/tiny/", "/models/./tiny") and not same_model("a/b", "a/c")
