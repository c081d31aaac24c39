"""`Speculation`: the engine's speculative decoding: which sequences speculate, how many drafts they get,
and their proposals.

Per step: the scheduler makes room for up to ``draft_room(seq)`` draft tokens behind each decoding
sequence's token (`Scheduler`), `propose` fills the scheduled chunks' drafts, the runner verifies them in
the same forward as everything else (`atlas_core.engine.spec.verify`).

A sequence speculates unless its next tokens depend on the tokens before them in a way a verify forward
does not model: ``min_tokens`` still pending, a thinking budget (`GuidedDecoding`), and pooling
requests. Those sequences decode one token per step in the same batches. Penalties and grammar masks
are applied per verified row as if the drafts before it were kept (`logit_adjustments`,
`GuidedDecoding.banned_tokens`).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING

from atlas_core.backends.base import Backend
from atlas_core.batch.kv_cache import AnyKVLayout, KVCache
from atlas_core.engine.runner import ScheduledChunk
from atlas_core.engine.sequence import Sequence
from atlas_core.engine.spec.config import SpeculativeConfig
from atlas_core.engine.spec.draft_model import DraftModelProposer
from atlas_core.engine.spec.mtp import MtpProposer
from atlas_core.engine.spec.proposer import HiddenObserver, NgramProposer, Proposer

if TYPE_CHECKING:
    from atlas_core.engine.config import EngineConfig
    from atlas_core.engine.guided_decoding import GuidedDecoding
    from atlas_core.model.load import LoadedModel


class Speculation:
    """Eligibility, draft room and proposals for one engine (see the module docstring)."""

    def __init__(self, config: SpeculativeConfig, proposer: Proposer) -> None:
        self.config = config
        self.proposer = proposer
        self.guided: GuidedDecoding | None = None

    @classmethod
    def build(
        cls, config: SpeculativeConfig | None, target: LoadedModel, backend: Backend, max_seq_len: int
    ) -> Speculation | None:
        """The engine's speculation for ``config`` (None: off); a draft model is loaded here."""
        if config is None:
            return None
        if config.method == "ngram":
            return cls(config, NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max))
        if config.method == "mtp":
            return cls(config, MtpProposer.load(target, backend, config.num_speculative_tokens, max_seq_len))
        return cls(config, DraftModelProposer.load(config, target, backend, max_seq_len))

    @property
    def observer(self) -> HiddenObserver | None:
        """The proposer, when it reads the target's hidden states (MTP)."""
        return self.proposer if isinstance(self.proposer, MtpProposer) else None

    @property
    def kv_layouts(self) -> list[AnyKVLayout]:
        """Layers the proposer keeps in the target's KV cache, after the target's own (MTP)."""
        return self.proposer.kv_layouts if isinstance(self.proposer, MtpProposer) else []

    def attach(self, kv: KVCache) -> None:
        """The target's KV cache is allocated (with `kv_layouts`)."""
        if isinstance(self.proposer, MtpProposer):
            self.proposer.attach(kv)

    def allocate_kv(
        self,
        budget: int,
        target_bytes_per_token: int,
        config: EngineConfig,
        source: str,
        more: Callable[[int], str | None],
    ) -> tuple[int, Callable[[int], str | None]]:
        """A draft model's KV cache takes the share of the KV ``budget`` (bytes) that lets it hold as many
        tokens as the target's; returns what is left for the target (all of it for other methods) and the setting
        that gives the target ``extra`` bytes more. ``more(extra)``: the setting that gives the whole budget
        ``extra`` bytes more (`atlas_core.engine.config.KVBudget`)."""
        if not isinstance(self.proposer, DraftModelProposer):
            return budget, more
        cache = self.proposer.cache
        total = max(1, cache.bytes_per_token + target_bytes_per_token)
        share = budget * cache.bytes_per_token // total

        def scaled(part: int) -> Callable[[int], str | None]:  # a part of ``part``/``total`` of every budget
            return lambda extra: more(-(-extra * total // max(1, part)))

        name = f"the draft model's share of {source}"
        cache.allocate(share, config.block_size, config.max_num_seqs, name, scaled(cache.bytes_per_token))
        return budget - share, scaled(target_bytes_per_token)

    def draft_room(self, seq: Sequence) -> int:
        """How many draft tokens ``seq`` may verify in its next step: 0 when it does not speculate, else
        K capped so that the verified tokens never run past the sequence's length limit."""
        if (
            seq.request.pooler is not None
            or seq.min_tokens_pending
            or (self.guided is not None and not self.guided.allows_drafts(seq))
        ):
            return 0
        return max(0, min(self.config.num_speculative_tokens, seq.max_len - len(seq.token_ids) - 1))

    def propose(self, chunks: Seq[ScheduledChunk]) -> None:
        """Fill in the drafts of the chunks the scheduler made room for."""
        wanted = [chunk for chunk in chunks if chunk.draft_room]
        if not wanted:
            return
        drafts = self.proposer.propose([chunk.seq for chunk in wanted], [chunk.draft_room for chunk in wanted])
        for chunk, draft in zip(wanted, drafts, strict=True):
            chunk.draft = list(draft[: chunk.draft_room])

    def release(self, seq: Sequence) -> None:
        """``seq`` is done: its proposer state goes."""
        self.proposer.release(seq)
