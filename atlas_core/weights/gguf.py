"""GGUF files (llama.cpp's checkpoint format) as a `WeightSource`.

`GGUFSource(path)` memory-maps the file (its header parsed by `atlas_core.weights.gguf_index`,
much faster than `gguf.GGUFReader`) and exposes its tensors under Hugging Face names,
dequantized to float32 by `gguf.quants.dequantize` one tensor at a time on `get`, in HF
``[out_features, in_features]`` orientation. Its `config` is a `config.json`-style dict rebuilt
from the file's metadata, and `tokenizer_spec()` returns the ``tokenizer.*`` metadata that
`atlas_core.tokenizer.gguf_vocab.build_tokenizer_from_gguf` turns into a tokenizer.

llama.cpp's converter interleaves the rows of the Q and K projections of ``llama``-architecture
models (rotary pairs ``(2i, 2i+1)`` instead of HF's rotate-half ``(i, i + d/2)``); `get` undoes
that, so every tensor matches the Hugging Face checkpoint the file was converted from.

Mixture-of-experts files (``qwen3moe``) carry each layer's experts as banks ``[E, out, in]`` (``ffn_gate_exps``,
``ffn_up_exps``, ``ffn_down_exps``): they are offered under HF's fused names (``mlp.experts.gate_up_proj``, gate
and up concatenated, and ``mlp.experts.down_proj``), the router as ``mlp.gate``, and the config gets the expert
counts from the metadata (layers without a router are dense: ``mlp_only_layers``).

Linear weights and expert banks of the block types in `atlas_core.weights.gguf_quantized.FORMATS` (Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) are also offered as stored: `get_quantized` returns their bytes as a
`QuantizedWeight` (rows of blocks; the Q/K row permutation is undone on whole rows, which is exact), so
loaders keep them quantized. F16 / BF16 / F32 tensors and other block types are read as floats.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize

from atlas_core.errors import ModelLoadError, UnsupportedArchitectureError
from atlas_core.weights.gguf_index import GGUFField, GGUFTensorInfo, open_gguf
from atlas_core.weights.gguf_quantized import FORMATS, dequantize_bytes, gguf_weight
from atlas_core.weights.quantized import QuantizedWeight

_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "qwen3moe": ("qwen3_moe", "Qwen3MoeForCausalLM"),
}
"""GGUF ``general.architecture`` -> (HF ``model_type``, HF architecture class)."""

_INTERLEAVED_QK = frozenset({"llama", "mistral"})
"""Architectures whose converter permutes Q/K rows into llama.cpp's interleaved rotary layout."""

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
}
_EXPERT_TENSORS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}
"""A MoE layer's expert banks ``[E, out, in]`` -> HF's fused bank names under ``mlp.experts.`` (no ``.weight``);
gate and up are also offered fused as ``gate_up_proj`` (`GGUFSource._fused`), what `read_experts` reads."""
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


@dataclass(frozen=True)
class GGUFTokenizerSpec:
    """The ``tokenizer.*`` metadata of a GGUF file, as llama.cpp wrote it.

    `model` is ``tokenizer.ggml.model`` (``"gpt2"`` byte-level BPE, ``"llama"`` SentencePiece);
    `pre` names the pre-tokenizer (``"smollm"``, ``"llama-bpe"``, ``"qwen2"``...); `token_types`
    use llama.cpp's codes (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    """

    source: str
    model: str
    pre: str | None
    tokens: list[str]
    token_types: list[int] | None
    scores: list[float] | None
    merges: list[str] | None
    bos_token_id: int | None
    eos_token_id: int | None
    eot_token_id: int | None
    eom_token_id: int | None
    unknown_token_id: int | None
    padding_token_id: int | None
    add_bos_token: bool | None
    add_space_prefix: bool | None
    chat_template: str | None


class GGUFSource:
    """Read-only `WeightSource` over one GGUF file (memory-mapped; tensors dequantized on `get`).

    Raises `ModelLoadError` naming the file if it is missing, not GGUF, or truncated, and
    `UnsupportedArchitectureError` if its architecture has no mapping to Hugging Face names.
    """

    keep_quantized = True
    """Whether `get_quantized` offers block-quantized weights as stored; False reads every tensor as
    floats at load (`atlas_core.model.load` decides per model: the ``gguf_weights`` setting)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file = open_gguf(self.path)
        self.metadata: dict[str, Any] = {
            name: _value(field) for name, field in self._file.header.fields.items() if field.type != GGUFValueType.ARRAY
        }
        self.architecture = str(self.metadata.get("general.architecture", ""))
        if self.architecture not in _ARCHITECTURES:
            raise UnsupportedArchitectureError(
                f"{self.path}: GGUF architecture {self.architecture!r} is not supported; "
                f"supported: {', '.join(sorted(_ARCHITECTURES))}"
            )
        self._tensors: dict[str, GGUFTensorInfo] = {_hf_name(t.name): t for t in self._file.header.tensors.values()}
        self._fused: dict[str, tuple[str, str]] = {
            name.removesuffix("gate_proj") + "gate_up_proj": (name, name.removesuffix("gate_proj") + "up_proj")
            for name in self._tensors
            if name.endswith(".mlp.experts.gate_proj") and name.removesuffix("gate_proj") + "up_proj" in self._tensors
        }
        """Fused expert bank name -> its (gate, up) parts, concatenated along the rows on reading."""
        self.config: dict[str, Any] = self._build_config()

    def quantized_elements(self) -> int:
        """How many weights `get_quantized` can offer in their blocks (2-D tensors of a kept format)."""
        return sum(math.prod(t.shape) for t in self._tensors.values() if t.type in FORMATS and len(t.shape) >= 2)

    def names(self) -> Iterator[str]:
        """Every tensor name, in Hugging Face naming (unmapped GGUF tensors keep their GGUF name), and the fused
        expert banks (``mlp.experts.gate_up_proj``) beside their parts."""
        return iter([*self._tensors, *self._fused])

    def __contains__(self, name: str) -> bool:
        return name in self._tensors or name in self._fused

    def get(self, name: str) -> np.ndarray:
        """Return tensor `name` as a new C-contiguous float32 array in HF orientation."""
        if name in self._fused:
            return np.concatenate([self.get(part) for part in self._fused[name]], axis=-2)
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ModelLoadError(f"{self.path} has no tensor {name!r}")
        values = self._hf_rows(name, self._dequantize(tensor))
        # Read-only (hence copied) only where it still views the memory-mapped file (F32 tensors).
        return np.require(values, dtype=np.float32, requirements=["C", "W"])

    def get_quantized(self, name: str) -> QuantizedWeight | None:
        """Tensor ``name`` as a host `QuantizedWeight` of its GGUF blocks (a ``gguf_*`` format, rows in HF
        order; a view of the file unless rows were reordered) when it is a 2-D tensor or an expert bank of a block
        type in `FORMATS` and `keep_quantized` (a fused gate/up bank: both parts of one type); else None (read it
        with `get`)."""
        if name in self._fused:
            gate, up = (self._tensors[part] for part in self._fused[name])
            if not self.keep_quantized or gate.type not in FORMATS or up.type != gate.type:
                return None
            blocks = [gguf_weight(self._file.tensor_bytes(t), t.type, t.shape).data for t in (gate, up)]
            shape = (*gate.shape[:-2], gate.shape[-2] + up.shape[-2], gate.shape[-1])
            return gguf_weight(np.concatenate(blocks, axis=-2), gate.type, shape)
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ModelLoadError(f"{self.path} has no tensor {name!r}")
        expert_bank = len(tensor.shape) == 3 and ".mlp.experts." in name
        if not self.keep_quantized or tensor.type not in FORMATS or not (len(tensor.shape) == 2 or expert_bank):
            return None
        weight = gguf_weight(self._file.tensor_bytes(tensor), tensor.type, tensor.shape)
        rows = self._hf_rows(name, weight.data)
        return weight if rows is weight.data else gguf_weight(rows, tensor.type, tensor.shape)

    def _hf_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """A tensor's rows (values, or rows of GGUF blocks) in HF order: the Q/K interleave undone."""
        if self.architecture in _INTERLEAVED_QK:
            heads = {"q_proj": self.config["num_attention_heads"], "k_proj": self.config["num_key_value_heads"]}
            for proj, n_head in heads.items():
                if f"self_attn.{proj}." in name:
                    return _deinterleave_rows(rows, n_head)
        return rows

    def _dequantize(self, tensor: GGUFTensorInfo) -> np.ndarray:
        """The tensor's values as floats, shaped like the HF tensor (read-only where it views the file)."""
        try:
            values = dequantize_bytes(self._file.tensor_bytes(tensor), tensor.type, tensor.shape)
        except NotImplementedError as exc:
            raise ModelLoadError(
                f"{self.path}: tensor {tensor.name!r} has type {tensor.type.name}, which "
                f"cannot be dequantized; supported types: {', '.join(supported_tensor_types())}"
            ) from exc
        return values

    def tokenizer_spec(self) -> GGUFTokenizerSpec:
        """The file's tokenizer metadata; raises `ModelLoadError` if it has none."""
        return read_tokenizer_spec(self._file.header.fields, str(self.path))

    def _build_config(self) -> dict[str, Any]:
        meta, arch = self.metadata, self.architecture

        def key(name: str, default: Any = None) -> Any:
            return meta.get(f"{arch}.{name}", default)

        model_type, hf_class = _ARCHITECTURES[arch]
        hidden, heads = key("embedding_length"), key("attention.head_count")
        if hidden is None or heads is None or key("block_count") is None:
            raise ModelLoadError(f"{self.path} lacks {arch}.embedding_length/block_count/attention.head_count")
        head_dim = key("attention.key_length") or hidden // heads
        embed = self._tensors.get("model.embed_tokens.weight")
        vocab_size = key("vocab_size") or (embed.shape[0] if embed is not None else None)
        config: dict[str, Any] = {
            "model_type": model_type,
            "architectures": [hf_class],
            "hidden_size": hidden,
            "intermediate_size": key("feed_forward_length"),
            "num_hidden_layers": key("block_count"),
            "num_attention_heads": heads,
            "num_key_value_heads": key("attention.head_count_kv", heads),
            "head_dim": head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6),
            "rope_theta": key("rope.freq_base", 10000.0),
            "max_position_embeddings": key("context_length"),
            "vocab_size": vocab_size,
            "tie_word_embeddings": "lm_head.weight" not in self._tensors,
            "attention_bias": "model.layers.0.self_attn.q_proj.bias" in self._tensors,
            "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
            "torch_dtype": "float32",
        }
        if key("expert_count"):
            dense = [i for i in range(config["num_hidden_layers"]) if f"model.layers.{i}.mlp.gate.weight" not in self]
            config |= {
                "num_experts": key("expert_count"),
                "num_experts_per_tok": key("expert_used_count"),
                "moe_intermediate_size": key("expert_feed_forward_length"),
                "norm_topk_prob": True,  # llama.cpp renormalises the chosen experts' weights of this architecture
                "decoder_sparse_step": 1,
                "mlp_only_layers": dense,
            }
        rope_scaling = self._rope_scaling(head_dim, config["rope_theta"])
        if rope_scaling is not None:
            config["rope_scaling"] = rope_scaling
        return config

    def _rope_scaling(self, head_dim: int, theta: float) -> dict[str, Any] | None:
        """HF ``rope_scaling`` from ``{arch}.rope.scaling.*`` keys or a ``rope_freqs`` tensor."""
        prefix = f"{self.architecture}.rope.scaling."
        kind = self.metadata.get(prefix + "type")
        factor = self.metadata.get(prefix + "factor") or self.metadata.get(f"{self.architecture}.rope.scale_linear")
        if kind is None and factor is not None:
            kind = "linear"
        if kind is not None and kind != "none" and factor is not None:
            scaling: dict[str, Any] = {"rope_type": kind, "factor": factor}
            optional = {
                "original_context_length": "original_max_position_embeddings",
                "yarn_beta_fast": "beta_fast",
                "yarn_beta_slow": "beta_slow",
                "attn_factor": "attention_factor",
            }
            for gguf_key, hf_key in optional.items():
                if (value := self.metadata.get(prefix + gguf_key)) is not None:
                    scaling[hf_key] = value
            return scaling
        if "rope_freqs.weight" in self._tensors:
            return _llama3_rope_scaling(self._dequantize(self._tensors["rope_freqs.weight"]), theta, head_dim)
        return None


def read_tokenizer_spec(fields: Mapping[str, GGUFField], source: str = "") -> GGUFTokenizerSpec:
    """Collect the ``tokenizer.*`` metadata of a parsed header; `source` names the file in errors."""

    def value(name: str) -> Any:
        field = fields.get(name)
        return None if field is None else _value(field)

    model, tokens = value("tokenizer.ggml.model"), value("tokenizer.ggml.tokens")
    if model is None or not tokens:
        raise ModelLoadError(f"{source or 'GGUF file'} has no tokenizer (tokenizer.ggml.model/tokens missing)")
    ggml = "tokenizer.ggml."
    return GGUFTokenizerSpec(
        source=source,
        model=model,
        pre=value(ggml + "pre"),
        tokens=tokens,
        token_types=value(ggml + "token_type"),
        scores=value(ggml + "scores"),
        merges=value(ggml + "merges"),
        bos_token_id=value(ggml + "bos_token_id"),
        eos_token_id=value(ggml + "eos_token_id"),
        eot_token_id=value(ggml + "eot_token_id"),
        eom_token_id=value(ggml + "eom_token_id"),
        unknown_token_id=value(ggml + "unknown_token_id"),
        padding_token_id=value(ggml + "padding_token_id"),
        add_bos_token=value(ggml + "add_bos_token"),
        add_space_prefix=value(ggml + "add_space_prefix"),
        chat_template=value("tokenizer.chat_template"),
    )


@functools.cache
def supported_tensor_types() -> tuple[str, ...]:
    """Names of the GGML tensor types `gguf.quants.dequantize` can turn into floats."""
    names = []
    for qtype in GGMLQuantizationType:
        _, type_size = GGML_QUANT_SIZES.get(qtype, (0, 0))
        if type_size == 0:
            continue
        try:
            dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
        except NotImplementedError:
            continue
        names.append(qtype.name)
    return tuple(names)


def _value(field: GGUFField) -> Any:
    """A field's value; float32 scalars rounded to their shortest decimal (1e-05, not 9.99e-06)."""
    if field.type == GGUFValueType.FLOAT32:
        return float(str(np.float32(field.value)))
    return field.value


def _hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a llama.cpp tensor name; names without a mapping are kept."""
    stem, _, suffix = gguf_name.rpartition(".")
    if stem in _GLOBAL_TENSORS and suffix in ("weight", "bias"):
        return f"{_GLOBAL_TENSORS[stem]}.{suffix}"
    match = _BLOCK_NAME.fullmatch(gguf_name)
    if match and match.group(2) in _EXPERT_TENSORS and match.group(3) == "weight":
        return f"model.layers.{match.group(1)}.mlp.experts.{_EXPERT_TENSORS[match.group(2)]}"
    if match and match.group(2) in _BLOCK_TENSORS:
        layer, part, suffix = match.groups()
        return f"model.layers.{layer}.{_BLOCK_TENSORS[part]}.{suffix}"
    return gguf_name


def _deinterleave_rows(values: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: per head, rows (0, d/2, 1, d/2+1, ...) -> (0..d-1).

    The converter maps HF rows ``[n_head, 2, d/2]`` to ``[n_head, d/2, 2]``; this is the inverse.
    """
    half = values.shape[0] // n_head // 2
    return values.reshape(n_head, half, 2, *values.shape[1:]).swapaxes(1, 2).reshape(values.shape)


def _llama3_rope_scaling(factors: np.ndarray, theta: float, head_dim: int) -> dict[str, Any] | None:
    """Recover Llama-3 ``rope_scaling`` from llama.cpp's per-frequency divisors (``rope_freqs``).

    llama.cpp stores ``factor`` for low frequencies, 1 for high ones and a smooth blend between;
    the blend is linear in ``1/wavelength``, so fitting it with ``low_freq_factor = 1`` reproduces
    every divisor. Without at least two blended frequencies, Meta's values (1, 4, 8192) are used.
    """
    factor = float(factors.max())
    if math.isclose(factor, 1.0):
        return None
    inv_wavelen = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim) / (2 * math.pi)
    divisors = factors.astype(np.float64)
    blended = (divisors > 1 + 1e-4) & (divisors < factor - 1e-4)
    low, high, original = 1.0, 4.0, 8192
    if blended.sum() >= 2:
        smooth = (1 / divisors[blended] - 1 / factor) / (1 - 1 / factor)
        slope, intercept = np.polyfit(inv_wavelen[blended], smooth, 1)
        high, original = round(float(1 - 1 / intercept), 3), round(float(-slope / intercept))
    return {
        "rope_type": "llama3",
        "factor": round(factor, 4),
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": original,
    }
