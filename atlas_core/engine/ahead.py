"""Decode steps queued ahead: the next pure-decode step launched before the tokens of this one are read.

On a backend that queues work (`Backend.queues_work`) the device idles between two decode steps while the host
reads the sampled tokens, keeps its books, schedules and launches the next step. When the engine expects the
next step to decode the same sequences again (nothing waits to be scheduled) and that step is prepared
(`DecodeLookahead`), the runner launches it at once behind the current one: its input ids are the current
step's sampled tokens, still on the device, and its own tokens start their copy to the host
(`Backend.download_async`). Only then does the runner wait for the current step's tokens, and the device runs
the next step meanwhile. The next `ModelRunner.execute` takes the queued step when its chunks decode sequences
of it at the positions it ran (all of them, or those left when some finished or were aborted); otherwise the
queued step is dropped.

Dropping one is safe because a decode step's only lasting effect on the device is the KV entry of each
sequence's input token, in the tail block the scheduler made private to that sequence; a step that runs
later writes the same entries, and a finished sequence's tail block is partial, so never in the prefix
cache. Steps of sequences with recurrent state (which a step advances in place), with logprobs, or sampled
with penalties, biases or pending ``min_tokens`` (which depend on the token not yet read) are not queued. A
queued step samples each sequence's next output token with the draw a step built afresh would use
(`Sequence.uniform`), so the tokens are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import TYPE_CHECKING

from atlas_core.backends.base import Array, Backend, Download
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.engine.lookahead import DecodeLookahead
from atlas_core.engine.sampling_inputs import sampling_tensors
from atlas_core.engine.sequence import Sequence

if TYPE_CHECKING:
    from atlas_core.engine.runner import ScheduledChunk


@dataclass
class AheadStep:
    """A decode step launched before the tokens of the step it follows were read: its sequences in batch order,
    each one's position (``num_computed`` when launched, before its input token was known on the host) and
    blocks, its sampled tokens on the device and their copy to the host."""

    seqs: list[Sequence]
    positions: list[int]
    tables: list[list[int]]
    tokens: Array
    download: Download

    def rows_for(self, chunks: Seq[ScheduledChunk]) -> list[int] | None:
        """Each chunk's row in this step when every chunk decodes one token of one of its sequences at the position
        it ran, in the same blocks, with the token it ran on appended since; else None."""
        index = {id(seq): row for row, seq in enumerate(self.seqs)}
        rows = []
        for chunk in chunks:
            seq = chunk.seq
            row = index.get(id(seq))
            if (
                row is None
                or chunk.num_tokens != 1
                or chunk.draft
                or chunk.followers
                or seq.num_computed != self.positions[row]
                or len(seq.token_ids) != self.positions[row] + 1
                or seq.table.blocks != self.tables[row]
            ):
                return None
            rows.append(row)
        return rows


def may_run_ahead(seqs: Seq[Sequence], block_size: int) -> bool:
    """Whether the next decode step of ``seqs`` (each sampled one token in the running step, not read yet) may be
    queued ahead: no recurrent state, logprobs, penalties, biases or pending ``min_tokens``, no sequence that
    reaches its length limit with the running step's token, and each one's next position in a block it has."""
    return all(
        seq.state_slot is None
        and seq.logprobs is None
        and not seq.params.penalised
        and not seq.params.logit_bias
        and not seq.min_tokens_pending
        and len(seq.token_ids) + 1 < seq.max_len
        and seq.num_computed // block_size < len(seq.table.blocks)
        for seq in seqs
    )


class AheadQueue:
    """Launches the prepared decode step ahead of reading the running step's tokens, and takes it back (see the
    module's docstring). ``forward(batch)``: the runner's forward, ``(hidden states, logits)``."""

    def __init__(
        self,
        lookahead: DecodeLookahead,
        backend: Backend,
        block_size: int,
        forward: Callable[[ForwardBatch], tuple[Array | None, Array | None]],
    ) -> None:
        self.lookahead, self.backend, self.block_size, self.forward = lookahead, backend, block_size, forward
        self.step: AheadStep | None = None
        self.hits = 0
        """Steps that ran ahead and were taken."""

    def take(self, chunks: Seq[ScheduledChunk]) -> tuple[AheadStep, list[int]] | None:
        """The queued step and each chunk's row in it, when ``chunks`` are its decodes (`AheadStep.rows_for`);
        either way it is no longer queued."""
        step, self.step = self.step, None
        rows = step.rows_for(chunks) if step is not None else None
        return None if step is None or rows is None else (step, rows)

    def finish(
        self, taken: tuple[AheadStep, list[int]], chunks: Seq[ScheduledChunk], run_ahead: bool
    ) -> tuple[list[Sequence], list[int]]:
        """Complete the taken step for ``chunks``: advance each sequence past its input token, queue the step
        after it first when ``run_ahead`` and every sequence of it goes on, then wait for its tokens. Returns the
        chunks' sequences and their tokens."""
        step, rows = taken
        seqs = [chunk.seq for chunk in chunks]
        for seq in seqs:
            seq.num_computed += 1
        if run_ahead and len(rows) == len(step.seqs):
            self.lookahead.prepare(chunks)
            self.lookahead.sampled(step.tokens)
            self.queue(seqs)
        tokens = step.download.result()
        self.hits += 1
        return seqs, [int(tokens[row]) for row in rows]

    def read(self, sampled: Array, seqs: list[Sequence]) -> list[int]:
        """The running step's sampled tokens on the host (one per sequence of ``seqs``), queueing the next step of
        ``seqs`` first when it is prepared and may run ahead."""
        download = self.backend.download_async(sampled)
        self.queue(seqs)
        return download.result().tolist()

    def queue(self, seqs: list[Sequence]) -> None:
        """Launch the prepared decode step of ``seqs`` and start copying its tokens to the host, when they may run
        ahead (`may_run_ahead`); the prediction is used up either way."""
        prepared = self.lookahead.take_ahead()
        if prepared is None or not may_run_ahead(seqs, self.block_size):
            return
        ahead_seqs, batch = prepared
        _, logits = self.forward(batch)
        assert logits is not None  # every row of a prepared decode step has logits
        tokens = self.backend.sample(logits, sampling_tensors(ahead_seqs, [1] * len(ahead_seqs)))
        self.step = AheadStep(
            ahead_seqs,
            [seq.num_computed for seq in ahead_seqs],
            [list(seq.table.blocks) for seq in ahead_seqs],
            tokens,
            self.backend.download_async(tokens),
        )
