"""Decode steps queued ahead: the next pure-decode step launched before the tokens of this one are read.

On a backend that queues work (`Backend.queues_work`) the device idles between two decode steps while the host
reads the sampled tokens, keeps its books, schedules and launches the next step. When the engine expects the
next step to decode the same sequences again (nothing waits to be scheduled and every running sequence is in
this step) and that step is prepared (`DecodeLookahead`), the runner launches it at once behind the current
one: its input ids are the current step's sampled tokens, still on the device, and its own tokens start their
copy to the host (`Backend.download_async`). Only then does the runner wait for the current step's tokens, and
the device runs the next step meanwhile.

The next `ModelRunner.execute` takes the queued step for the chunks that decode its sequences at the positions
it ran (`AheadQueue.take`), and queues the one after it the same way. Sequences that finished or were aborted
meanwhile are not scheduled, so their rows are left unread (the next step's input ids are the other rows'
tokens, gathered on the device); chunks of sequences that joined meanwhile run in a forward of their own in the
same step.
The step is dropped only when one of its sequences is scheduled otherwise (preempted and recomputed, which
starts it afresh). What a step leaves on the device is each sequence's KV entry for its input token, in the tail
block the scheduler made private to it, and for recurrent layers the state it advanced: a finished sequence's
tail block is partial, so never in the prefix cache, and its state slot is initialised again by whoever gets
it next; a dropped step's KV entries are written again, with the same values, by the step that runs instead.

A sequence whose next token starts a KV block gets the block before the step is queued
(`Scheduler.reserve_next_block`: the one the next schedule would give it, which then finds it there); when no block
is free, the step is not queued and the scheduler makes room as usual. A sequence that reaches its length limit
with the running step's token runs in the queued step like one that samples a stop token: its row is left unread.

Not queued: steps of sequences with logprobs, or sampled with penalties, biases or pending ``min_tokens``
(which depend on the token not yet read), and, on models with recurrent state, steps whose token starts a KV block
(recurrent states are saved for the prefix cache at block boundaries, after the step that reaches one). A queued
step samples each sequence's next output token with the draw a step built afresh would use (`Sequence.uniform`),
so the tokens are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from atlas_core.backends.base import Array, Backend, Download
from atlas_core.batch.forward_batch import ForwardBatch
from atlas_core.comm import CommError
from atlas_core.engine.lookahead import DecodeLookahead, Prediction
from atlas_core.engine.sampling_inputs import sampling_tensors
from atlas_core.engine.sequence import Sequence

if TYPE_CHECKING:
    from atlas_core.engine.runner import ScheduledChunk


@dataclass
class AheadStep:
    """A decode step launched before the tokens of the step it follows were read: the prediction it ran (its
    sequences in batch order, each one's position, blocks and state slot), its sampled tokens on the device and
    their copy to the host."""

    prediction: Prediction
    tokens: Array
    download: Download

    def decodes(self, chunk: ScheduledChunk, row: int) -> bool:
        """Whether ``chunk`` decodes one token of sequence ``row`` at the position this step ran, in the same blocks
        and state slot, with the token it ran on appended since."""
        return self.prediction.decodes(chunk, row) and chunk.seq.table.blocks == self.prediction.blocks[row]


def may_run_ahead(seqs: Seq[Sequence]) -> bool:
    """Whether the next decode step of ``seqs`` (each sampled one token in the running step, not read yet) may be
    queued ahead: no logprobs, penalties, biases or pending ``min_tokens``."""
    return all(
        seq.logprobs is None and not seq.params.penalised and not seq.params.logit_bias and not seq.min_tokens_pending
        for seq in seqs
    )


@dataclass
class Taken:
    """A queued step taken by `AheadQueue.take`: the chunks that decode its sequences, their rows in it, and the
    scheduled chunks it does not hold."""

    step: AheadStep
    chunks: list[ScheduledChunk] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    rest: list[ScheduledChunk] = field(default_factory=list)


class AheadQueue:
    """Launches the prepared decode step ahead of reading the running step's tokens, and takes it back (see the
    module's docstring). ``forward(batch)``: the runner's forward, ``(hidden states, logits)``."""

    def __init__(
        self,
        lookahead: DecodeLookahead,
        backend: Backend,
        forward: Callable[[ForwardBatch], tuple[Array | None, Array | None]],
        reserve: Callable[[Sequence], bool] | None,
        settle: Callable[[], None] | None = None,
    ) -> None:
        """``reserve(seq)``: gives a sequence the KV block its next token starts (`Scheduler.reserve_next_block`);
        None where steps that need one are not queued (models with recurrent state, saved at block boundaries).
        ``settle()``: the split replica's bounded wait for the last step queued (`ModelMirror.settle`), called
        before that step's tokens are read when no step was queued after it; None for a model on one device."""
        self.lookahead, self.backend, self.forward = lookahead, backend, forward
        self.reserve, self.settle = reserve, settle
        self.step: AheadStep | None = None
        self.hits = 0
        """Steps that ran ahead and were taken."""

    def take(self, chunks: Seq[ScheduledChunk]) -> Taken | None:
        """The queued step with the chunks that decode its sequences (`AheadStep.decodes`), their rows in it, and
        the other chunks (sequences that joined since); None when nothing is queued, none of its sequences is
        scheduled, or one is scheduled otherwise. Either way it is no longer queued."""
        step, self.step = self.step, None
        if step is None:
            return None
        index = {id(seq): row for row, seq in enumerate(step.prediction.seqs)}
        taken = Taken(step)
        for chunk in chunks:
            row = index.get(id(chunk.seq))
            if row is None:
                taken.rest.append(chunk)
            elif step.decodes(chunk, row):
                taken.chunks.append(chunk)
                taken.rows.append(row)
            else:
                return None
        return taken if taken.chunks else None

    def advance(self, taken: Taken, chain: bool) -> None:
        """Advance each taken sequence past the token the step ran on; with ``chain``, queue the step after it for
        the taken sequences (`queue`) before its tokens are read, their tokens gathered on the device when some
        sequences of the step are gone."""
        for chunk in taken.chunks:
            chunk.seq.num_computed += 1
        if chain:
            tokens = taken.step.tokens
            if taken.rows != list(range(len(taken.step.prediction.seqs))):
                tokens = tokens[self.backend.from_numpy(np.asarray(taken.rows, dtype=np.int32))]
            self.lookahead.prepare(taken.chunks)
            self.lookahead.sampled(tokens)
            self.queue()

    def tokens(self, taken: Taken) -> list[int]:
        """The taken sequences' tokens, once their copy is done."""
        if self.step is None and self.settle is not None:  # else the step queued after it waited for it
            self.settle()
        tokens = taken.step.download.result()
        self.hits += 1
        return [int(tokens[row]) for row in taken.rows]

    def drop(self) -> None:
        """Forget the queued step, once the device has run it (its tokens' copy, queued after it, is done); at once
        when the split replica it ran on has failed (`CommError` from ``settle``: its work may never finish)."""
        step, self.step = self.step, None
        if step is None:
            return
        if self.settle is not None:
            try:
                self.settle()
            except CommError:
                return
        step.download.result()

    def read(self, sampled: Array) -> list[int]:
        """The running step's sampled tokens on the host, queueing the next decode step first when it is prepared
        and may run ahead."""
        download = self.backend.download_async(sampled)
        self.queue()
        return download.result().tolist()

    def queue(self) -> None:
        """Launch the prepared decode step and start copying its tokens to the host, when its sequences may run
        ahead (`may_run_ahead`) and have the KV blocks their tokens need (`DecodeLookahead.take_ahead`)."""
        prepared = self.lookahead.take_ahead(may_run_ahead, self.reserve)
        if prepared is None:
            return
        prediction, batch = prepared
        _, logits = self.forward(batch)
        assert logits is not None  # every row of a prepared decode step has logits
        seqs = prediction.seqs
        tokens = self.backend.sample(logits, sampling_tensors(seqs, [1] * len(seqs)))
        self.step = AheadStep(prediction, tokens, self.backend.download_async(tokens))
