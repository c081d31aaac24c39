"""Bad model folders, files and requests give clear errors naming the file and the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.backends.base import Backend
from atlas_core.backends.numpy_backend import NumpyBackend
from atlas_core.engine.config import EngineConfig, kv_budget
from atlas_core.errors import ConfigError, InvalidRequestError, ModelLoadError, UnsupportedArchitectureError
from tests.conftest import TINY, use_hub_cache


@pytest.fixture
def llama_copy(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(TINY / "llama", folder)
    return folder


def test_missing_folder() -> None:
    with pytest.raises(ModelLoadError, match="no such model folder or .gguf file"):
        LLM("/nonexistent/model-folder")


def test_missing_config(llama_copy: Path) -> None:
    (llama_copy / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="config.json is missing"):
        LLM(llama_copy)


def test_invalid_config_json(llama_copy: Path) -> None:
    (llama_copy / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"config\.json: invalid JSON"):
        LLM(llama_copy)


def test_missing_weights(llama_copy: Path) -> None:
    (llama_copy / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weights found"):
        LLM(llama_copy)


def test_truncated_weights(llama_copy: Path) -> None:
    weights = llama_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: tensor .* ends at byte .*truncated"):
        LLM(llama_copy)


def test_garbage_weights(llama_copy: Path) -> None:
    (llama_copy / "model.safetensors").write_bytes(b"\x00\x01not a safetensors file at all" * 10)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors: corrupt safetensors header"):
        LLM(llama_copy)


def test_missing_tensor(llama_copy: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(llama_copy / "model.safetensors")
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, llama_copy / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"weight 'model\.layers\.1\.mlp\.down_proj\.weight' is missing"):
        LLM(llama_copy)


def test_missing_shard(tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    shutil.copytree(TINY / "llama_linear_rope", folder)
    shard = sorted(folder.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ModelLoadError, match=f"lists shards that are missing: .*{shard.name}"):
        LLM(folder)


def test_unsupported_architecture(llama_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A known family whose package is not installed (here: left out by the plugin allowlist)."""
    from atlas_core.plugins import load_plugins

    monkeypatch.setenv("ATLAS_PLUGINS", "atlas-model-llama")
    monkeypatch.setattr("atlas_core.engine.llm.get_registry", load_plugins)
    config = json.loads((llama_copy / "config.json").read_text())
    config.update(model_type="gemma3_text", architectures=["Gemma3ForCausalLM"])
    (llama_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        UnsupportedArchitectureError, match=r"'gemma3_text'.*install atlas-model-gemma.*installed families: .*llama"
    ):
        LLM(llama_copy)


def test_unknown_architecture(llama_copy: Path) -> None:
    config = json.loads((llama_copy / "config.json").read_text())
    config.update(model_type="brand_new_thing")
    (llama_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedArchitectureError, match="no known Atlas package supports it yet"):
        LLM(llama_copy)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"GGUF but not really" * 4)
    with pytest.raises(ModelLoadError, match="model.gguf"):
        LLM(bogus)


def test_non_gguf_file_suffix(tmp_path: Path) -> None:
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="must be a .gguf file"):
        LLM(other)


def test_offline_hub_repo_not_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    use_hub_cache(monkeypatch, tmp_path / "empty-cache", offline=True)
    with pytest.raises(ModelLoadError, match="not in the Hugging Face cache and HF_HUB_OFFLINE is set"):
        LLM("some-org/some-model")


def test_kv_budget_too_small_names_the_numbers() -> None:
    with pytest.raises(Exception, match=r"holds \d+ blocks .* needs \d+ blocks .* Set kv_cache_memory_gib=\d"):
        LLM(TINY / "llama", kv_cache_memory_gib=1e-5, max_seq_len=512)


class _DeviceMemory:
    """A backend's `device_memory` alone: 8 GiB total, 2 GiB of it free."""

    def device_memory(self) -> tuple[int, int]:
        return 2 * 2**30, 8 * 2**30


def test_kv_cache_memory_gib_sizes_the_kv_cache_on_any_backend() -> None:
    device = cast(Backend, _DeviceMemory())
    assert kv_budget(device, EngineConfig(kv_cache_memory_gib=0.5))[:2] == (2**29, "kv_cache_memory_gib=0.5")
    budget, source, _ = kv_budget(device, EngineConfig(gpu_memory_utilization=0.9))
    assert budget == int(0.9 * 8 * 2**30) - 6 * 2**30 and source.startswith("gpu_memory_utilization=0.9")
    with pytest.raises(ConfigError, match=r"kv_cache_memory_gib=3 is more than the 2.00 GiB free on the device"):
        kv_budget(device, EngineConfig(kv_cache_memory_gib=3))
    assert kv_budget(cast(Backend, object.__new__(NumpyBackend)), EngineConfig())[0] == 2**30


def test_each_kv_budget_names_the_setting_that_gives_more() -> None:
    """``more(extra)``: the value of the budget's own setting that gives ``extra`` bytes more, rounded up to
    hundredths; None where none can (more than the device has, or more than its free memory)."""
    device = cast(Backend, _DeviceMemory())  # 8 GiB, 6 of them in use
    share = kv_budget(device, EngineConfig(gpu_memory_utilization=0.5))
    assert share.bytes == -2 * 2**30  # the memory in use exceeds the share
    assert share.more(2 * 2**30 + 2**20) == "gpu_memory_utilization=0.76"
    assert share.more(5 * 2**30) is None
    fixed = kv_budget(device, EngineConfig(kv_cache_memory_gib=0.5))
    assert fixed.more(2**30) == "kv_cache_memory_gib=1.5" and fixed.more(2 * 2**30) is None
    host = kv_budget(cast(Backend, object.__new__(NumpyBackend)), EngineConfig())
    assert host.more(3 * 2**29) == "kv_cache_memory_gib=2.5"


def test_a_setting_value_is_the_shortest_decimal_in_its_bounds() -> None:
    from atlas_core.engine.config import setting_value

    assert setting_value(0.31) == "0.31"  # not 0.32 for 0.31 * 100's rounding
    assert setting_value(0.3100000001) == "0.32"
    assert setting_value(0.9 + 1 / 141 / 2**30) == "0.91"  # a byte more of a large device still rounds up
    assert setting_value(0.995, 0.999) == "0.995" and setting_value(1.0001, 1.0) is None
    assert setting_value(12345.611) == "12345.62"


def test_a_kv_budget_taken_by_the_memory_in_use_says_which_setting_fits_one_sequence() -> None:
    """A budget the memory in use has taken (below zero) gives no blocks: the error does not propose a max_seq_len
    of 0, but the gpu_memory_utilization that fits one sequence, or freeing memory where none can."""
    from atlas_core.batch.kv_cache import KVCacheTooSmallError, KVLayout, plan_kv_cache

    device = cast(Backend, _DeviceMemory())
    budget = kv_budget(device, EngineConfig(gpu_memory_utilization=0.5))
    layouts, fp32 = [KVLayout(2, 16)] * 2, np.dtype(np.float32)
    with pytest.raises(KVCacheTooSmallError) as caught:
        plan_kv_cache(layouts, fp32, 16, budget.bytes, 512, budget.source, 1, budget.more)
    message = str(caught.value)
    assert "gives nothing (2048.0 MiB below zero)" in message
    assert "Lower max_seq_len" not in message and message.endswith(
        "needs 32 blocks (0.2 MiB). Set gpu_memory_utilization=0.76."
    )
    with pytest.raises(
        KVCacheTooSmallError,
        match=r"Make 8192.2 MiB more room for it \(more than the budget's setting can give on this device",
    ):
        plan_kv_cache(layouts, fp32, 16, -(2**33), 512, budget.source, 1, budget.more)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 21}, "logprobs"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ],
)
def test_bad_sampling_params(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        SamplingParams(**kwargs)


def test_bad_prompts() -> None:
    llm = TINY.shared_llm("llama")
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        llm.generate([[]])
    with pytest.raises(InvalidRequestError, match=r"must be in \[0, 256\)"):
        llm.generate([[1, 999]])
    with pytest.raises(InvalidRequestError, match="max_seq_len"):
        llm.generate([[1] * 600])
    with pytest.raises(InvalidRequestError, match=r"no tokenizer \(tokenizer.json or tokenizer.model\)"):
        llm.generate("text needs a tokenizer")
    assert not llm.engine.has_unfinished()
