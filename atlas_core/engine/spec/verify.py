"""Verification of draft tokens: which sampled tokens a sequence keeps, the recurrent-state checkpoints of
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


class DraftCheckpoints:
    """Hybrid models: the recurrent state at every draft position of a verify step, so that rejected drafts
    cost no recomputation.

    A verify forward advances a sequence's recurrent state over all its draft tokens. The sequence holding
    state slot ``s`` owns the checkpoint slots ``first_slot + s * per_sequence + i`` (``per_sequence``: the
    most drafts a sequence verifies); `rows` tells the recurrent ops (``ForwardBatch.state_checkpoints``) to
    write the state after the sequence's last known token into checkpoint 0 and after draft ``i`` into
    checkpoint ``i + 1`` (the state after the last draft stays in ``s``). When a sequence keeps ``a`` of its
    ``n < len(draft)`` drafts, `keep` queues the copy of checkpoint ``a`` into ``s``; `apply` runs the queued
    copies as one `copy_state` call, before the next forward reads the slots."""

    def __init__(self, model: StateCopier, first_slot: int, per_sequence: int) -> None:
        self.model = model
        self.first_slot, self.per_sequence = first_slot, per_sequence
        self._copies: list[tuple[int, int]] = []

    def _checkpoint(self, seq: Sequence, position: int) -> int:
        return self.first_slot + seq.held_state_slot() * self.per_sequence + position

    def rows(self, seq: Sequence, num_tokens: int, num_drafts: int) -> list[int]:
        """The checkpoint slot of each of a chunk's ``num_tokens`` known tokens and ``num_drafts`` drafts, in
        batch order (-1: none)."""
        if num_drafts > self.per_sequence:
            raise ValueError(f"{num_drafts} drafts but {self.per_sequence} checkpoint slots per sequence")
        positions = [self._checkpoint(seq, i) for i in range(num_drafts)]
        return [-1] * (num_tokens - 1) + positions + [-1]

    def keep(self, seq: Sequence, accepted: int) -> None:
        """``seq`` kept ``accepted`` drafts, fewer than it verified: queue its state's rollback to that position."""
        self._copies.append((self._checkpoint(seq, accepted), seq.held_state_slot()))

    def apply(self) -> None:
        """Run the queued rollbacks (one `copy_state` call)."""
        if self._copies:
            sources, destinations = (list(column) for column in zip(*self._copies, strict=True))
            self._copies.clear()
            self.model.copy_state(sources, destinations)
