"""Verification of draft tokens: which sampled tokens a sequence keeps, the recurrent-state rollback of
hybrid models, and the acceptance counters.

The runner samples the target model's token at every position of a verified chunk (the decode token's
row and one row per draft token), each with the draw that position would get without speculation
(`Sequence.uniform`). `accept_sampled` keeps sampled tokens in order while they equal the draft: the
tokens kept are exactly the ones plain decoding would produce from the same logits and draws, so the
output distribution (and, with a seed, the output itself) does not depend on speculation.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Protocol

from atlas_core.engine.sequence import Sequence


def accept_sampled(seq: Sequence, draft: Seq[int], sampled: Seq[int], record: Callable[[int, int], None]) -> int:
    """Record (``record(i, token)``) ``sampled[0]``, then ``sampled[i]`` for as long as ``sampled[i - 1]``
    equals ``draft[i - 1]`` and ``seq`` is not finished. Returns how many draft tokens were confirmed,
    which is how many of the draft positions hold valid KV (``len(sampled) == len(draft) + 1``)."""
    for i, token in enumerate(sampled):
        record(i, token)
        if seq.finished or i == len(draft) or token != draft[i]:
            return i
    return len(draft)


@dataclass
class SpeculationStats:
    """Counters since start: draft tokens proposed and accepted, and acceptances per draft position
    (``accepted_at[i]``: drafts at position i that were accepted; ``proposed_at[i]``: drafts proposed
    at position i)."""

    proposed: int = 0
    accepted: int = 0
    verify_steps: int = 0
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def record(self, num_proposed: int, num_accepted: int) -> None:
        """One sequence's verification: ``num_accepted`` of its ``num_proposed`` draft tokens kept."""
        if num_proposed == 0:
            return
        grow = num_proposed - len(self.proposed_at)
        if grow > 0:
            self.proposed_at.extend([0] * grow)
            self.accepted_at.extend([0] * grow)
        for i in range(num_proposed):
            self.proposed_at[i] += 1
            self.accepted_at[i] += i < num_accepted
        self.proposed += num_proposed
        self.accepted += num_accepted
        self.verify_steps += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed draft tokens; 0.0 before any."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens gained per verification of one sequence (accepted drafts + the sampled token)."""
        return 1 + self.accepted / self.verify_steps if self.verify_steps else 0.0

    def describe(self) -> str:
        """One line for benchmarks: proposed, accepted, rate, tokens per verification, per-position rates."""
        if not self.proposed:
            return "no draft tokens proposed"
        rates = " ".join(f"{a / p:.2f}" for a, p in zip(self.accepted_at, self.proposed_at, strict=True))
        return (
            f"{self.accepted}/{self.proposed} draft tokens accepted ({100 * self.acceptance_rate:.0f}%), "
            f"{self.mean_accepted_length:.2f} tokens per verification, by position {rates}"
        )


class StateCopier(Protocol):
    def copy_state(self, src: list[int], dst: list[int]) -> None: ...


class RecurrentRollback:
    """Hybrid models: a verify forward advances a sequence's recurrent state over all its draft tokens.
    Before it, `save` copies each verified sequence's state slot into a scratch slot; when some drafts
    are rejected, `restore` puts the saved state back and the sequence recomputes its confirmed tokens
    in the next step (its attention KV at those positions is rewritten with the same values)."""

    def __init__(self, model: StateCopier, scratch_slots: Seq[int]) -> None:
        self.model = model
        self.scratch = list(scratch_slots)
        self._saved: dict[Sequence, tuple[int, int]] = {}  # seq -> (scratch slot, num_computed before)

    def save(self, seqs: Seq[Sequence]) -> None:
        """Copy the state slots of ``seqs`` (at most ``len(scratch_slots)``) before their verify forward."""
        if len(seqs) > len(self.scratch):
            raise RuntimeError(f"{len(seqs)} verified sequences but {len(self.scratch)} scratch state slots")
        self._saved = {seq: (slot, seq.num_computed) for seq, slot in zip(seqs, self.scratch, strict=False)}
        if seqs:
            self.model.copy_state([seq.held_state_slot() for seq in seqs], self.scratch[: len(seqs)])

    def restore(self, seq: Sequence) -> None:
        """Undo ``seq``'s verify forward: its saved state and its ``num_computed`` from before it."""
        slot, num_computed = self._saved.pop(seq)
        self.model.copy_state([slot], [seq.held_state_slot()])
        seq.num_computed = num_computed
