"""``atlas serve``: flags and their defaults, settings precedence (flag > env > family > built-in),
family defaults from the plugin registration, the exposure warning, and a real run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from atlas_core.cli import build_parser
from atlas_core.errors import AtlasError, ConfigError
from atlas_core.options.resolve import Settings
from atlas_core.server.cli_serve import _attach_model, serve_settings
from atlas_core.server.settings import SERVE_OPTIONS, ServeOptions
from atlas_core.server.state import ServerConfig, ServerState
from atlas_core.tokenizer import Tokenizer
from tests.conftest import TINY

ISSUE_FLAGS = [
    "--host",
    "--port",
    "--served-model-name",
    "--backend",
    "--max-seq-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--max-prefill-tokens",
    "--gpu-memory-utilization",
    "--enable-prefix-caching",
    "--scheduling-policy",
    "--tool-call-parser",
    "--reasoning-parser",
    "--chat-template",
    "--default-chat-template-kwargs",
    "--api-key",
    "--api-keys-file",
    "--request-timeout",
    "--max-body-bytes",
]


def serve_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    return capsys.readouterr().out


def test_help_lists_every_flag_with_its_default_and_env_variable(capsys: pytest.CaptureFixture[str]) -> None:
    text = serve_help(capsys)
    options = text.split("options:")[1].split("Every option can also be set")[0]
    entries = [" ".join(block.split()) for block in ("\n" + options).split("\n  -")[1:]]
    assert len(entries) > len(ISSUE_FLAGS)
    for entry in entries:
        if not entry.startswith("h, --help"):
            assert "(default: " in entry, entry
    for flag in ISSUE_FLAGS:
        assert any(entry.startswith(flag[1:]) or f", {flag}" in entry for entry in entries), flag
    for opt in SERVE_OPTIONS:
        assert opt.env_name in text


def parse_serve(*argv: str, env: dict[str, str]) -> Settings:
    """The settings of ``atlas serve ARGV`` in the environment ``env``."""
    return serve_settings(build_parser().parse_args(["serve", *argv]), env)


def test_precedence_flag_env_family_default() -> None:
    env = {
        "ATLAS_PORT": "7000",
        "ATLAS_HOST": "0.0.0.0",
        "ATLAS_MAX_NUM_SEQS": "4",
        "ATLAS_REASONING_PARSER": "deepseek_r1",
        "ATLAS_ENABLE_PREFIX_CACHING": "off",
        "ATLAS_API_KEY": "a,b",
        "ATLAS_DEFAULT_CHAT_TEMPLATE_KWARGS": '{"x": 1}',
    }
    settings = parse_serve("--port", "9000", "--max-num-seqs", "8", env=env)
    assert (settings["port"], settings.sources["port"]) == (9000, "flag")
    assert (settings["host"], settings.sources["host"]) == ("0.0.0.0", "env")
    assert settings["max_num_seqs"] == 8
    assert settings["enable_prefix_caching"] is False and settings["api_key"] == ["a", "b"]
    assert settings["default_chat_template_kwargs"] == {"x": 1}
    assert (settings["max_num_batched_tokens"], settings.sources["max_num_batched_tokens"]) == (None, "default")
    unknown = settings.apply_family_defaults(
        {"tool_call_parser": "hermes", "reasoning_parser": "qwen3", "max_num_batched_tokens": 512, "colour": "red"}
    )
    assert unknown == ["colour"]
    assert (settings["tool_call_parser"], settings.sources["tool_call_parser"]) == ("hermes", "family")
    assert (settings["reasoning_parser"], settings.sources["reasoning_parser"]) == ("deepseek_r1", "env")
    assert settings["max_num_batched_tokens"] == 512
    assert settings["request_timeout"] is None and settings["max_body_bytes"] == ServeOptions.max_body_bytes


@pytest.mark.parametrize(
    ("variable", "value", "accepted"),
    [
        ("ATLAS_PORT", "eighty", "expected an integer, got 'eighty'"),
        ("ATLAS_ENABLE_PREFIX_CACHING", "maybe", "expected one of 1/0, true/false, yes/no, on/off, got 'maybe'"),
        ("ATLAS_SCHEDULING_POLICY", "lifo", "expected one of fifo, slo, got 'lifo'"),
        ("ATLAS_GPU_MEMORY_UTILIZATION", "most", "expected a number, got 'most'"),
        ("ATLAS_DEFAULT_CHAT_TEMPLATE_KWARGS", "[1]", "expected a JSON object, got a JSON list"),
    ],
)
def test_bad_environment_value_names_the_variable_and_what_it_accepts(variable: str, value: str, accepted: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_serve(env={variable: value})
    assert str(caught.value) == f"environment variable {variable}: {accepted}"


def test_bad_flag_value_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_serve("--port", "eighty", env={})
    assert "argument --port: expected an integer, got 'eighty'" in capsys.readouterr().err


@pytest.fixture
def qwen3_folder(tmp_path: Path, chatml_tokenizer: Tokenizer) -> Path:
    """The tiny qwen3 checkpoint with a tokenizer added (enough to start serving it)."""
    folder = tmp_path / "qwen3"
    shutil.copytree(TINY / "qwen3", folder)
    chatml_tokenizer.backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": chatml_tokenizer.chat_template, "eos_token": "<|im_end|>"})
    )
    return folder


@pytest.mark.parametrize(
    ("argv", "env", "tool_parser", "reasoning_parser"),
    [
        ([], {}, "hermes", "qwen3"),  # the qwen3 family's registration defaults
        (["--tool-call-parser", "none"], {}, None, "qwen3"),
        (
            ["--tool-call-parser", "json"],
            {"ATLAS_REASONING_PARSER": "deepseek_r1", "ATLAS_TOOL_CALL_PARSER": "mistral"},
            "json",
            "deepseek_r1",
        ),
    ],
)
def test_family_defaults_reach_the_server(
    qwen3_folder: Path, argv: list[str], env: dict[str, str], tool_parser: str | None, reasoning_parser: str | None
) -> None:
    settings = parse_serve(str(qwen3_folder), "--backend", "numpy", "--max-seq-len", "256", *argv, env=env)
    state = ServerState(ServerConfig())
    description = _attach_model(settings, state)
    try:
        assert (state.config.tool_call_parser, state.config.reasoning_parser) == (tool_parser, reasoning_parser)
        assert state.model_name == "qwen3" and state.runtime is not None and state.runtime.max_seq_len == 256
        assert "kv_capacity=" in description and "sequences of max_seq_len=256" in description
    finally:
        state.runtime.engine.shutdown()  # type: ignore[union-attr]


def test_unknown_parser_name_stops_startup(qwen3_folder: Path) -> None:
    settings = parse_serve(
        str(qwen3_folder), "--backend", "numpy", "--max-seq-len", "256", "--tool-call-parser", "hermès", env={}
    )
    with pytest.raises(AtlasError, match="valid names: .*hermes"):
        _attach_model(settings, ServerState(ServerConfig()))


def atlas_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "atlas_core.cli", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", **(env or {})},
    )


def test_exposed_without_auth_warns_loudly() -> None:
    process = atlas_serve("--host", "0.0.0.0", "--port", "0", "/no/such/model")
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2
    assert "WARNING: listening on 0.0.0.0 WITHOUT authentication" in stderr and "--api-key" in stderr
    assert "no such model folder" in stderr and "Traceback" not in stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_the_default_model(default_llm: object) -> None:
    port = free_port()
    process = atlas_serve(
        "--port",
        str(port),
        "--max-seq-len",
        "512",
        "--kv-cache-memory-gib",
        "0.1",
        env={"ATLAS_SERVED_MODEL_NAME": "smol,alias"},
    )
    try:
        statuses = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            except httpx.TransportError:
                time.sleep(0.05)
                continue
            statuses.append((health.status_code, health.json()["status"]))
            if health.status_code == 200:
                break
            time.sleep(0.05)
        assert statuses[-1] == (200, "ok")
        assert set(statuses[:-1]) <= {(503, "loading")}
        ready = process.stdout.readline()  # type: ignore[union-attr]
        assert ready.startswith(f"atlas ready: http://127.0.0.1:{port} model=smol backend=numpy kv_capacity=")
        assert "sequences of max_seq_len=512" in ready
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
        assert [m["id"] for m in models["data"]] == ["smol"]
        chat = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=60,
            json={
                "model": "alias",
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "temperature": 0,
                "max_tokens": 12,
            },
        )
        assert "Paris" in chat.json()["choices"][0]["message"]["content"]
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    # uvicorn drains, then re-raises the signal it caught, as a process killed by it would end
    assert process.returncode == -signal.SIGTERM, stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("argv", "expected"), [([], {"temperature": 0.6, "top_k": 20}), (["--generation-config", "none"], {})]
)
def test_generation_config_reaches_the_server(qwen3_folder: Path, argv: list[str], expected: dict[str, float]) -> None:
    (qwen3_folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_k": 20, "eos": 1}))
    settings = parse_serve(str(qwen3_folder), "--backend", "numpy", "--max-seq-len", "256", *argv, env={})
    state = ServerState(ServerConfig())
    description = _attach_model(settings, state)
    try:
        assert state.config.generation_defaults == expected
        assert ("generation_config=" in description) is bool(expected)
    finally:
        state.runtime.engine.shutdown()  # type: ignore[union-attr]
