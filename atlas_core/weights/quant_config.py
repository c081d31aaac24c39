"""What a checkpoint's ``quantization_config`` declares, and how its quantized tensors are stored.

Two published FP8 layouts and two NVFP4 layouts are read (`QuantizationScheme.from_config`); any other
``quant_method`` (awq, gptq, bitsandbytes, mxfp4, ...) is refused with a `ModelLoadError` naming it, the
file and what is supported:

* ``quant_method: "fp8"`` (DeepSeek-V3, Qwen3-FP8, MiniMax-M2; transformers' fine-grained FP8):
  ``fmt: "e4m3"``, ``weight_block_size: [bn, bk]``; each quantized linear has ``weight`` (F8_E4M3)
  and ``weight_scale_inv`` (F32 ``[ceil(N / bn), ceil(K / bk)]``), the factor each block's elements are
  multiplied by. Without ``weight_block_size`` the scale is per tensor (``weight_scale``).
  Fused expert banks (``experts.gate_up_proj``) carry ``experts.gate_up_proj_scale_inv``.
* ``quant_method: "compressed-tensors"`` with format ``float-quantized`` (llm-compressor's FP8):
  every config group that quantizes weights has ``num_bits: 8``, ``type: "float"`` and strategy
  ``channel`` (``weight_scale [N, 1]``), ``tensor`` (one scale) or ``block`` (``block_structure``);
  the scale (any float dtype) multiplies the elements.
* ``quant_method: "compressed-tensors"`` with format ``nvfp4-pack-quantized`` (llm-compressor's NVFP4 /
  NVFP4A16): weights ``num_bits: 4``, ``type: "float"``, strategy ``tensor_group``, ``group_size: 16``;
  each quantized linear has ``weight_packed`` (U8), ``weight_scale`` (F8_E4M3) and
  ``weight_global_scale`` (F32, the divisor), read as ``weight`` (`atlas_core.weights.nvfp4`).
* NVIDIA ModelOpt NVFP4: ``quant_method: "modelopt"``, ``quant_algo: "NVFP4"`` in config.json, or
  ``hf_quant_config.json``'s ``quantization.quant_algo: "NVFP4"`` (`from_hf_quant_config`); each
  quantized linear has ``weight`` (U8, packed), ``weight_scale`` (F8_E4M3) and ``weight_scale_2`` (F32,
  the multiplier). Its ``input_scale`` (the static activation scale of W4A4 execution) is not read.

Which tensors are quantized is read from the files, not from ``modules_to_not_convert`` / ``ignore`` /
``exclude_modules``: an FP8 tensor is quantized exactly when it is stored as F8_E4M3, an NVFP4 one when its
packed elements are stored as U8, and it must then have its scales. Activation
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
from atlas_core.weights.nvfp4 import GROUP, NVFP4, nvfp4_weight
from atlas_core.weights.quantized import ELEMENT_DTYPES, FP8_E4M3, QuantizedWeight, scale_grid

SUPPORTED_METHODS = (
    "'fp8' (FP8 E4M3 weights with block or per-tensor scales), 'compressed-tensors' (format "
    "'float-quantized': FP8 E4M3 weights with channel, tensor or block scales; format 'nvfp4-pack-quantized': "
    "NVFP4 weights in groups of 16) and 'modelopt' (quant_algo 'NVFP4')"
)
NVFP4_PACKED = "nvfp4-pack-quantized"
MODELOPT_ALGORITHMS = ("NVFP4",)
"""What the refusal of any other ``quant_method`` lists as supported."""
CHANNEL_STRATEGIES = ("channel", "tensor", "block")


@dataclass(frozen=True)
class QuantizationScheme:
    """One checkpoint's quantization: ``method`` (``"fp8"`` or ``"compressed-tensors"``), the suffixes
    that name a weight's scale tensor (tried in order), the block shapes config.json declares, and
    ``origin`` (the config.json path, for error messages). ``format``: `FP8_E4M3` or `NVFP4` (whose
    tensors are named by `nvfp4_names`)."""

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
        if method == "modelopt":
            return cls._modelopt(settings, "quantization_config", origin)
        raise ModelLoadError(
            f"{origin}: quantization_config.quant_method {method!r} is not supported; supported: {SUPPORTED_METHODS}"
        )

    @classmethod
    def from_hf_quant_config(cls, data: Any, origin: str = "hf_quant_config.json") -> QuantizationScheme:
        """The scheme of a ModelOpt ``hf_quant_config.json`` (``{"producer": ..., "quantization":
        {"quant_algo": ..., "group_size": ..., "exclude_modules": [...]}}``); a `ModelLoadError` naming
        ``origin`` for any algorithm but NVFP4."""
        settings = data.get("quantization") if isinstance(data, dict) else None
        if not isinstance(settings, dict):
            raise ModelLoadError(f"{origin}: expected an object with a 'quantization' object, got {data!r}")
        return cls._modelopt(settings, "quantization", origin)

    @classmethod
    def _modelopt(cls, settings: dict[str, Any], key: str, origin: str) -> QuantizationScheme:
        nested = settings.get("quantization")
        algo = settings.get("quant_algo") or (nested.get("quant_algo") if isinstance(nested, dict) else None)
        if algo not in MODELOPT_ALGORITHMS:
            raise ModelLoadError(
                f"{origin}: {key}.quant_algo {algo!r} of a ModelOpt checkpoint is not supported; supported: "
                f"{', '.join(repr(a) for a in MODELOPT_ALGORITHMS)} (NVFP4 weights in groups of 16)"
            )
        group_size = settings.get("group_size") or (nested.get("group_size") if isinstance(nested, dict) else None)
        if group_size not in (None, GROUP):
            raise ModelLoadError(f"{origin}: {key}.group_size {group_size!r} is not supported; NVFP4 uses {GROUP}")
        return cls("modelopt", ("_scale",), (), origin, NVFP4)

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
        formats = {group.get("format") or settings.get("format") for group in groups.values() if _weights(group)}
        if NVFP4_PACKED in formats:
            if len(formats) > 1:
                raise ModelLoadError(
                    f"{origin}: compressed-tensors checkpoints mixing formats {sorted(map(str, formats))} are not "
                    f"supported; supported: {SUPPORTED_METHODS}"
                )
            return cls._nvfp4_groups(groups, origin)
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

    @classmethod
    def _nvfp4_groups(cls, groups: dict[str, Any], origin: str) -> QuantizationScheme:
        for name, group in groups.items():
            weights = _weights(group)
            if not weights:
                continue
            where = f"quantization_config.config_groups.{name}.weights"
            bits, kind, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
            if (bits, kind, strategy, weights.get("group_size")) != (4, "float", "tensor_group", GROUP):
                raise ModelLoadError(
                    f"{origin}: {where}: {bits}-bit {kind!r} weights with strategy {strategy!r} and group_size "
                    f"{weights.get('group_size')!r} are not supported in format {NVFP4_PACKED!r}; supported: 4-bit "
                    f"'float' weights with strategy 'tensor_group' and group_size {GROUP} (NVFP4)"
                )
        return cls("compressed-tensors", ("_scale",), (), origin, NVFP4)

    def nvfp4_names(self, name: str) -> tuple[str, str, str]:
        """The stored tensors of NVFP4 weight ``name`` (``X.weight``): packed elements, group scales, global
        scale (compressed-tensors: ``X.weight_packed``, ``X.weight_scale``, ``X.weight_global_scale``;
        ModelOpt: ``X.weight``, ``X.weight_scale``, ``X.weight_scale_2``)."""
        if self.method == "modelopt":
            return name, name + "_scale", name + "_scale_2"
        return name + "_packed", name + "_scale", name + "_global_scale"

    def nvfp4_weight(
        self, name: str, packed: np.ndarray, scale: np.ndarray, global_scale: np.ndarray
    ) -> QuantizedWeight:
        """The NVFP4 `QuantizedWeight` of tensor ``name`` from its stored tensors; the global scale (one value,
        or one per matrix of a bank) becomes the factor of the group scales: its inverse for compressed-tensors
        (a divisor), itself for ModelOpt. A `ModelLoadError` when the shapes do not fit."""
        shape = (*packed.shape[:-1], packed.shape[-1] * 2)
        value = np.asarray(global_scale, dtype=np.float64)
        per_matrix = len(shape) > 2 and value.size == int(np.prod(shape[:-2]))
        fits = value.size == 1 or per_matrix
        if len(shape) < 2 or tuple(scale.shape) != (*shape[:-1], shape[-1] // GROUP) or not fits:
            raise ModelLoadError(
                f"{self.origin}: NVFP4 tensor {name!r}: packed elements {tuple(packed.shape)}, group scales "
                f"{tuple(scale.shape)} and global scale {tuple(value.shape)} do not fit (expected scales "
                f"[..., N, K / {GROUP}] for packed [..., N, K / 2] and one global scale per matrix)"
            )
        check_scales(self.origin, name, "global scale", value, positive=True)
        check_scales(self.origin, name, "group scales", np.asarray(scale).view(ELEMENT_DTYPES[FP8_E4M3]))
        value = value.reshape(shape[:-2]) if value.size > 1 else value.reshape(())
        factor = 1.0 / value if self.method == "compressed-tensors" else value
        return nvfp4_weight(packed, scale, factor)

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
        check_scales(self.origin, name, "scale", np.asarray(scale, dtype=np.float32))
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


def check_scales(origin: str, name: str, what: str, values: np.ndarray, *, positive: bool = False) -> None:
    """A `ModelLoadError` naming tensor ``name`` when its ``what`` holds NaN, infinite or negative values
    (or zeros, with ``positive``): a corrupt checkpoint, which would otherwise load and produce garbage."""
    numbers = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(numbers) | (numbers <= 0 if positive else numbers < 0)
    if bad.any():
        example = numbers[bad].flat[0]
        raise ModelLoadError(
            f"{origin}: the {what} of {name!r} holds {int(bad.sum())} invalid value(s) (e.g. {example}; scales "
            f"must be finite and {'positive' if positive else 'non-negative'}): the checkpoint is corrupt"
        )


def _weights(group: Any) -> Any:
    """A config group's ``weights`` settings (None when it quantizes activations only)."""
    return group.get("weights") if isinstance(group, dict) else None


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
