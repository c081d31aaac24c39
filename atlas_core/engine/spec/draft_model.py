"""`DraftModelProposer`: greedy proposals of a smaller checkpoint that shares the target's tokenizer.

The draft model keeps its own paged KV cache and one block table per sequence. Each `propose` first
brings a sequence's draft KV up to its current tokens (only the tokens the draft has not seen: after a
verification, the draft KV of accepted draft tokens is kept), then runs ``k`` batched greedy steps.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import numpy as np

from atlas_core.backends.base import AttentionMetadata, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import KVCache, kv_storage_layouts, plan_kv_cache, slots_for
from atlas_core.engine.block_manager import BlockManager, BlockTable
from atlas_core.engine.sequence import Sequence
from atlas_core.engine.spec.config import SpeculativeConfig
from atlas_core.errors import ConfigError
from atlas_core.model.load import LoadedModel, load_model
from atlas_core.plugins import get_registry

TOKENIZER_PROBE = "Speculative drafts: The quick brown fox, 1234 + 5678 = ?\n def f(x): return x**2  # ok"


@dataclass
class _DraftState:
    """One sequence's draft KV: ``table`` holds the KV of ``seen[:len(seen)]`` (the tokens the draft
    model has computed, its own last proposals included)."""

    table: BlockTable = field(default_factory=BlockTable)
    seen: list[int] = field(default_factory=list)


class DraftModelProposer:
    """Proposes with a draft model; see the module docstring. Needs `allocate_kv` before `propose`."""

    def __init__(self, draft: LoadedModel, backend: Backend, target_vocab: int, max_seq_len: int) -> None:
        if draft.model.has_recurrent_state:
            raise ConfigError(
                f"draft model {draft.resolved.path} has recurrent layers; a draft model must be attention-only"
            )
        self.draft, self.backend = draft, backend
        self.target_vocab, self.max_seq_len = target_vocab, max_seq_len
        self.layouts = kv_storage_layouts(draft.model.kv_layouts, "auto", backend)
        self.kv: KVCache | None = None
        self.blocks: BlockManager | None = None
        self._states: dict[Sequence, _DraftState] = {}

    @classmethod
    def load(
        cls, config: SpeculativeConfig, target: LoadedModel, backend: Backend, max_seq_len: int
    ) -> DraftModelProposer:
        """Load ``config.model`` on ``backend``; `ConfigError` when its tokenizer differs from the target's."""
        assert config.model is not None  # SpeculativeConfig requires it for draft_model
        draft = load_model(config.model, backend, get_registry(), max_positions=max_seq_len)
        if draft.tokenizer is not None and target.tokenizer is not None:
            if draft.tokenizer.encode(TOKENIZER_PROBE) != target.tokenizer.encode(TOKENIZER_PROBE):
                raise ConfigError(
                    f"draft model {draft.resolved.path} does not share the target's tokenizer (they encode the same "
                    "text differently); pick a draft model of the same family"
                )
        return cls(draft, backend, target.model.vocab_size, max_seq_len)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of draft KV per token."""
        return sum(layout.bytes_per_token(self.backend.activation_dtype) for layout in self.layouts)

    def allocate_kv(self, budget_bytes: int, block_size: int, max_num_seqs: int, source: str) -> None:
        """Allocate the draft's KV cache from ``budget_bytes`` (`KVCacheTooSmallError` if one sequence of
        ``max_seq_len`` does not fit)."""
        dtype = self.backend.activation_dtype
        plan = plan_kv_cache(self.layouts, dtype, block_size, budget_bytes, self.max_seq_len, source, max_num_seqs)
        self.kv = KVCache(self.backend, self.layouts, plan)
        self.blocks = BlockManager(plan.num_blocks, block_size, enable_prefix_caching=False)

    def propose(self, seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
        if self.blocks is None or self.kv is None:
            raise RuntimeError("DraftModelProposer.allocate_kv was not called")
        drafts: list[list[int]] = [[] for _ in seqs]
        active: list[int] = []
        for i, (seq, k) in enumerate(zip(seqs, max_tokens, strict=True)):
            state = self._states.setdefault(seq, _DraftState())
            # keep the draft KV of the tokens still agreeing with the sequence; the last token is always fed
            state.seen = state.seen[: min(_common_prefix(state.seen, seq.token_ids), len(seq.token_ids) - 1)]
            # positions len(seen)..len(token_ids)+k-2 get draft KV: the catch-up tokens and k-1 proposals
            if (
                k > 0
                and self.blocks.prepare_write(state.table, len(state.seen), len(seq.token_ids) + k - 1) is not None
            ):
                active.append(i)
        pending = {i: seqs[i].token_ids[len(self._states[seqs[i]].seen) :] for i in active}
        limit = {i: max_tokens[i] for i in active}
        while active := [i for i in active if len(drafts[i]) < limit[i]]:
            tokens = self._step([seqs[i] for i in active], [pending[i] for i in active])
            for i, token in zip(active, tokens, strict=True):
                self._states[seqs[i]].seen.extend(pending[i])
                if token >= self.target_vocab:  # a padding row of a larger draft vocabulary: stop guessing
                    limit[i] = len(drafts[i])
                drafts[i].append(token)
                pending[i] = [token]
        return [draft[: limit.get(i, 0)] for i, draft in enumerate(drafts)]

    def _step(self, seqs: list[Sequence], new_tokens: list[list[int]]) -> list[int]:
        """One forward of the draft model over each sequence's ``new_tokens`` (after its seen tokens);
        the greedy next token of each."""
        assert self.kv is not None
        ids, positions, slots, starts, seq_lens = [], [], [], [0], []
        max_blocks = max(len(self._states[seq].table.blocks) for seq in seqs)
        tables = np.full((len(seqs), max_blocks), -1, dtype=np.int32)
        for b, (seq, new) in enumerate(zip(seqs, new_tokens, strict=True)):
            state = self._states[seq]
            start, end = len(state.seen), len(state.seen) + len(new)
            ids.extend(new)
            positions.append(np.arange(start, end, dtype=np.int32))
            slots.append(slots_for(state.table.blocks, self.kv.block_size, start, end))
            tables[b, : len(state.table.blocks)] = state.table.blocks
            starts.append(starts[-1] + len(new))
            seq_lens.append(end)
        upload = self.backend.from_numpy
        batch = ForwardBatch(
            input_ids=upload(np.asarray(ids, dtype=np.int32)),
            positions=upload(np.concatenate(positions)),
            attention=AttentionMetadata(
                query_start_loc=upload(np.asarray(starts, dtype=np.int32)),
                seq_lens=upload(np.asarray(seq_lens, dtype=np.int32)),
                block_tables=upload(tables),
                slot_mapping=upload(np.concatenate(slots).astype(np.int32)),
            ),
            logits_rows=np.asarray(starts[1:], dtype=np.int64) - 1,
            state_slots=upload(np.full(len(seqs), -1, dtype=np.int32)),
        )
        model = self.draft.model
        hidden = model.forward(batch, self.kv)
        logits = model.compute_logits(hidden[upload(batch.logits_rows)])
        return [int(token) for token in self.backend.to_numpy(self.backend.argmax(logits))]

    def release(self, seq: Sequence) -> None:
        state = self._states.pop(seq, None)
        if state is not None and self.blocks is not None:
            self.blocks.free(state.table)


def _common_prefix(a: Seq[int], b: Seq[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n
