"""The ModelWeightLoader plug point: checkpoint -> `TransformerModel`.

A family plugin subclasses `ModelWeightLoader` (or the ready-made `DenseDecoderLoader` for
llama-like models) and registers it under its ``model_type``. Loaders read tensors only through
the `WeightSource` (Hugging Face names), build layers from the registry's TransformerLayer types,
and upload weights with ``backend.from_numpy(..., weight=True)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from tqdm.auto import tqdm

from atlas_core.backends.base import Array, Backend
from atlas_core.engine.kv_cache import KVLayout
from atlas_core.errors import ModelLoadError
from atlas_core.model.layers.attention import AttentionWeights
from atlas_core.model.rope import RopeSpec, rotary_tables
from atlas_core.model.spec import DecoderSpec
from atlas_core.model.transformer import PreNormDecoderLayer, TransformerModel
from atlas_core.plugins import PluginRegistry
from atlas_core.weights.source import WeightSource


class ModelWeightLoader(ABC):
    """Builds a model from one checkpoint. Constructed per load; ``build`` is called once."""

    def __init__(
        self, source: WeightSource, backend: Backend, registry: PluginRegistry, origin: str,
        max_positions: int | None = None,
    ) -> None:
        self.source = source
        self.backend = backend
        self.registry = registry
        self.origin = origin
        """Where the checkpoint came from (folder or file), for error messages."""
        self.max_positions = max_positions
        """The most positions the engine will run (its ``max_seq_len``), or None for the model's whole
        context: position tables are built only this long (a 1M-token context would cost ~1 GB of tables)."""

    def table_length(self, context_length: int) -> int:
        """How many positions a per-position table needs: the model's ``context_length``, capped at `max_positions`."""
        return context_length if self.max_positions is None else min(context_length, self.max_positions)

    def rope_tables(self, rope: RopeSpec, context_length: int) -> tuple[Array, Array]:
        """RoPE cos/sin tables (float32, on the backend) for positions ``0 .. table_length(context_length) - 1``."""
        return tuple(  # type: ignore[return-value]
            self.backend.from_numpy(t, dtype=np.dtype(np.float32))
            for t in rotary_tables(rope, self.table_length(context_length))
        )

    @abstractmethod
    def build(self) -> TransformerModel:
        """Read every weight and return the composed model."""

    def tensor(self, name: str) -> np.ndarray:
        """A checkpoint tensor by Hugging Face name, or a `ModelLoadError` naming it."""
        if name not in self.source:
            raise ModelLoadError(f"{self.origin}: weight {name!r} is missing from the checkpoint")
        return self.source.get(name)

    def upload(self, *names: str) -> Array:
        """Upload one tensor, or several concatenated along the output (first) axis."""
        arrays = [self.tensor(name) for name in names]
        return self.backend.from_numpy(arrays[0] if len(arrays) == 1 else np.concatenate(arrays), weight=True)

    def layer_type(self, name: str) -> Any:
        """A registered TransformerLayer class by name."""
        return self.registry.load("layer", name)


class DenseDecoderLoader(ModelWeightLoader):
    """Llama-style decoder: pre-norm attention + SwiGLU MLP, Hugging Face weight names.

    Subclasses set `spec_overrides` / override `spec` for their config quirks.
    """

    spec_overrides: ClassVar[dict[str, Any]] = {}

    def spec(self) -> DecoderSpec:
        return DecoderSpec.from_config(self.source.config, origin=f"{self.origin}/config.json", **self.spec_overrides)

    def feed_forward(self, spec: DecoderSpec, layer: int) -> Callable[[Array], Array]:
        """Layer ``layer``'s feed-forward block (``ffn(x[T, H]) -> [T, H]``): the dense SwiGLU MLP of
        ``model.layers.{layer}.mlp``. Families with other blocks (e.g. Mixture-of-Experts) override it."""
        m = f"model.layers.{layer}.mlp."
        bias = spec.mlp_bias
        return self.layer_type("swiglu_mlp")(
            self.backend,
            self.upload(m + "gate_proj.weight", m + "up_proj.weight"),
            self.upload(m + "down_proj.weight"),
            self.upload(m + "gate_proj.bias", m + "up_proj.bias") if bias else None,
            self.upload(m + "down_proj.bias") if bias else None,
        )

    def build(self) -> TransformerModel:
        spec = self.spec()
        norm_type, attention_type = self.layer_type("rms_norm"), self.layer_type("attention")
        cos, sin = self.rope_tables(spec.rope, spec.max_position_embeddings)

        def norm(name: str) -> Any:
            return norm_type(self.backend, self.upload(name), spec.rms_norm_eps)

        def optional(flag: bool, *names: str) -> Array | None:
            return self.upload(*names) if flag else None

        layers = []
        for i in tqdm(range(spec.num_layers), desc="loading layers", unit="layer", disable=spec.num_layers < 16, leave=False):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            weights = AttentionWeights(
                qkv=self.upload(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
                o=self.upload(a + "o_proj.weight"),
                qkv_bias=optional(spec.qkv_bias, a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"),
                o_bias=optional(spec.o_bias, a + "o_proj.bias"),
                q_norm=norm(a + "q_norm.weight") if spec.qk_norm else None,
                k_norm=norm(a + "k_norm.weight") if spec.qk_norm else None,
            )
            attention = attention_type(
                self.backend, weights, layer_index=i, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                head_dim=spec.head_dim, rope_cos=cos, rope_sin=sin,
            )
            mlp = self.feed_forward(spec, i)
            layers.append(PreNormDecoderLayer(norm(p + "input_layernorm.weight"), attention, norm(p + "post_attention_layernorm.weight"), mlp))

        embed = self.upload("model.embed_tokens.weight")
        return TransformerModel(
            self.backend,
            embed_tokens=embed,
            layers=layers,
            final_norm=norm("model.norm.weight"),
            lm_head=embed if spec.tie_word_embeddings else self.upload("lm_head.weight"),
            kv_layouts=[KVLayout(spec.num_kv_heads, spec.head_dim)] * spec.num_layers,
            vocab_size=spec.vocab_size,
            max_position_embeddings=spec.max_position_embeddings,
        )
