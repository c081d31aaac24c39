"""The ModelWeightLoader plug point: checkpoint -> `TransformerModel`.

A family plugin subclasses `ModelWeightLoader` (or the ready-made `DenseDecoderLoader` for
llama-like models) and registers it under its ``model_type``. Loaders read tensors only through
the `WeightSource` (Hugging Face names), build layers from the registry's TransformerLayer types
(`ModelWeightLoader.layer_type`), and upload weights with `ModelWeightLoader.upload` /
`upload_arrays` (``backend.from_numpy(..., weight=True)``).

Quantized checkpoints (FP8, `atlas_core.weights.quant_config`): `ModelWeightLoader.tensor` always
returns float values (a quantized weight dequantized), so any rearrangement a family does stays
correct; `ModelWeightLoader.linear_weight` returns a quantized weight as stored (a host
`QuantizedWeight`), and `upload` / `upload_arrays` keep it quantized (fusing parts with
`atlas_core.weights.quantized.concat_rows`) through `Backend.upload_quantized`. Linear weights that
a family reads with `tensor` are therefore kept dequantized.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import numpy as np
from tqdm.auto import tqdm

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.kv_cache import KVLayout
from atlas_core.errors import ModelLoadError
from atlas_core.model.kv_scales import checkpoint_kv_scales
from atlas_core.model.layers.attention import AttentionWeights
from atlas_core.model.rope import RopeSpec, rotary_tables
from atlas_core.model.shard_weights import ShardedWeights
from atlas_core.model.sharding import TensorParallel
from atlas_core.model.spec import DecoderSpec
from atlas_core.model.transformer import TransformerModel
from atlas_core.plugins import PluginRegistry
from atlas_core.weights.quantized import QuantizedWeight, concat_rows
from atlas_core.weights.source import WeightSource, quantized_tensor

FLOAT32 = np.dtype(np.float32)


class ModelWeightLoader(ShardedWeights, ABC):
    """Builds a model from one checkpoint. Constructed per load; ``build`` is called once."""

    def __init__(
        self,
        source: WeightSource,
        backend: Backend,
        registry: PluginRegistry,
        origin: str,
        max_positions: int | None = None,
        parallel: TensorParallel | None = None,
    ) -> None:
        self.source = source
        self.backend = backend
        self.registry = registry
        self.origin = origin
        """Where the checkpoint came from (folder or file), for error messages."""
        self.max_positions = max_positions
        """The most positions the engine will run (its ``max_seq_len``), or None for the model's whole
        context: position tables are built only this long (a 1M-token context would cost ~1 GB of tables)."""
        self.parallel = parallel
        """This rank's shard plan and communicator when the model is split over ranks (None: one rank holds it all)."""

    supports_tensor_parallel: ClassVar[bool] = False
    """Whether `build` honours `parallel` (builds this rank's shard); families that do set it."""
    supports_expert_parallel: ClassVar[bool] = False
    """Whether `build` splits its MoE blocks' experts when `parallel` says so with tensor_parallel_size 1
    (every other layer whole on each rank): families whose MoE blocks all come from `load_moe` set it."""

    @property
    def loads_vision_tower(self) -> bool:
        """Whether this rank loads the checkpoint's vision tower: on a model split over ranks, rank 0 alone
        (it prepares and encodes every image, and each step it posts carries the features to the other
        ranks, which never run the tower); always on one rank. Vision-language families check it."""
        return self.shard.rank == 0

    def table_length(self, context_length: int) -> int:
        """How many positions a per-position table needs: the model's ``context_length``, capped at `max_positions`."""
        return context_length if self.max_positions is None else min(context_length, self.max_positions)

    def rope_tables(self, rope: RopeSpec, context_length: int) -> tuple[Array, Array]:
        """RoPE cos/sin tables (float32, on the backend) for positions ``0 .. table_length(context_length) - 1``."""
        cos, sin = rotary_tables(rope, self.table_length(context_length))
        return self.upload_float32(cos), self.upload_float32(sin)

    @abstractmethod
    def build(self) -> TransformerModel:
        """Read every weight and return the composed model."""

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """Tensor name -> shape of every tensor a checkpoint with this ``config.json`` holds (what `build`
        reads), so benchmarks can build the model from random weights. Families override it."""
        raise ModelLoadError(
            f"the {config.get('model_type')!r} family ({cls.__module__}.{cls.__qualname__}) does not describe its "
            "checkpoint tensors, so it cannot be built from random weights; benchmark a real checkpoint instead"
        )

    def tensor(self, name: str) -> np.ndarray:
        """A checkpoint tensor by Hugging Face name (float values: a quantized weight comes dequantized),
        or a `ModelLoadError` naming it."""
        if name not in self.source:
            raise ModelLoadError(f"{self.origin}: weight {name!r} is missing from the checkpoint")
        return self.source.get(name)

    def linear_weight(self, name: str) -> np.ndarray | QuantizedWeight:
        """A linear layer's weight as stored: a host `QuantizedWeight` when the checkpoint keeps it quantized,
        else `tensor`. Rearrange it only with the helpers of `atlas_core.weights.quantized`."""
        if name not in self.source:
            raise ModelLoadError(f"{self.origin}: weight {name!r} is missing from the checkpoint")
        quantized = quantized_tensor(self.source, name)
        return self.source.get(name) if quantized is None else quantized

    def upload(self, *names: str) -> Array | QuantizedWeight:
        """Upload one weight, or several concatenated along the output (first) axis; quantized weights
        stay quantized (`linear_weight`, `upload_arrays`)."""
        return self.upload_arrays(*(self.linear_weight(name) for name in names))

    def upload_arrays(self, *arrays: np.ndarray | QuantizedWeight) -> Array | QuantizedWeight:
        """Upload host arrays (e.g. rearranged checkpoint tensors) as one weight, several concatenated
        along the output (first) axis. Quantized parts are fused quantized (`concat_rows`) and uploaded
        with `Backend.upload_quantized` (dequantized there if the backend does not execute their format)."""
        weight = concat_rows(arrays)
        if isinstance(weight, QuantizedWeight):
            return self.backend.upload_quantized(weight)
        return self.backend.from_numpy(weight, weight=True)

    def optional_upload(self, present: bool, *names: str) -> Array | None:
        """``upload(*names)`` when ``present`` (a config flag such as ``attention_bias``), else None."""
        return self.upload(*names) if present else None

    def kv_scales(self, prefix: str) -> tuple[float, float]:
        """The fp8 KV-cache ``(k_scale, v_scale)`` the checkpoint gives attention layer ``prefix``, else ``(1.0, 1.0)``
        (`atlas_core.model.kv_scales`); a `KVLayout` takes them as its last two fields."""
        return checkpoint_kv_scales(self.source, prefix, self.origin)

    def upload_float32(self, array: np.ndarray) -> Array:
        """Upload a host array kept in float32 whatever the weight dtype (routing biases, SSM decay
        rates and other small parameters whose precision matters)."""
        return self.backend.from_numpy(np.asarray(array, dtype=FLOAT32), dtype=FLOAT32)

    def find_prefix(self, prefixes: Sequence[str], anchor: str) -> str:
        """The first of ``prefixes`` under which the checkpoint holds tensor ``anchor`` (e.g. the text
        stack's ``"embed_tokens.weight"`` under ``"model."`` or ``"model.language_model."``); a
        `ModelLoadError` listing every name looked for when none is there."""
        for prefix in prefixes:
            if prefix + anchor in self.source:
                return prefix
        tried = " or ".join(repr(prefix + anchor) for prefix in prefixes)
        raise ModelLoadError(f"{self.origin}: the checkpoint has no {tried}; is it a checkpoint of this model family?")

    def check_shape(
        self, what: str, shape: Sequence[int], expected: Sequence[int], implied_by: str = "config.json"
    ) -> None:
        """A `ModelLoadError` when tensor ``what`` has ``shape`` instead of the ``expected`` one that
        ``implied_by`` (the config keys involved) implies."""
        if tuple(shape) != tuple(expected):
            raise ModelLoadError(
                f"{self.origin}: {what} has shape {tuple(shape)}, but {implied_by} implies {tuple(expected)}"
            )

    def layer_progress(self, num_layers: int) -> Iterable[int]:
        """``range(num_layers)``, shown as a progress bar while loading models of 16 layers or more, when
        stderr is a terminal (never in log files)."""
        disable = num_layers < 16 or not sys.stderr.isatty()
        return tqdm(range(num_layers), desc="loading layers", unit="layer", disable=disable, leave=False)

    def layer_type(self, name: str) -> Any:
        """A registered TransformerLayer class by name."""
        return self.registry.load("layer", name)

    def rms_norm(self, name: str, eps: float, *, zero_centred: bool = False) -> Any:
        """The registered ``rms_norm`` layer with checkpoint weight ``name``. ``zero_centred``: the
        checkpoint stores ``w`` and the norm scales by ``1 + w`` (the 1 is added here once, in float32)."""
        if zero_centred:
            weight = self.backend.from_numpy(self.tensor(name).astype(np.float32) + 1.0, weight=True)
        else:
            weight = self.upload(name)
        return self.layer_type("rms_norm")(self.backend, weight, eps)

    def gated_mlp(self, prefix: str, *, layer: str = "swiglu_mlp", bias: bool = False, reduce: bool = True) -> Any:
        """The registered gated feed-forward ``layer`` (``swiglu_mlp``, ``geglu_mlp``) from Hugging Face
        names under ``prefix``: ``gate_proj`` and ``up_proj`` fused into one weight, ``down_proj``;
        their biases too when ``bias``. A split model's rank holds its share of the intermediate rows
        (column-parallel gate/up, row-parallel down), all-reduced (`reduced_feed_forward`) unless not
        ``reduce`` (a MoE block's shared expert: the block reduces it with its experts)."""
        gate_up, down = (prefix + "gate_proj.", prefix + "up_proj."), prefix + "down_proj."
        rows: range | slice = slice(None)
        if self.shard.tensor_split:
            rows = self.shard.split(self.weight_shape(down + "weight")[1], prefix + "intermediate rows")
        mlp = self.layer_type(layer)(
            self.backend,
            self.upload_arrays(*(self.weight_part(p + "weight", rows) for p in gate_up)),
            self.upload_arrays(self.weight_part(down + "weight", slice(None), rows)),
            self.upload_arrays(*(self.weight_part(p + "bias", rows) for p in gate_up)) if bias else None,
            self.row_parallel_bias(bias, down + "bias"),
        )
        return self.reduced_feed_forward(mlp) if reduce else mlp


class DenseDecoderLoader(ModelWeightLoader):
    """Llama-style decoder: pre-norm attention + SwiGLU MLP, Hugging Face weight names.

    Subclasses set `spec_overrides` / override `spec` for their config quirks.
    """

    spec_overrides: ClassVar[dict[str, Any]] = {}
    supports_tensor_parallel = True
    supports_expert_parallel = True

    def spec(self) -> DecoderSpec:
        return DecoderSpec.from_config(self.source.config, origin=f"{self.origin}/config.json", **self.spec_overrides)

    @classmethod
    def checkpoint_shapes(cls, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        """The tensors `build` reads, with Hugging Face llama names (see `ModelWeightLoader.checkpoint_shapes`)."""
        spec = DecoderSpec.from_config(config, **cls.spec_overrides)
        hidden, inter, head_dim = spec.hidden_size, spec.intermediate_size, spec.head_dim
        q_rows, kv_rows = spec.num_heads * head_dim, spec.num_kv_heads * head_dim
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (spec.vocab_size, hidden),
            "model.norm.weight": (hidden,),
        }
        if not spec.tie_word_embeddings:
            shapes["lm_head.weight"] = (spec.vocab_size, hidden)
        for i in range(spec.num_layers):
            p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
            shapes |= {
                a + "q_proj.weight": (q_rows, hidden),
                a + "k_proj.weight": (kv_rows, hidden),
                a + "v_proj.weight": (kv_rows, hidden),
                a + "o_proj.weight": (hidden, q_rows),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
            }
            if spec.qk_norm:
                shapes |= {a + "q_norm.weight": (head_dim,), a + "k_norm.weight": (head_dim,)}
            if spec.qkv_bias:
                shapes |= {a + "q_proj.bias": (q_rows,), a + "k_proj.bias": (kv_rows,), a + "v_proj.bias": (kv_rows,)}
            if spec.o_bias:
                shapes[a + "o_proj.bias"] = (hidden,)
            if spec.mlp_bias:
                shapes |= {
                    p + "mlp.gate_proj.bias": (inter,),
                    p + "mlp.up_proj.bias": (inter,),
                    p + "mlp.down_proj.bias": (hidden,),
                }
        return shapes

    def feed_forward(self, spec: DecoderSpec, layer: int) -> Callable[[Array], Array]:
        """Layer ``layer``'s feed-forward block (``ffn(x[T, H]) -> [T, H]``): the dense SwiGLU MLP of
        ``model.layers.{layer}.mlp``. Families with other blocks (e.g. Mixture-of-Experts) override it."""
        return self.gated_mlp(f"model.layers.{layer}.mlp.", bias=spec.mlp_bias)

    def build(self) -> TransformerModel:
        spec = self.spec()
        attention_type, layer_type = self.layer_type("attention"), self.layer_type("pre_norm_decoder_layer")
        cos, sin = self.rope_tables(spec.rope, spec.max_position_embeddings)
        heads = self.shard.split(spec.num_heads, "num_attention_heads")
        kv_heads = self.shard.kv_heads(spec.num_kv_heads, spec.num_heads)
        q_rows = range(heads.start * spec.head_dim, heads.stop * spec.head_dim)
        kv_rows = range(kv_heads.start * spec.head_dim, kv_heads.stop * spec.head_dim)

        def norm(name: str) -> Any:
            return self.rms_norm(name, spec.rms_norm_eps)

        def qkv(a: str, kind: str) -> list[np.ndarray | QuantizedWeight]:
            return [
                self.weight_part(f"{a}{p}_proj.{kind}", rows)
                for p, rows in zip("qkv", (q_rows, kv_rows, kv_rows), strict=True)
            ]

        layers = []
        for i in self.layer_progress(spec.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            weights = AttentionWeights(
                qkv=self.upload_arrays(*qkv(a, "weight")),
                o=self.upload_arrays(self.weight_part(a + "o_proj.weight", slice(None), q_rows)),
                qkv_bias=self.upload_arrays(*qkv(a, "bias")) if spec.qkv_bias else None,
                o_bias=self.row_parallel_bias(spec.o_bias, a + "o_proj.bias"),
                q_norm=norm(a + "q_norm.weight") if spec.qk_norm else None,
                k_norm=norm(a + "k_norm.weight") if spec.qk_norm else None,
            )
            attention = attention_type(
                self.backend,
                weights,
                layer_index=i,
                num_heads=len(heads),
                num_kv_heads=len(kv_heads),
                head_dim=spec.head_dim,
                rope_cos=cos,
                rope_sin=sin,
            )
            mlp = self.feed_forward(spec, i)
            layers.append(
                layer_type(
                    norm(p + "input_layernorm.weight"),
                    self.reduced_mixer(attention),
                    norm(p + "post_attention_layernorm.weight"),
                    mlp,
                )
            )

        embed, vocab_split = self.vocab_rows("model.embed_tokens.weight")
        return TransformerModel(
            self.backend,
            embed_tokens=embed,
            layers=layers,
            final_norm=norm("model.norm.weight"),
            lm_head=embed if spec.tie_word_embeddings else self.lm_head("lm_head.weight"),
            kv_layouts=[
                KVLayout(len(kv_heads), spec.head_dim, None, *self.kv_scales(f"model.layers.{i}.self_attn."))
                for i in range(spec.num_layers)
            ],
            vocab_size=spec.vocab_size,
            max_position_embeddings=spec.max_position_embeddings,
            vocab_split=vocab_split,
        )
