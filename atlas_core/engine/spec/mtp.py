"""`MtpProposer`: drafts from the checkpoint's own multi-token-prediction head (`atlas_core.model.mtp`).

The MTP layers' KV lives in the target's paged cache, as extra layers under the same block tables: the
prefix cache, preemption and swap carry it with the target's, and a prompt that hits the prefix cache
finds the MTP entries of its cached positions too.

After each target forward (`observe`), the MTP layer runs over the positions the step confirmed: row
``p`` takes the target's final hidden state ``h_p`` and token ``p + 1``, and writes its KV at ``p``.
When that reaches the sequence's newest token, its last row predicts the first draft token, and up to
``K - 1`` chained steps (the MTP output standing in for ``h``, the draft for the token) predict the
rest, writing provisional entries that the next observation overwrites. The chain stops at the end of
the blocks the sequence already holds (drafts never allocate). `propose` hands out the drafts made for
the sequence's current length. The MTP steps replay the backend's decode graphs (`MtpStep` looks like
a model to them) where those serve the batch: one token per sequence, or as many tokens each. On a split
model every rank holds its shard of the head and runs the steps rank 0 posts (`atlas_core.model.mtp`).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from atlas_core.backends.base import Array, Backend
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.batch.kv_cache import AnyKVLayout, KVCache
from atlas_core.engine.decode_graphs import DecodeGraphs
from atlas_core.engine.sequence import Sequence
from atlas_core.engine.spec.draft_kv import DraftRows, draft_batch, forward_rows
from atlas_core.engine.spec.proposer import HiddenSpan
from atlas_core.model.load import LoadedModel
from atlas_core.model.mtp import MtpHead, load_mtp_head
from atlas_core.parallel.mirror import RankMirror


class MtpProposer:
    """Proposes up to ``num_tokens`` drafts per step with an `MtpHead`; needs `attach` before use."""

    def __init__(self, head: MtpHead, backend: Backend, num_tokens: int) -> None:
        self.head, self.backend, self.num_tokens = head, backend, num_tokens
        self.steps = head.steps()
        self.graphs: list[DecodeGraphs | None] = []
        self.kv: KVCache | None = None
        self._end: dict[Sequence, int] = {}  # seq -> first position without a confirmed MTP entry
        self._drafts: dict[Sequence, tuple[int, list[int]]] = {}  # seq -> (its length they follow, drafts)

    @classmethod
    def load(cls, target: LoadedModel, backend: Backend, num_tokens: int, max_seq_len: int) -> MtpProposer:
        """Build the MTP head of ``target``'s checkpoint (its family's ``build_mtp``); `ConfigError` when
        the family or the checkpoint has none. On rank 0 of a split model every rank builds its shard."""
        mirror = target.model.mirror
        parallel = mirror.load_mtp(max_seq_len) if isinstance(mirror, RankMirror) else None
        return cls(load_mtp_head(target, backend, max_seq_len, parallel), backend, num_tokens)

    @property
    def kv_layouts(self) -> list[AnyKVLayout]:
        """The MTP layers' KV layouts, appended to the target's in its cache."""
        return self.head.kv_layouts

    def attach(self, kv: KVCache) -> None:
        """Use the target's cache ``kv`` (which holds `kv_layouts` after the target's own), and the
        backend's decode graphs for the MTP steps where it has them (never on a split model: its steps are
        posted to the other ranks)."""
        self.kv = kv
        split = self.head.target.mirror is not None
        self.graphs = [None if split else self.backend.decode_graphs(step, kv) for step in self.steps]

    @property
    def tracked_sequences(self) -> int:
        """Sequences with MTP bookkeeping (0 once every sequence is released)."""
        return len(self._end.keys() | self._drafts.keys())

    def propose(self, seqs: Seq[Sequence], max_tokens: Seq[int]) -> list[list[int]]:
        out = []
        for seq, k in zip(seqs, max_tokens, strict=True):
            length, drafts = self._drafts.get(seq, (-1, []))
            out.append(drafts[:k] if length == len(seq.token_ids) else [])
        return out

    def observe(self, hidden: Array, spans: Seq[HiddenSpan]) -> None:
        if self.kv is None:
            raise RuntimeError("MtpProposer.attach was not called")
        seqs: list[Sequence] = []
        rows: list[DraftRows] = []
        gather: list[int] = []
        for span in spans:
            seq = span.seq
            # positions before the span came from the prefix cache with their MTP entries, or are held already
            first = max(span.position, self._end.get(seq, 0))
            last = min(span.position + span.length, len(seq.token_ids) - 1)  # token p + 1 must exist
            if seq.finished or last <= first:
                continue
            seqs.append(seq)
            rows.append(DraftRows(seq.table.blocks, first, seq.token_ids[first + 1 : last + 1]))
            gather.extend(range(span.row + first - span.position, span.row + last - span.position))
            self._end[seq] = last
        if not rows:
            return
        upload = self.backend.from_numpy
        batch = draft_batch(self.backend, self.kv.block_size, rows, hidden[upload(np.asarray(gather))])
        out, logits = self._run(0, batch)
        # sequences whose newest token was fed: their last row predicts the first draft token
        ready = [i for i, seq in enumerate(seqs) if self._end[seq] == len(seq.token_ids) - 1]
        if ready:
            chosen = upload(np.asarray(ready))
            self._chain([seqs[i] for i in ready], out[chosen], logits[chosen])

    def _run(self, step: int, batch: ForwardBatch) -> tuple[Array, Array]:
        """MTP step ``step`` over ``batch``: (the output rows of ``batch.logits_rows``, their logits)."""
        assert self.kv is not None  # observe() checked it
        index = step % len(self.steps)
        return forward_rows(self.backend, self.steps[index], self.graphs[index], batch, self.kv)

    def _chain(self, seqs: list[Sequence], hidden: Array, logits: Array) -> None:
        """From the MTP rows ``hidden`` (and their ``logits``) at each sequence's newest position, the first
        draft token and up to ``num_tokens - 1`` chained ones; kept for `propose`."""
        assert self.kv is not None  # observe() checked it
        proposals = [[token] for token in self._greedy(logits)]
        active = list(range(len(seqs)))
        for step in range(1, self.num_tokens):
            # chained step `step` writes position end + step - 1; only into blocks the sequence holds
            keep = [
                j
                for j, i in enumerate(active)
                if self._end[seqs[i]] + step - 1 < len(seqs[i].table.blocks) * self.kv.block_size
            ]
            if not keep:
                break
            if len(keep) < len(active):
                active, hidden = [active[j] for j in keep], hidden[self.backend.from_numpy(np.asarray(keep))]
            rows = [DraftRows(seqs[i].table.blocks, self._end[seqs[i]] + step - 1, proposals[i][-1:]) for i in active]
            hidden, logits = self._run(step, draft_batch(self.backend, self.kv.block_size, rows, hidden))
            for i, token in zip(active, self._greedy(logits), strict=True):
                proposals[i].append(token)
        for seq, proposal in zip(seqs, proposals, strict=True):
            self._drafts[seq] = (len(seq.token_ids), proposal)

    def _greedy(self, logits: Array) -> list[int]:
        return [int(t) for t in self.backend.to_numpy(self.backend.argmax(logits))]

    def release(self, seq: Sequence) -> None:
        self._end.pop(seq, None)
        self._drafts.pop(seq, None)
