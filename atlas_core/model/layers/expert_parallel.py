"""Expert parallelism: a rank's share of one MoE layer's routed experts (`atlas_core.model.sharding`).

A rank holds the experts of its expert group (`ShardPlan.experts`), each cut to its share of the
intermediate rows (`ShardPlan.expert_rows`): gate and up rows of ``w_in``, the matching columns of
``w_out``. `ExpertShard` runs them on every token with the router's choices of the held experts,
giving this rank's part of the block's output; the block's all-reduce adds the other ranks' parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from atlas_core.backends.base import Array
from atlas_core.errors import ModelLoadError
from atlas_core.weights.quantized import QuantizedWeight, concat_rows, stack_experts

if TYPE_CHECKING:
    from atlas_core.model.layers.moe import ExpertNames, Experts
    from atlas_core.model.loader import ModelWeightLoader

Bank = np.ndarray | QuantizedWeight
"""An expert bank ``[E, N, K]`` (or one expert's weight), float or quantized."""


class ExpertShard:
    """The routed experts ``experts`` (a bank of ``len(held)`` experts) of global ids ``held`` out of
    ``num_experts``: a token's choices of other experts weigh nothing here (other ranks add them).
    Called like `Experts`; the result is this rank's partial sum."""

    def __init__(self, experts: Experts, held: range, num_experts: int) -> None:
        if experts.num_experts != len(held):
            raise ValueError(f"ExpertShard: a bank of {experts.num_experts} experts cannot hold experts {held}")
        self.experts, self.held, self._num_experts = experts, held, num_experts

    @property
    def num_experts(self) -> int:
        """E, the routed experts of the whole layer (what the router chooses among)."""
        return self._num_experts

    def __call__(self, x: Array, weights: Array, ids: Array) -> Array:
        local = ids - self.held.start
        held = (local >= 0) & (local < len(self.held))
        return self.experts(x, weights * held, local * held)


def read_expert_shard(
    loader: ModelWeightLoader, prefix: str, num_experts: int, names: ExpertNames
) -> tuple[range, Bank, Bank]:
    """``(held expert ids, w_in, w_out)``: this rank's experts under ``prefix`` (fused or per-expert
    tensors, as `read_experts` reads them; quantized ones stay quantized), each cut to the rank's
    intermediate rows; only those parts are read from the checkpoint."""
    plan = loader.shard
    held = plan.experts(num_experts)
    gated = names.gate is not None
    fused_in, fused_out = prefix + ("gate_up_proj" if gated else names.up), prefix + "down_proj"
    if fused_in in loader.source and fused_out in loader.source:
        shape = loader.weight_shape(fused_out)
        if len(shape) != 3 or shape[0] != num_experts:
            raise ModelLoadError(
                f"{loader.origin}: fused expert tensor {fused_out!r} {shape} must be [{num_experts}, out, in]"
            )
        rows = plan.expert_rows(shape[2])
        in_parts = [rows, range(shape[2] + rows.start, shape[2] + rows.stop)] if gated else [rows]
        w_in = concat_bank_rows([loader.weight_part(fused_in, held, part) for part in in_parts])
        return held, w_in, loader.weight_part(fused_out, held, slice(None), rows)
    down = f"{prefix}{held.start}.{names.down}.weight"
    rows = plan.expert_rows(loader.weight_shape(down)[1])
    projections = [names.gate, names.up] if names.gate is not None else [names.up]
    stacked_in = stack_experts(
        [concat_rows([loader.weight_part(f"{prefix}{e}.{p}.weight", rows) for p in projections]) for e in held]
    )
    stacked_out = stack_experts(
        [loader.weight_part(f"{prefix}{e}.{names.down}.weight", slice(None), rows) for e in held]
    )
    return held, stacked_in, stacked_out


def concat_bank_rows(parts: list[Bank]) -> Bank:
    """Expert banks ``[E, N_i, K]`` joined along each expert's rows (gate rows, then up rows)."""
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(part, np.ndarray) for part in parts):
        return np.concatenate(parts, axis=1)  # type: ignore[arg-type]
    experts = parts[0].shape[0]
    return stack_experts([concat_rows([_expert(part, e) for part in parts]) for e in range(experts)])


def _expert(bank: Bank, index: int) -> np.ndarray | QuantizedWeight:
    return bank.expert(index) if isinstance(bank, QuantizedWeight) else bank[index]
