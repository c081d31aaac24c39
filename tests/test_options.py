"""Settings declared on config dataclasses: parsers by type, flags and help, environment
variables, precedence, and the error type of bad values."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from atlas_core.engine.config import ENGINE_OPTIONS, EngineConfig
from atlas_core.errors import ConfigError, InvalidRequestError
from atlas_core.options.declare import check_choices, option, options_of
from atlas_core.options.flags import add_flags, parsed_values
from atlas_core.options.resolve import Settings
from atlas_core.server.settings import SERVE_OPTIONS

DOCS = Path(__file__).resolve().parents[1] / "docs"


@dataclass(frozen=True)
class Sample:
    """Every kind of setting once, plus an internal field."""

    path: str | None = option(None, positional=True, help="where", default_help="here")
    count: int = option(3, help="how many")
    ratio: float = option(0.5, help="how much")
    fast: bool = option(True, help="go fast")
    mode: Literal["a", "b"] = option("a", help="which mode")
    names: list[str] = option(default_factory=list, metavar="NAME", help="names")
    keys: list[str] = option(default_factory=list, repeat=True, flag="key", help="keys")
    extra: dict[str, Any] = option(default_factory=dict, help="extra JSON")
    internal: int = 7


SAMPLE = options_of(Sample)


def parse(argv: list[str], *, with_defaults: bool) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="sample")
    add_flags(parser, SAMPLE, with_defaults=with_defaults)
    return parsed_values(parser.parse_args(argv), SAMPLE)


def test_declaration_gives_flag_env_variable_and_help() -> None:
    by_name = {opt.name: opt for opt in SAMPLE}
    assert "internal" not in by_name
    assert (by_name["count"].flag_name, by_name["count"].env_name) == ("count", "ATLAS_COUNT")
    assert (by_name["keys"].flag_name, by_name["keys"].env_name) == ("key", "ATLAS_KEY")
    assert by_name["mode"].choices == ("a", "b")
    helps = {name: opt.help_text for name, opt in by_name.items()}
    assert helps["path"] == "where (default: here)"
    assert helps["ratio"] == "how much (default: 0.5)"
    assert helps["fast"] == "go fast (default: on)"
    assert helps["names"] == "names (default: none)"
    assert helps["extra"] == "extra JSON (default: {})"


def test_flags_with_and_without_defaults() -> None:
    assert parse([], with_defaults=True) == {
        "path": None,
        "count": 3,
        "ratio": 0.5,
        "fast": True,
        "mode": "a",
        "names": [],
        "keys": [],
        "extra": {},
    }
    assert parse([], with_defaults=False) == {}
    given = parse(
        [
            "p",
            "--count",
            "4",
            "--no-fast",
            "--mode",
            "b",
            "--names",
            "x",
            "y",
            "--key",
            "k1",
            "--key",
            "k2",
            "--extra",
            '{"t": 1}',
        ],
        with_defaults=False,
    )
    assert given == {
        "path": "p",
        "count": 4,
        "fast": False,
        "mode": "b",
        "names": ["x", "y"],
        "keys": ["k1", "k2"],
        "extra": {"t": 1},
    }


def test_bad_flag_values_are_parser_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["--count", "x"], "argument --count: expected an integer, got 'x'"),
        (["--mode", "c"], "argument --mode: expected one of a, b, got 'c'"),
    ]:
        with pytest.raises(SystemExit):
            parse(argv, with_defaults=True)
        assert message in capsys.readouterr().err


def test_precedence_flag_env_family_default() -> None:
    env = {"ATLAS_COUNT": "5", "ATLAS_RATIO": "0.25", "ATLAS_FAST": "no", "ATLAS_KEY": "a, b,", "ATLAS_MODE": ""}
    settings = Settings(SAMPLE, {"count": 9}, env)
    assert (settings["count"], settings.sources["count"]) == (9, "flag")
    assert (settings["ratio"], settings.sources["ratio"]) == (0.25, "env")
    assert settings["fast"] is False and settings["keys"] == ["a", "b"]
    assert (settings["mode"], settings.sources["mode"]) == ("a", "default")  # an empty variable is unset
    family = {"count": 1, "ratio": 1.0, "mode": "b", "path": "x", "colour": 1}
    unknown = settings.apply_family_defaults(family, fixed=["path"])
    assert unknown == ["path", "colour"]
    assert (settings["mode"], settings.sources["mode"]) == ("b", "family")
    assert (settings["count"], settings["ratio"], settings["path"]) == (9, 0.25, None)
    assert settings.of(Sample)["mode"] == "b"


def test_bad_environment_value_is_a_config_error_naming_variable_and_accepted_values() -> None:
    with pytest.raises(ConfigError, match=r"^environment variable ATLAS_MODE: expected one of a, b, got 'c'$"):
        Settings(SAMPLE, {}, {"ATLAS_MODE": "c"})
    not_json = r"^environment variable ATLAS_EXTRA: expected a JSON object, got text that is not valid JSON"
    with pytest.raises(ConfigError, match=not_json):
        Settings(SAMPLE, {}, {"ATLAS_EXTRA": "{oops"})


def test_a_setting_type_without_parser_is_refused_at_declaration() -> None:
    @dataclass
    class Broken:
        sizes: list[int] = option(default_factory=list, help="sizes")

    with pytest.raises(TypeError, match="list settings hold strings"):
        options_of(Broken)
    with pytest.raises(ValueError, match="declared more than once: count"):
        options_of(Sample, Sample)


def test_engine_config_errors_are_config_errors_not_request_errors() -> None:
    for kwargs, message in [
        ({"max_num_seqs": 0}, "max_num_seqs must be at least 1, got 0"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy must be one of fifo, slo, got 'lifo'"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in"),
    ]:
        with pytest.raises(ConfigError, match=message) as caught:
            EngineConfig(**kwargs)
        assert not isinstance(caught.value, InvalidRequestError)
    check_choices(Sample())


def test_engine_settings_are_the_engine_config_fields_with_options() -> None:
    names = [opt.name for opt in ENGINE_OPTIONS]
    assert names[:2] == ["model", "backend"]
    assert set(names[2:]) == {
        "max_seq_len",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_prefill_tokens",
        "batch_invariant",
        "enable_prefix_caching",
        "scheduling_policy",
        "gpu_memory_utilization",
        "kv_cache_memory_gib",
        "kv_cache_dtype",
        "kv_high_precision_layers",
        "kv_cache_scales",
        "gguf_weights",
        "load_format",
        "max_state_snapshots",
        "speculative_config",
        "num_speculative_tokens",
        "preemption_mode",
        "swap_space_gb",
        "kv_spill_dir",
        "kv_spill_gb",
        "kv_spill_persist",
        "tensor_parallel_size",
        "expert_parallel_size",
        "comm_backend",
        "comm_timeout",
        "rank",
        "world_size",
        "master_addr",
        "master_port",
        "distributed_executor_backend",
        "ray_address",
    }
    assert all(getattr(EngineConfig(), opt.name) == opt.default for opt in ENGINE_OPTIONS[2:])


def test_server_docs_list_every_serve_setting() -> None:
    text = (DOCS / "server.md").read_text(encoding="utf-8")
    missing = [opt.env_name for opt in SERVE_OPTIONS if f"`{opt.env_name}`" not in text]
    flags = [opt.flag_name for opt in SERVE_OPTIONS if not opt.info.positional]
    missing += [flag for flag in flags if f"--{flag}" not in text and f"--[no-]{flag}" not in text]
    assert not missing, f"docs/server.md does not list: {', '.join(missing)}"
