"""The bytes a decode step moves (`atlas_core.bench.roofline`, `atlas_core.bench.sequence_traffic`),
against hand computations from the tiny checkpoints' configs (numpy backend: float32 weights, KV and
convolution state; the delta-rule and SSM states are float32 everywhere)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from atlas_core.backends.select import select_backend
from atlas_core.bench.roofline import ENCODER_ATTRIBUTES, NON_WEIGHT_ATTRIBUTES, model_weights, weight_traffic
from atlas_core.plugins import get_registry
from atlas_core.weights.safetensors_source import SafetensorsSource
from tests.conftest import TINY
from tests.test_random_weights import PLUGIN_CHECKPOINTS, loader_class

F32 = 4


def build(name: str, uploads: list[Any] | None = None) -> Any:
    """Checkpoint ``name`` built on a numpy backend; every array uploaded goes to ``uploads``."""
    registry = get_registry()
    backend = select_backend(registry, "numpy")
    if uploads is not None:
        upload = backend.from_numpy

        def recording(array: np.ndarray, **kwargs: Any) -> Any:
            uploads.append(upload(array, **kwargs))
            return uploads[-1]

        backend.from_numpy = recording  # type: ignore[method-assign]
    source = SafetensorsSource(TINY / name)
    return loader_class(source.config)(source, backend, registry, name, 64).build()


@pytest.mark.parametrize("name", PLUGIN_CHECKPOINTS)
def test_every_uploaded_weight_is_counted_once(name: str) -> None:
    uploads: list[Any] = []
    model = build(name, uploads)
    weights, objects = model_weights(model)
    tables = {id(getattr(obj, attr)) for obj in objects for attr in NON_WEIGHT_ATTRIBUTES if hasattr(obj, attr)}
    encoders = [getattr(model, attr) for attr in ENCODER_ATTRIBUTES if getattr(model, attr, None) is not None]
    tables |= {key for encoder in encoders for key in model_weights(encoder)[0]}  # prefill-only weights
    uncounted = [tuple(a.shape) for a in uploads if id(a) not in weights and id(a) not in tables]
    assert not uncounted, f"uploaded but not counted: {uncounted}"
    assert set(weights) <= {id(a) for a in uploads}  # no recurrent state or other non-weight arrays
    assert weight_traffic(model).total_bytes == sum(int(w.nbytes) for w in weights.values())


def moe_bytes(name: str, per_expert: int, top_k: int, experts: int, layers: int) -> None:
    """A 1-token step reads the dense weights and top_k of each MoE layer's experts."""
    traffic = weight_traffic(build(name))
    banks = layers * experts * per_expert * F32
    assert sum(bank.nbytes for bank in traffic.expert_banks) == banks
    assert traffic.bytes_for(1) == pytest.approx(traffic.bytes_per_step - banks + layers * top_k * per_expert * F32)


def test_qwen3_next_step_bytes() -> None:
    config = TINY.config("qwen3_next")
    hidden, inter, experts = config["hidden_size"], config["moe_intermediate_size"], config["num_experts"]
    step, dense = config.get("decoder_sparse_step", 1), config.get("mlp_only_layers") or []
    moe_layers = sum(i not in dense and (i + 1) % step == 0 for i in range(config["num_hidden_layers"]))
    moe_bytes("qwen3_next", 3 * inter * hidden, config["num_experts_per_tok"], experts, moe_layers)
    hk, hv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv, kernel = config["linear_key_head_dim"], config["linear_value_head_dim"], config["linear_conv_kernel_dim"]
    full, linear = config["layer_types"].count("full_attention"), config["layer_types"].count("linear_attention")
    state = linear * ((2 * hk * dk + hv * dv) * (kernel - 1) + hv * dk * dv) * F32
    kv_token = full * 2 * config["num_key_value_heads"] * config["head_dim"] * F32
    sequence = weight_traffic(build("qwen3_next")).sequence
    assert sequence.state_bytes == state
    assert sequence.step_bytes(100) == 100 * kv_token + kv_token + 2 * state


def test_nemotron_h_step_bytes() -> None:
    config = TINY.config("nemotron_h")
    letters = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "mlp": "-", "moe": "E"}
    pattern = config.get("hybrid_override_pattern") or "".join(letters[kind] for kind in config["layers_block_type"])
    heads, head_dim, groups = config["mamba_num_heads"], config["mamba_head_dim"], config["n_groups"]
    state_size, kernel = config["ssm_state_size"], config["conv_kernel"]
    conv_dim = heads * head_dim + 2 * groups * state_size
    state = pattern.count("M") * (conv_dim * (kernel - 1) + heads * head_dim * state_size) * F32
    kv_token = pattern.count("*") * 2 * config["num_key_value_heads"] * config["head_dim"] * F32
    sequence = weight_traffic(build("nemotron_h")).sequence
    assert (sequence.state_bytes, sequence.kv_write_bytes) == (state, kv_token)
    assert sequence.step_bytes(37) == 37 * kv_token + kv_token + 2 * state
    hidden, inter = config["hidden_size"], config["moe_intermediate_size"]  # non-gated: up and down
    moe_bytes("nemotron_h", 2 * inter * hidden, config["num_experts_per_tok"], config["n_routed_experts"], 1)


def test_deepseek_v3_reads_the_latent_cache() -> None:
    config = TINY.config("deepseek_v3")
    latent = (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * F32  # MLA caches one latent row
    layers = config["num_hidden_layers"]
    sequence = weight_traffic(build("deepseek_v3")).sequence
    assert sequence.step_bytes(50) == layers * latent * 51 and sequence.state_bytes == 0
    hidden, inter = config["hidden_size"], config["moe_intermediate_size"]
    moe_layers = layers - config["first_k_dense_replace"]
    moe_bytes("deepseek_v3", 3 * inter * hidden, config["num_experts_per_tok"], config["n_routed_experts"], moe_layers)


def test_gemma3_sliding_layers_read_their_window() -> None:
    config = TINY.config("gemma3")
    per_layer = 2 * config["num_key_value_heads"] * config["head_dim"] * F32
    window, types = config["sliding_window"], config["layer_types"]
    sliding, full = types.count("sliding_attention"), types.count("full_attention")
    sequence = weight_traffic(build("gemma3")).sequence
    assert sequence.step_bytes(5) == len(types) * per_layer * 6  # within the window every layer reads it all
    assert sequence.step_bytes(40) == sliding * per_layer * window + full * per_layer * 40 + len(types) * per_layer


def test_gemma4_per_layer_table_is_gathered_and_shared_layers_read_again() -> None:
    config = TINY.config("gemma4")
    model = build("gemma4")
    traffic = weight_traffic(model)
    layers, size = config["num_hidden_layers"], config["hidden_size_per_layer_input"]
    table = config["vocab_size_per_layer_input"] * layers * size * F32
    assert traffic.gathered_bytes == table
    assert traffic.bytes_per_step == traffic.total_bytes - table  # the tied embedding is read in full
    reads = traffic.sequence.kv_reads
    assert len(reads) == layers and len(model.kv_layouts) == layers - config["num_kv_shared_layers"]


def test_kv_reads_count_the_dtype_the_engine_stores() -> None:
    """Under ``kv_cache_dtype="fp8"`` the KV read per token is a byte an element, not the model's float32."""
    from atlas_core import LLM

    plain = LLM(TINY / "qwen3", kv_cache_memory_gib=1 / 64)
    fp8 = LLM(TINY / "qwen3", kv_cache_memory_gib=1 / 64, kv_cache_dtype="fp8")
    as_model = weight_traffic(fp8.loaded.model).sequence
    as_stored = weight_traffic(fp8.loaded.model, fp8.engine.kv_layouts).sequence
    assert weight_traffic(plain.loaded.model, plain.engine.kv_layouts).sequence == as_model
    assert as_stored.kv_write_bytes * F32 == as_model.kv_write_bytes
    assert as_stored.step_bytes(100) * F32 == as_model.step_bytes(100)
