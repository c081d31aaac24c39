"""What a checkpoint's ``quantization_config`` declares, and how its quantized tensors are stored.

Two published FP8 layouts are read (`QuantizationScheme.from_config`); any other ``quant_method``
(awq, gptq, bitsandbytes, mxfp4, ...) is refused with a `ModelLoadError` naming it, the file and
what is supported:

* ``quant_method: "fp8"`` (DeepSeek-V3, Qwen3-FP8, MiniMax-M2; transformers' fine-grained FP8):
  ``fmt: "e4m3"``, ``weight_block_size: [bn, bk]``; each quantized linear has ``weight`` (F8_E4M3)
  and ``weight_scale_inv`` (F32 ``[ceil(N / bn), ceil(K / bk)]``), the factor each block's elements are
  multiplied by. Without ``weight_block_size`` the scale is per tensor (``weight_scale``).
  Fused expert banks (``experts.gate_up_proj``) carry ``experts.gate_up_proj_scale_inv``.
* ``quant_method: "compressed-tensors"`` with format ``float-quantized`` (llm-compressor's FP8):
  every config group that quantizes weights has ``num_bits: 8``, ``type: "float"`` and strategy
  ``channel`` (``weight_scale [N, 1]``), ``tensor`` (one scale) or ``block`` (``block_structure``);
  the scale (any float dtype) multiplies the elements.

Which tensors are quantized is read from the files, not from ``modules_to_not_convert`` / ``ignore``:
a tensor is quantized exactly when it is stored as F8_E4M3, and it must then have its scale. Activation
settings (``activation_scheme``, ``input_activations``) and static activation scales (``input_scale``,
``*_activation_scale``) do not change the stored weights and are not applied: activations stay in the
backend's activation dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from atlas_core.errors import ModelLoadError
from atlas_core.weights.quantized import FP8_E4M3, QuantizedWeight, scale_grid

SUPPORTED_METHODS = (
    "'fp8' (FP8 E4M3 weights with block or per-tensor scales) and 'compressed-tensors' (format "
    "'float-quantized': FP8 E4M3 weights with channel, tensor or block scales)"
)
"""What the refusal of any other ``quant_method`` lists as supported."""
CHANNEL_STRATEGIES = ("channel", "tensor", "block")


@dataclass(frozen=True)
class QuantizationScheme:
    """One checkpoint's quantization: ``method`` (``"fp8"`` or ``"compressed-tensors"``), the suffixes
    that name a weight's scale tensor (tried in order), the block shapes config.json declares, and
    ``origin`` (the config.json path, for error messages)."""

    method: str
    scale_suffixes: tuple[str, ...]
    blocks: tuple[tuple[int, int], ...]
    origin: str
    format: str = FP8_E4M3

    @classmethod
    def from_config(cls, config: dict[str, Any], origin: str = "config.json") -> QuantizationScheme | None:
        """The scheme ``config`` declares (None when it has no ``quantization_config``); a
        `ModelLoadError` naming ``origin`` when it is one that cannot be loaded."""
        settings = config.get("quantization_config")
        if not settings:
            return None
        if not isinstance(settings, dict):
            raise ModelLoadError(f"{origin}: quantization_config must be an object, got {settings!r}")
        method = settings.get("quant_method")
        if method == "fp8":
            return cls._fp8(settings, origin)
        if method == "compressed-tensors":
            return cls._compressed_tensors(settings, origin)
        raise ModelLoadError(
            f"{origin}: quantization_config.quant_method {method!r} is not supported; supported: {SUPPORTED_METHODS}"
        )

    @classmethod
    def _fp8(cls, settings: dict[str, Any], origin: str) -> QuantizationScheme:
        fmt = settings.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ModelLoadError(
                f"{origin}: quantization_config.fmt {fmt!r} is not supported; FP8 checkpoints must use 'e4m3'"
            )
        block = settings.get("weight_block_size")
        blocks = () if block is None else (_block(block, "quantization_config.weight_block_size", origin),)
        return cls("fp8", ("_scale_inv", "_scale"), blocks, origin)

    @classmethod
    def _compressed_tensors(cls, settings: dict[str, Any], origin: str) -> QuantizationScheme:
        if settings.get("sparsity_config"):
            raise ModelLoadError(
                f"{origin}: compressed-tensors checkpoints with a sparsity_config are not supported; "
                f"supported: {SUPPORTED_METHODS}"
            )
        groups = settings.get("config_groups") or {}
        if not isinstance(groups, dict):
            raise ModelLoadError(f"{origin}: quantization_config.config_groups must be an object")
        blocks: list[tuple[int, int]] = []
        for name, group in groups.items():
            where = f"quantization_config.config_groups.{name}"
            weights = group.get("weights") if isinstance(group, dict) else None
            if not weights:
                continue  # activations only: the weights stay as stored
            fmt = group.get("format") or settings.get("format")
            if fmt != "float-quantized":
                raise ModelLoadError(
                    f"{origin}: {where}: compressed-tensors format {fmt!r} is not supported; "
                    f"supported: {SUPPORTED_METHODS}"
                )
            bits, kind, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
            if bits != 8 or kind != "float":
                raise ModelLoadError(
                    f"{origin}: {where}.weights: {bits}-bit {kind!r} weights are not supported; "
                    f"supported: {SUPPORTED_METHODS}"
                )
            if strategy not in CHANNEL_STRATEGIES:
                raise ModelLoadError(
                    f"{origin}: {where}.weights: strategy {strategy!r} is not supported; "
                    f"supported: {', '.join(CHANNEL_STRATEGIES)}"
                )
            if strategy == "block":
                blocks.append(_block(weights.get("block_structure"), f"{where}.weights.block_structure", origin))
        return cls("compressed-tensors", ("_scale",), tuple(dict.fromkeys(blocks)), origin)

    def scale_names(self, name: str) -> list[str]:
        """The names the scale of quantized tensor ``name`` may have (``X.weight`` -> ``X.weight_scale_inv``)."""
        return [name + suffix for suffix in self.scale_suffixes]

    def weight(self, name: str, data: np.ndarray, scale: np.ndarray) -> QuantizedWeight:
        """The `QuantizedWeight` of tensor ``name`` from its stored elements and scale tensor: the scale
        is converted to float32 and shaped to the block grid (per tensor, per row or per block), the
        block inferred from the grid and the declared block shapes; a `ModelLoadError` when they do not fit."""
        shape = tuple(data.shape)
        if len(shape) < 2:
            raise ModelLoadError(f"{self.origin}: quantized tensor {name!r} has shape {shape}; expected [..., out, in]")
        scales = _scale_array(np.asarray(scale, dtype=np.float32), shape)
        if scales is None:
            raise ModelLoadError(
                f"{self.origin}: the scale of {name!r} has shape {tuple(scale.shape)}, which fits no scale layout "
                f"of a {shape} weight"
            )
        block = self._block_for(shape, tuple(scales.shape))
        if block is None:
            declared = ", ".join(str(list(b)) for b in self.blocks) or "none"
            raise ModelLoadError(
                f"{self.origin}: the scale of {name!r} has shape {tuple(scale.shape)}; a {shape} weight has one "
                f"scale per tensor, per row or per block (declared block sizes: {declared})"
            )
        return QuantizedWeight(self.format, data, np.ascontiguousarray(scales), block, shape)

    def _block_for(self, shape: tuple[int, ...], grid: tuple[int, ...]) -> tuple[int, int] | None:
        rows, cols = shape[-2:]
        per_row = [(1, bk) for _, bk in self.blocks]  # blocks spread to one scale per row (fused banks)
        candidates = [*self.blocks, *per_row, (max(rows, 1), max(cols, 1)), (1, max(cols, 1))]
        if grid[-2] and grid[-1] and rows % grid[-2] == 0 and cols % grid[-1] == 0:
            candidates.append((rows // grid[-2], cols // grid[-1]))
        for block in candidates:
            if scale_grid(shape, block) == grid:
                return block
        return None


def _block(value: Any, key: str, origin: str) -> tuple[int, int]:
    if not (
        isinstance(value, Sequence)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        raise ModelLoadError(f"{origin}: {key} must be two positive integers [rows, columns], got {value!r}")
    return int(value[0]), int(value[1])


def _scale_array(scale: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``scale`` with as many axes as the weight: a missing trailing axis (per-row ``[N]``, per-matrix
    ``[E]``) becomes 1, and a single value is one scale per matrix. None when it fits none of these."""
    ndim = len(shape)
    if scale.ndim == ndim:
        return scale
    if scale.ndim < ndim and scale.shape == shape[: scale.ndim]:
        return scale.reshape(scale.shape + (1,) * (ndim - scale.ndim))
    if scale.size == 1:
        return np.broadcast_to(scale.reshape((1,) * ndim), (*shape[:-2], 1, 1))
    return None
