"""The walk-through of docs/architecture.md ("Writing a family plugin that needs a new op and a new
tool-call format") is the source of a plugin, built and checked here, so the page cannot drift from
the API.

How the page becomes a plugin: each fenced ``python`` block of that section whose first line is a
comment naming a file (``# atlas_model_nimbus/ops.py``) is that file, blocks naming one file joined in
order; a package folder without an ``__init__.py`` block gets an empty one (the page's layout says
so). The ``toml`` block is the project's ``pyproject.toml``: its name, version and ``atlas`` entry
points make the ``.dist-info`` that discovery reads, so the plugin is installed the way pip installs
it (`tests.plugin_site`). ``console`` blocks of ``atlas plugins`` list lines that its output must
contain, in order (``...`` stands for lines left out). The files under ``tests/`` are the plugin's
own tests, run by pytest in a separate process against the installed plugin.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from atlas_core import LLM, SamplingParams
from atlas_core.backends.op_registry import resolve_op_group
from atlas_core.backends.select import select_backend
from atlas_core.errors import PluginError
from atlas_core.model.transformer import PreNormDecoderLayer
from atlas_core.options.resolve import Settings
from atlas_core.parsing import ToolCallStart, tool_parser_names
from atlas_core.plugins import PluginInfo, PluginRegistry, get_registry, load_plugins
from atlas_core.server.chat_prompt import ChatSetup
from atlas_core.server.output_parsing import ParserSpec
from atlas_core.server.settings import BEFORE_LOADING, SERVE_OPTIONS, parser_name
from atlas_core.server.state import ServerConfig, ServerState
from atlas_core.testing.cli import run_plugins
from atlas_core.testing.parsers import TOOLS
from tests.plugin_site import clean_env, install_plugin, site  # noqa: F401 (fixtures)

DOC = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"
HEADING = "## Writing a family plugin that needs a new op and a new tool-call format"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.M | re.S)
FILE_COMMENT = re.compile(r"# ([\w./-]+\.py)[ \t]*\n")
PLUGIN_FILES = {
    "atlas_model_nimbus/plugin.py",
    "atlas_model_nimbus/ops.py",
    "atlas_model_nimbus/native.py",
    "atlas_model_nimbus/layers.py",
    "atlas_model_nimbus/loader.py",
    "atlas_model_nimbus/parsers.py",
    "tests/test_nimbus.py",
}
"""The files the walk-through's layout promises a block for (``__init__.py`` is empty)."""
MISSPELT = ('backend="numpy"', 'backnd="numpy"')
"""The mistake the walk-through shows: a misspelt metadata key of ``register_op_implementations``."""


@dataclass(frozen=True)
class Walkthrough:
    """The plugin the walk-through describes: ``files`` (relative path -> source, package and tests),
    ``pyproject`` (its ``pyproject.toml`` excerpt) parsed as ``project``, and ``listings`` (the lines
    each ``atlas plugins`` console block shows, without the command and ``...``)."""

    files: dict[str, str]
    project: dict[str, Any]
    pyproject: str
    listings: list[list[str]]

    @property
    def distribution(self) -> str:
        return str(self.project["project"]["name"])

    @property
    def version(self) -> str:
        return str(self.project["project"]["version"])

    @property
    def entry_points(self) -> dict[str, str]:
        return dict(self.project["project"]["entry-points"]["atlas"])

    def listing(self, *, with_error: bool) -> list[str]:
        """The one console listing that shows an ``error:`` line (``with_error``), or the one that does not."""
        matches = [lines for lines in self.listings if any("error:" in line for line in lines) == with_error]
        assert len(matches) == 1, f"expected one atlas plugins listing with_error={with_error}, got {matches}"
        return matches[0]


def read_walkthrough(text: str) -> Walkthrough:
    """The walk-through section of ``text`` (docs/architecture.md) as a `Walkthrough`."""
    assert HEADING in text, f"{DOC} has no section {HEADING!r}"
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    section = text[start : None if end < 0 else end]
    files: dict[str, str] = {}
    tomls: list[str] = []
    listings: list[list[str]] = []
    for language, body in FENCE.findall(section):
        if language == "python":
            named = FILE_COMMENT.match(body)
            assert named, f"a python block of the walk-through does not start with '# <file>.py':\n{body[:200]}"
            files[named.group(1)] = files.get(named.group(1), "") + body
        elif language == "toml":
            tomls.append(body)
        elif language == "console" and body.startswith("$ atlas plugins\n"):
            listings.append([line for line in body.splitlines()[1:] if line.strip() not in ("", "...")])
    assert len(tomls) == 1, f"expected one toml block (pyproject.toml), found {len(tomls)}"
    return Walkthrough(files, tomllib.loads(tomls[0]), tomls[0], listings)


WALKTHROUGH = read_walkthrough(DOC.read_text(encoding="utf-8"))


def install(site: Path, walkthrough: Walkthrough, replaced: dict[str, str] | None = None) -> None:
    """Install the walk-through's package into ``site`` with its ``.dist-info``; ``replaced`` overrides
    the source of some files (path -> source)."""
    sources = {**walkthrough.files, **(replaced or {})}
    for path, source in sources.items():
        if path.startswith("tests/"):
            continue
        target = site / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source, encoding="utf-8")
        init = target.parent / "__init__.py"
        if not init.exists():
            init.write_text("", encoding="utf-8")
    install_plugin(site, walkthrough.distribution, walkthrough.version, walkthrough.entry_points, {})


def plugin_info(registry: PluginRegistry, distribution: str) -> PluginInfo:
    matches = [p for p in registry.plugins if p.distribution == distribution]
    assert len(matches) == 1, [p.label for p in registry.plugins]
    return matches[0]


def assert_lines_in_order(expected: list[str], output: str) -> None:
    """Every line of ``expected`` is a line of ``output``, in this order."""
    lines = output.splitlines()
    position = 0
    for line in expected:
        assert line in lines[position:], f"`atlas plugins` does not show (after line {position}):\n{line}\n\n{output}"
        position = lines.index(line, position) + 1


def clamped_silu_mul_oracle(x: np.ndarray, limit: float) -> np.ndarray:
    """``silu(min(gate, limit)) * clip(up, -limit, limit)`` of ``x = [gate | up]``, in float64."""
    gate, up = np.split(x.astype(np.float64), 2, axis=-1)
    gate = np.minimum(gate, limit)
    with np.errstate(over="ignore"):  # a gate of -1e4: exp overflows to inf, silu is -0
        return gate / (1 + np.exp(-gate)) * np.clip(up, -limit, limit)


@pytest.fixture
def nimbus(site: Path) -> Iterator[Walkthrough]:
    """The walk-through's plugin, installed; the process-wide registry is rebuilt with it (and again
    without it afterwards), as a server started with the plugin installed would see it."""
    install(site, WALKTHROUGH)
    get_registry.cache_clear()
    yield WALKTHROUGH
    get_registry.cache_clear()


def test_the_section_holds_the_whole_plugin() -> None:
    assert set(WALKTHROUGH.files) == PLUGIN_FILES
    assert WALKTHROUGH.entry_points == {"nimbus": "atlas_model_nimbus.plugin"}
    assert len(WALKTHROUGH.listings) == 2


def test_the_plugin_registers_and_is_listed_as_the_page_shows(
    nimbus: Walkthrough, capsys: pytest.CaptureFixture[str]
) -> None:
    info = plugin_info(load_plugins(), nimbus.distribution)
    assert info.errors == []
    assert {(r.kind, r.name) for r in info.registrations} == {
        ("model", "nimbus"),
        ("layer", "nimbus_mlp"),
        ("op_group", "nimbus"),
        ("op_impl", "nimbus"),
        ("tool_parser", "nimbus"),
    }
    assert_lines_in_order(nimbus.listing(with_error=False), run_plugins(capsys))
    check = json.loads(run_plugins(capsys, "--json", "--check"))
    [listed] = [p for p in check["plugins"] if p["distribution"] == nimbus.distribution]
    assert [r["check"]["status"] for r in listed["registrations"]] == ["ok"] * 5, listed


def test_the_op_group_runs_on_numpy_and_its_native_implementation_is_preferred(nimbus: Walkthrough) -> None:
    registry = load_plugins()
    group, native = registry.load("op_group", "nimbus"), registry.load("op_impl", "nimbus")
    assert native is not group and issubclass(native, group)
    backend = select_backend(registry, "numpy")
    ops = backend.ops(group)
    assert type(ops) is native and ops.backend is backend
    assert resolve_op_group(registry, "cuda", group) is group  # no native one there: the host fallback
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 2 * 12)) * 4).astype(np.float32)
    x[0, :3] = [-1e4, 1e4, 0.0]  # a saturated gate both ways, and zero
    for limit in (7.0, 0.5):
        for implementation in (ops, group(backend)):  # the native one, then the host fallback
            before = x.copy()
            got = backend.to_numpy(implementation.clamped_silu_mul(backend.from_numpy(x), limit))
            assert got.dtype == np.float32 and got.shape == (5, 12)
            np.testing.assert_allclose(got, clamped_silu_mul_oracle(x, limit), rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(x, before)


def test_the_family_builds_its_mlp_from_the_layer_and_runs_it_through_the_op_group(
    nimbus: Walkthrough, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = get_registry()
    config: dict[str, Any] = {
        "model_type": "nimbus",
        "architectures": ["NimbusForCausalLM"],
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "vocab_size": 64,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "swiglu_limit": 0.5,  # small enough that the clamp matters for these weights
    }
    folder = tmp_path / "nimbus-tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    shapes = registry.load("model", "nimbus").checkpoint_shapes(config)
    weights = {name: rng.normal(0.0, 0.5, shape).astype(np.float32) for name, shape in shapes.items()}
    save_file(weights, str(folder / "model.safetensors"))

    native = registry.load("op_impl", "nimbus")
    calls: list[tuple[int, ...]] = []
    original = native.clamped_silu_mul

    def counted(self: Any, x: Any, limit: float) -> Any:
        calls.append(tuple(x.shape))
        return original(self, x, limit)

    monkeypatch.setattr(native, "clamped_silu_mul", counted)
    llm = LLM(folder, backend="numpy", max_seq_len=32, kv_cache_memory_gib=0.01)
    assert llm.loaded.family_defaults == {"tool_call_parser": "nimbus"}
    layers = llm.loaded.model.layers
    assert all(isinstance(layer, PreNormDecoderLayer) for layer in layers)
    mlps = [layer.ffn for layer in layers if isinstance(layer, PreNormDecoderLayer)]
    assert all(type(mlp) is registry.load("layer", "nimbus_mlp") for mlp in mlps)

    [output] = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=4))
    assert len(output.outputs[0].token_ids) == 4
    assert len(calls) >= 4 * len(mlps) and len(calls) % len(mlps) == 0  # every layer, every forward
    assert all(shape[-1] == 2 * config["intermediate_size"] for shape in calls)

    x = rng.standard_normal((3, config["hidden_size"])).astype(np.float32)
    prefix = "model.layers.1.mlp."
    gate_up = np.concatenate([weights[prefix + "gate_proj.weight"], weights[prefix + "up_proj.weight"]])
    hidden = clamped_silu_mul_oracle(x.astype(np.float64) @ gate_up.T, config["swiglu_limit"])
    want = hidden @ weights[prefix + "down_proj.weight"].T
    np.testing.assert_allclose(llm.backend.to_numpy(mlps[1](llm.backend.from_numpy(x))), want, rtol=1e-4, atol=1e-5)


def test_the_family_default_tool_parser_reads_calls_the_way_the_server_does(nimbus: Walkthrough) -> None:
    """The server's own path: the family's ``defaults`` fill ``--tool-call-parser`` (`Settings`, as
    ``atlas serve`` does once the model is loaded), and `ParserSpec` makes the parser of each completion."""
    assert "nimbus" in tool_parser_names()
    settings = Settings(SERVE_OPTIONS, {}, env={})
    family_defaults = get_registry().get("model", "nimbus").metadata["defaults"]
    assert settings.apply_family_defaults(family_defaults, fixed=BEFORE_LOADING) == []
    assert settings.sources["tool_call_parser"] == "family"
    tool_call_parser = parser_name(settings["tool_call_parser"])
    state = ServerState(ServerConfig(model_names=["nimbus"], tool_call_parser=tool_call_parser))
    setup = ChatSetup(messages=[{"role": "user", "content": "Weather in Paris and Rome?"}], tools=TOOLS)
    completion = ParserSpec(state, setup, prompt_text="").new()

    paris, rome = '<call:get_weather>{"city": "Paris"}</call>', '<call:get_weather>{"city": "Rome", "days": 3}</call>'
    text = f"Let me check.\n{paris}{rome}"
    events = [event for start in range(0, len(text), 5) for event in completion.feed(text[start : start + 5])]
    tail, message = completion.finish()
    assert message.content == "Let me check."
    assert [(call.name, json.loads(call.arguments)) for call in message.tool_calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome", "days": 3}),
    ]
    assert message.problems == []
    assert [event.name for event in events + tail if isinstance(event, ToolCallStart)] == ["get_weather"] * 2

    flagged = Settings(SERVE_OPTIONS, {"tool_call_parser": "hermes"}, env={})
    flagged.apply_family_defaults(family_defaults, fixed=BEFORE_LOADING)
    assert (flagged["tool_call_parser"], flagged.sources["tool_call_parser"]) == ("hermes", "flag")


def test_a_misspelt_metadata_key_fails_that_hook_naming_the_plugin(
    site: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks = WALKTHROUGH.files["atlas_model_nimbus/plugin.py"]
    assert hooks.count(MISSPELT[0]) == 1
    install(site, WALKTHROUGH, {"atlas_model_nimbus/plugin.py": hooks.replace(*MISSPELT)})

    info = plugin_info(load_plugins(), WALKTHROUGH.distribution)
    [error] = info.errors
    hook_failed = "register_op_implementations failed: PluginError: "
    assert error.startswith(hook_failed)
    assert f"{WALKTHROUGH.distribution} {WALKTHROUGH.version}" in error and "'backnd'" in error
    assert {r.kind for r in info.registrations} == {"model", "layer", "op_group", "tool_parser"}
    assert_lines_in_order(WALKTHROUGH.listing(with_error=True), run_plugins(capsys))

    monkeypatch.setenv("ATLAS_PLUGINS_STRICT", "1")
    with pytest.raises(PluginError, match=re.escape(error.removeprefix(hook_failed))):
        load_plugins()


def test_the_plugins_own_tests_pass_against_it(nimbus: Walkthrough, site: Path, tmp_path: Path) -> None:
    """The page's ``tests/`` run by pytest in a project folder of their own, in a fresh process that
    finds the plugin only as an installed distribution (strict: a broken registration fails the run)."""
    project = tmp_path / "atlas-model-nimbus"
    (project / "tests").mkdir(parents=True)
    (project / "pyproject.toml").write_text(nimbus.pyproject, encoding="utf-8")
    for path, source in nimbus.files.items():
        if path.startswith("tests/"):
            (project / path).write_text(source, encoding="utf-8")
    env = {**os.environ, "ATLAS_PLUGINS_STRICT": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rs", "tests"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    assert re.search(r"test_clamped_silu_mul\[[^\]]*numpy[^\]]*\] PASSED", report), report
    assert re.search(r"test_tool_call_format PASSED", report), report
