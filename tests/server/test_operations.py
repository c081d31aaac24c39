"""Operations: log level and access log, sampling defaults from generation_config.json, served
model names, flag aliases and suggestions, and the model_name label of the metrics."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from atlas_core.cli import build_parser, main
from atlas_core.model.generation_config import sampling_defaults
from atlas_core.model.loader import ModelWeightLoader
from atlas_core.server.cli_serve import configure_logging, serve_settings
from atlas_core.server.sampling import sampling_params
from atlas_core.server.schemas_openai import SamplerFields
from tests.server.conftest import ScriptedFactory

ASK = [{"role": "user", "content": "[ask] a secret question"}]


def access_lines(caplog: pytest.LogCaptureFixture, count: int) -> list[str]:
    """The access lines logged so far, once there are ``count`` of them (or after 5 s)."""
    deadline = time.monotonic() + 5
    while True:
        lines = [r.getMessage() for r in caplog.records if r.name == "atlas.access"]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)


def test_access_line_per_request_without_prompt_text(
    scripted: ScriptedFactory, caplog: pytest.LogCaptureFixture
) -> None:
    server = scripted({"[ask]": "one two three"})
    caplog.set_level(logging.INFO, logger="atlas")
    server.openai().chat.completions.create(model="scripted", messages=ASK)  # type: ignore[arg-type]
    httpx.get(server.url + "/health")
    lines = access_lines(caplog, 2)  # each is logged just after its response is sent
    chat = next(line for line in lines if line.startswith('"POST /v1/chat/completions" 200 '))
    completion = len(server.state.runtime.tokenizer.encode("one two three", add_special_tokens=False)) + 1  # type: ignore[union-attr]
    assert f"completion_tokens={completion} " in chat and chat.endswith("s")
    assert int(chat.split("prompt_tokens=")[1].split()[0]) > 5
    assert any(line.startswith('"GET /health" 200 prompt_tokens=0 completion_tokens=0 ') for line in lines)
    assert not any("secret" in r.getMessage() for r in caplog.records)


def test_log_requests_logs_the_prompt(scripted: ScriptedFactory, caplog: pytest.LogCaptureFixture) -> None:
    server = scripted({"[ask]": "one"}, log_requests=True)
    caplog.set_level(logging.INFO, logger="atlas")
    server.openai().chat.completions.create(model="scripted", messages=ASK)  # type: ignore[arg-type]
    assert any(r.name == "atlas.requests" and "secret question" in r.getMessage() for r in caplog.records)


def test_log_level_flag_configures_logging() -> None:
    settings = serve_settings(build_parser().parse_args(["serve", "--log-level", "warning"]), {})
    assert settings["log_level"] == "warning"
    assert serve_settings(build_parser().parse_args(["serve"]), {"ATLAS_LOG_LEVEL": "debug"})["log_level"] == "debug"
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    try:
        configure_logging("error")
        assert root.level == logging.ERROR
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.mark.parametrize("tty", [True, False])
def test_layer_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, tty: bool) -> None:
    class Stderr:
        def isatty(self) -> bool:
            return tty

        def write(self, text: str) -> int:
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stderr", Stderr())
    bar = ModelWeightLoader.layer_progress(None, 32)  # type: ignore[arg-type]
    assert bar.disable is (not tty)  # type: ignore[attr-defined]


def test_generation_config_sampling_defaults(tmp_path: Path) -> None:
    assert sampling_defaults(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True, "min_p": None})
    )
    assert sampling_defaults(tmp_path) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    (tmp_path / "generation_config.json").write_text("{oops")
    assert sampling_defaults(tmp_path) == {}


def test_request_over_generation_config_over_built_in() -> None:
    defaults = {"temperature": 0.6, "top_k": 20, "repetition_penalty": 1.1}
    omitted = sampling_params(SamplerFields(), max_tokens=4, defaults=defaults)
    assert (omitted.temperature, omitted.top_k, omitted.repetition_penalty, omitted.top_p) == (0.6, 20, 1.1, 1.0)
    given = sampling_params(SamplerFields(temperature=0.0, top_k=5), max_tokens=4, defaults=defaults)
    assert (given.temperature, given.top_k, given.repetition_penalty) == (0.0, 5, 1.1)
    plain = sampling_params(SamplerFields(), max_tokens=4)
    assert (plain.temperature, plain.top_k) == (1.0, 0)


def test_unknown_model_is_a_404_naming_the_served_ones(scripted: ScriptedFactory) -> None:
    server = scripted({"[ask]": "one"})
    server.state.config.model_names = ["main", "alias"]
    sdk = server.openai()
    assert sdk.chat.completions.create(model="alias", messages=ASK).model == "main"  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="claude-sonnet-4-5", messages=ASK)  # type: ignore[arg-type]
    message = caught.value.body["message"]  # type: ignore[index]
    assert "'claude-sonnet-4-5'" in message and "'main', 'alias'" in message and "--accept-any-model-name" in message


def test_accept_any_model_name(scripted: ScriptedFactory) -> None:
    server = scripted({"[ask]": "one"}, accept_any_model_name=True)
    reply = server.anthropic().messages.create(
        model="claude-haiku-4-5", max_tokens=8, messages=[{"role": "user", "content": "[ask] hi"}]
    )
    assert isinstance(reply, anthropic.types.Message) and reply.model == "scripted"
    assert server.openai().models.retrieve("gpt-4o").id == "gpt-4o"


def test_metrics_carry_the_model_name(scripted: ScriptedFactory) -> None:
    server = scripted({"[ask]": "one"})
    server.state.config.model_names = ["served", "other"]
    server.openai().chat.completions.create(model="other", messages=ASK)  # type: ignore[arg-type]
    samples = [line for line in httpx.get(server.url + "/metrics").text.splitlines() if line.startswith("atlas_")]
    assert len(samples) > 20
    assert all('model_name="served"' in line for line in samples), [s for s in samples if "served" not in s]


@pytest.mark.parametrize(
    ("argv", "name", "value"),
    [
        (["--max-model-len", "512"], "max_seq_len", 512),
        (["--model-name", "a", "b"], "served_model_name", ["a", "b"]),
        (["--bind", "0.0.0.0"], "host", "0.0.0.0"),
        (["--enable-log-requests"], "log_requests", True),
        (["--generation-config", "none"], "generation_config", "none"),
        (["--accept-any-model-name"], "accept_any_model_name", True),
    ],
)
def test_flag_aliases(argv: list[str], name: str, value: object) -> None:
    assert serve_settings(build_parser().parse_args(["serve", *argv]), {})[name] == value


def test_unknown_flag_suggests_the_nearest(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--max-num-sequences", "4"])
    assert "did you mean --max-num-seqs?" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--kv-cache-dtype", "fp4"])
    assert "--kv-cache-dtype: expected one of auto, bf16, fp8, got 'fp4'" in capsys.readouterr().err


def test_kv_cache_dtype_from_flag_and_environment() -> None:
    parsed = build_parser().parse_args(["serve", "--kv-cache-dtype", "fp8"])
    assert serve_settings(parsed, {})["kv_cache_dtype"] == "fp8"
    assert (
        serve_settings(build_parser().parse_args(["serve"]), {"ATLAS_KV_CACHE_DTYPE": "bf16"})["kv_cache_dtype"]
        == "bf16"
    )
    assert serve_settings(build_parser().parse_args(["serve"]), {})["kv_cache_dtype"] == "auto"
