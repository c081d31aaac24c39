"""`Request` and `Sequence`: one request's completions, their tokens, KV blocks, sampling state
and finish status.

Lifecycle of a sequence: WAITING (queued, or preempted and waiting to be recomputed) ->
RUNNING (holds KV blocks and, for recurrent models, a state slot) -> FINISHED with a reason:
``stop`` (EOS, stop token or stop string), ``length`` (max_tokens or max_seq_len), ``abort``
(cancelled), or ``error`` (an exception while serving it; ``error`` holds the message).
A request with ``n > 1`` has n sequences; all but the first wait as *pending forks* and share
the first one's prompt KV blocks once its prefill completes.
"""

from __future__ import annotations

import enum
import time
from collections import Counter

import numpy as np

from atlas_core.engine.block_manager import BlockTable
from atlas_core.engine.images import RequestImages
from atlas_core.engine.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from atlas_core.engine.pooling import Pooler
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.stop import TextStopper
from atlas_core.tokenizer import Tokenizer

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15


def random_key(seed: int | None, index: int) -> int:
    """A 64-bit key for `counter_uniform`: derived from ``(seed, index)``, or random when ``seed`` is None."""
    entropy = None if seed is None else (seed & _MASK64, seed >> 64 & _MASK64, index)
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


def counter_uniform(key: int, counter: int) -> float:
    """Draw number ``counter`` of the SplitMix64 stream seeded with ``key``, as a float in [0, 1)
    (53 bits): any draw can be computed directly, without drawing the ones before it."""
    z = (key + (counter + 1) * _GOLDEN_GAMMA) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 11) * 2.0**-53


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """One completion. ``num_computed`` leading tokens of ``token_ids`` have their KV in ``table``."""

    def __init__(
        self, request: Request, index: int, tokenizer: Tokenizer | None, eos_token_ids: list[int], max_seq_len: int
    ) -> None:
        params = request.params
        self.request = request
        self.index = index
        self.token_ids = list(request.prompt_ids)
        self.num_prompt_tokens = len(request.prompt_ids)
        self.status = SequenceStatus.WAITING
        self.table = BlockTable()
        self.state_slot: int | None = None
        self.num_computed = 0
        self.max_len = min(max_seq_len, self.num_prompt_tokens + (params.max_tokens or max_seq_len))
        self.stop_token_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        self._random_key = random_key(params.seed, index)
        self.stopper = TextStopper(tokenizer, request.prompt_ids, params)
        self.output_counts: Counter[int] = Counter()
        self.logprobs: list[PositionLogprobs] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None
        self.last_token_time = time.monotonic()

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def cache_ids(self) -> list[int]:
        """The ids the prefix cache files this sequence's blocks under: its token ids, with image placeholder
        tokens replaced by keys of their image's content (`atlas_core.model.vision.cache_keys`)."""
        images = self.request.images
        if images is None:
            return self.token_ids
        return images.cache_prefix + self.token_ids[len(images.cache_prefix) :]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """True when only the last sampled token lacks KV (the sequence is past its prefill)."""
        return self.num_uncomputed == 1 and len(self.token_ids) > self.num_prompt_tokens

    @property
    def counts_cached_tokens(self) -> bool:
        """True while this sequence's prefix hits are its request's ``num_cached_tokens``: the request's first
        sequence, before it has generated anything."""
        return self.index == 0 and len(self.token_ids) == self.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def min_tokens_pending(self) -> bool:
        """True while stop tokens must still be suppressed (fewer than ``min_tokens`` generated)."""
        return len(self.token_ids) - self.num_prompt_tokens < self.params.min_tokens

    def uniform(self, offset: int = 0) -> float:
        """The random draw in [0, 1) that samples output token number ``len(output_ids) + offset``.

        A function of the sequence's key (from the request's seed and the sequence's index, or random
        when there is no seed) and the token's index only: a seed gives the same tokens batched or
        alone, and with or without speculative decoding (which samples several positions at once and
        keeps a prefix of them)."""
        return counter_uniform(self._random_key, len(self.token_ids) - self.num_prompt_tokens + offset)

    def held_state_slot(self) -> int:
        """The recurrent-state slot the sequence holds. On models with recurrent state the scheduler
        gives every admitted sequence one; `RuntimeError` when it holds none."""
        if self.state_slot is None:
            raise RuntimeError(f"sequence {self.index} of request {self.request.request_id!r} holds no state slot")
        return self.state_slot

    def append_token(self, token_id: int) -> None:
        """Record a sampled token and update the finish status and visible text."""
        self.token_ids.append(token_id)
        self.output_counts[token_id] += 1
        self.last_token_time = time.monotonic()
        past_min = not self.min_tokens_pending
        if past_min and token_id in self.stop_token_ids:
            self.finish("stop", token_id if token_id in self.params.stop_token_ids else None)
            self.stopper.finish()
            return
        self.stopper.push(token_id, check_stops=past_min)
        if self.stopper.stopped_by is not None:
            self.finish("stop", self.stopper.stopped_by)
        elif len(self.token_ids) >= self.max_len:
            self.finish("length")
            self.stopper.finish()

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason

    def completion(self) -> CompletionOutput:
        return CompletionOutput(
            index=self.index,
            text=self.stopper.text,
            token_ids=self.output_ids,  # a fresh slice: copied once
            cumulative_logprob=self.cumulative_logprob if self.logprobs is not None else None,
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
        )


class Request:
    """A request and its ``n`` sequences; ``pending_forks`` wait for the first one's prefill."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_ids: list[int],
        params: SamplingParams,
        tokenizer: Tokenizer | None,
        eos_token_ids: list[int],
        max_seq_len: int,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.arrival_time = time.monotonic()
        self.seqs = [Sequence(self, i, tokenizer, eos_token_ids, max_seq_len) for i in range(params.n)]
        self.pending_forks = self.seqs[1:]
        self.prompt_logprobs: list[PositionLogprobs | None] | None = (
            [None] if params.prompt_logprobs is not None else None
        )
        self.num_cached_tokens = 0
        self.error: str | None = None
        self.error_invalid = False
        """The request's own input made it fail (`fail`'s ``invalid``)."""
        self.pooler = Pooler(params.pooling, len(self.prompt_ids)) if params.pooling else None
        self.images: RequestImages | None = None
        """The prompt's images (set by `LLMEngine.add_request`); None: a text-only request."""

    @property
    def needs_every_position(self) -> bool:
        """True when every prompt position must be computed (prompt logprobs, mean pooling), so no
        cached prefix may be reused."""
        return self.prompt_logprobs is not None or (self.pooler is not None and self.pooler.needs_every_position)

    @property
    def finished(self) -> bool:
        return all(seq.finished for seq in self.seqs)

    def fail(self, message: str, *, invalid: bool = False) -> None:
        """Finish every unfinished sequence with reason ``error``. ``invalid``: the request's own input is the
        cause (its output constraint cannot be followed), not the server."""
        self.error = message
        self.error_invalid = invalid
        for seq in self.seqs:
            if not seq.finished:
                seq.finish("error")
        self.pending_forks = []

    def output(self) -> RequestOutput:
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_ids,  # shared, not copied: each step's outputs would copy the whole prompt
            outputs=[seq.completion() for seq in self.seqs],
            finished=self.finished,
            prompt_logprobs=self.prompt_logprobs,
            num_cached_tokens=self.num_cached_tokens,
            error=self.error,
            error_invalid=self.error_invalid,
            embedding=self.pooler.result() if self.pooler is not None and not self.error else None,
        )
