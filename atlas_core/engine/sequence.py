"""`Sequence`: one request's tokens, KV blocks, sampling state and finish status."""

from __future__ import annotations

import enum

import numpy as np

from atlas_core.engine.outputs import PositionLogprobs
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.stop import TextStopper
from atlas_core.tokenizer import Tokenizer


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A request in flight. ``num_computed`` tokens of ``token_ids`` have their KV in ``blocks``."""

    def __init__(
        self, request_id: str, prompt: str | None, prompt_ids: list[int], params: SamplingParams,
        tokenizer: Tokenizer | None, eos_token_ids: list[int], max_seq_len: int,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_ids = list(prompt_ids)
        self.token_ids = list(prompt_ids)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.blocks: list[int] = []
        self.num_computed = 0
        self.max_len = min(max_seq_len, len(prompt_ids) + (params.max_tokens or max_seq_len))
        self.eos_token_ids = set() if params.ignore_eos else set(eos_token_ids)
        self.generator = np.random.default_rng(params.seed)
        self.stopper = TextStopper(tokenizer, self.prompt_ids, params)
        self.logprobs: list[PositionLogprobs] | None = [] if params.logprobs is not None else None
        self.prompt_logprobs: list[PositionLogprobs | None] | None = [None] if params.prompt_logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> str:
        """Record a sampled token, update the finish status, and return the newly visible text."""
        self.token_ids.append(token_id)
        num_output = len(self.token_ids) - len(self.prompt_ids)
        past_min = num_output >= self.params.min_tokens
        if past_min and (token_id in self.eos_token_ids or token_id in self.params.stop_token_ids):
            self.finish("stop", token_id if token_id in self.params.stop_token_ids else None)
            return self.stopper.finish()
        text = self.stopper.push(token_id, check_stops=past_min)
        if self.stopper.stopped_by is not None:
            self.finish("stop", self.stopper.stopped_by)
        elif len(self.token_ids) >= self.max_len:
            self.finish("length")
            text += self.stopper.finish()
        return text

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason
        self.stop_reason = stop_reason
