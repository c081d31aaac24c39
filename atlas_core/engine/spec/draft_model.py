"""`DraftModelProposer`: greedy proposals of a smaller checkpoint that shares the target's tokenizer.

The draft model keeps its own paged KV cache (`DraftKV`). Each `propose` first brings a sequence's draft
KV up to its current tokens (only the tokens the draft has not seen: after a verification, the draft
KV of accepted draft tokens is kept), then runs ``k`` batched greedy steps, replaying the backend's
decode graphs of the draft model where they serve a step.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from atlas_core.backends.base import Backend
from atlas_core.engine.decode_graphs import DecodeGraphs
from atlas_core.engine.sequence import Sequence
from atlas_core.engine.spec.config import SpeculativeConfig
from atlas_core.engine.spec.draft_kv import DraftKV, DraftRows, forward_rows
from atlas_core.errors import ConfigError
from atlas_core.model.load import LoadedModel, load_model
from atlas_core.plugins import get_registry

TOKENIZER_PROBE = "Speculative drafts: The quick brown fox, 1234 + 5678 = ?\n def f(x): return x**2  # ok"


OUT_OF_VOCABULARY_ID = 0
"""What the draft model reads for a target token beyond its vocabulary (the draft cannot see an image: its
placeholder tokens only need to be valid ids; the verify step decides what counts)."""


class DraftModelProposer:
    """Proposes with a draft model; see the module docstring. Needs ``cache.allocate`` before `propose`."""

    def __init__(self, draft: LoadedModel, backend: Backend, target_vocab: int, max_seq_len: int) -> None:
        if draft.model.has_recurrent_state:
            raise ConfigError(
                f"draft model {draft.resolved.path} has recurrent layers; a draft model must be attention-only"
            )
        self.draft, self.backend, self.target_vocab = draft, backend, target_vocab
        self.cache = DraftKV(backend, draft.model.kv_layouts, max_seq_len)
        self._seen: dict[Sequence, list[int]] = {}  # the tokens whose draft KV the sequence's table holds
        self.graphs: DecodeGraphs | None = None  # the backend's captured steps of the draft model, made on first use

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

    def propose(self, seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in seqs]
        active: list[int] = []
        for i, (seq, k) in enumerate(zip(seqs, max_tokens, strict=True)):
            seen = self._seen.setdefault(seq, [])
            # keep the draft KV of the tokens still agreeing with the sequence; the last token is always fed
            del seen[min(_common_prefix(seen, seq.token_ids), len(seq.token_ids) - 1) :]
            table = self.cache.table(seq)
            table.length = len(seen)
            # positions len(seen)..len(token_ids)+k-2 get draft KV: the catch-up tokens and k-1 proposals
            if k > 0 and self.cache.reserve(table, len(seq.token_ids) + k - 1):
                active.append(i)
        pending = {i: seqs[i].token_ids[len(self._seen[seqs[i]]) :] for i in active}
        limit = {i: max_tokens[i] for i in active}
        while active := [i for i in active if len(drafts[i]) < limit[i]]:
            tokens = self._step([seqs[i] for i in active], [pending[i] for i in active])
            for i, token in zip(active, tokens, strict=True):
                seen = self._seen[seqs[i]]
                seen.extend(pending[i])
                self.cache.table(seqs[i]).length = len(seen)
                if token >= self.target_vocab:  # a padding row of a larger draft vocabulary: stop guessing
                    limit[i] = len(drafts[i])
                drafts[i].append(token)
                pending[i] = [token]
        return [draft[: limit.get(i, 0)] for i, draft in enumerate(drafts)]

    def _step(self, seqs: list[Sequence], new_tokens: list[list[int]]) -> list[int]:
        """One forward of the draft model over each sequence's ``new_tokens`` (after its seen tokens);
        the greedy next token of each. A token the draft's vocabulary lacks (an image placeholder of a
        vision-language target with a larger vocabulary) is read as `OUT_OF_VOCABULARY_ID`."""
        vocab = self.draft.model.vocab_size
        rows = [
            DraftRows(
                self.cache.table(seq).table.blocks,
                len(self._seen[seq]),
                [token if token < vocab else OUT_OF_VOCABULARY_ID for token in new],
            )
            for seq, new in zip(seqs, new_tokens, strict=True)
        ]
        batch = self.cache.batch(rows)
        assert self.cache.kv is not None  # batch() checked it
        if self.graphs is None:
            self.graphs = self.backend.decode_graphs(self.draft.model, self.cache.kv)
        logits = forward_rows(self.backend, self.draft.model, self.graphs, batch, self.cache.kv)[1]
        return [int(token) for token in self.backend.to_numpy(self.backend.argmax(logits))]

    def release(self, seq: Sequence) -> None:
        self._seen.pop(seq, None)
        self.cache.release(seq)


def _common_prefix(a: Seq[int], b: Seq[int]) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n
