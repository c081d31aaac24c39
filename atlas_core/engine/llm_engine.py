"""`LLMEngine`: requests in, one batched forward per `step`, tokens and text out."""

from __future__ import annotations

from dataclasses import dataclass

from atlas_core.backends.base import Backend
from atlas_core.engine.kv_cache import BlockAllocator, KVCache, plan_num_blocks
from atlas_core.engine.outputs import CompletionOutput, RequestOutput
from atlas_core.engine.runner import ModelRunner
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.scheduler import Scheduler
from atlas_core.engine.sequence import Sequence
from atlas_core.errors import InvalidRequestError
from atlas_core.model.load import LoadedModel


@dataclass
class EngineConfig:
    """Engine limits. ``max_seq_len`` None means the model's context length, capped at 8192 by default
    on the CPU; ``kv_cache_memory_gib`` is the memory given to the KV cache."""

    max_seq_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    kv_cache_memory_gib: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise InvalidRequestError(f"max_seq_len must be at least 2, got {self.max_seq_len}")


DEFAULT_MAX_SEQ_LEN = 8192


class LLMEngine:
    """Owns the KV cache, the scheduler and the runner for one loaded model."""

    def __init__(self, loaded: LoadedModel, backend: Backend, config: EngineConfig) -> None:
        self.loaded, self.backend, self.config = loaded, backend, config
        model = loaded.model
        self.max_seq_len = min(config.max_seq_len or DEFAULT_MAX_SEQ_LEN, model.max_position_embeddings)
        if config.max_seq_len and config.max_seq_len > model.max_position_embeddings:
            raise InvalidRequestError(
                f"max_seq_len={config.max_seq_len} exceeds the model's context length ({model.max_position_embeddings})"
            )
        num_blocks = plan_num_blocks(
            model.kv_layouts, backend.activation_dtype.itemsize, config.block_size,
            int(config.kv_cache_memory_gib * 2**30), self.max_seq_len,
        )
        self.kv = KVCache(backend, model.kv_layouts, num_blocks, config.block_size)
        self.scheduler = Scheduler(BlockAllocator(num_blocks), config.block_size, config.max_num_seqs, config.max_num_batched_tokens)
        self.runner = ModelRunner(model, backend, self.kv, loaded.tokenizer)
        tokenizer = loaded.tokenizer
        self.eos_token_ids = list(tokenizer.eos_token_ids) if tokenizer else []
        self.sequences: dict[str, Sequence] = {}

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv.num_blocks * self.kv.block_size

    def add_request(self, request_id: str, prompt: str | None, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        """Queue a request; invalid prompts raise `InvalidRequestError`."""
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        vocab = self.loaded.model.vocab_size
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")
        if len(prompt_ids) >= self.max_seq_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_ids)} tokens but max_seq_len is {self.max_seq_len}; shorten the prompt "
                "(one token must remain for the answer) or raise max_seq_len"
            )
        if request_id in self.sequences:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        seq = Sequence(request_id, prompt, prompt_ids, params, self.loaded.tokenizer, self.eos_token_ids, self.max_seq_len)
        self.sequences[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, request_id: str) -> None:
        seq = self.sequences.pop(request_id, None)
        if seq is not None and not seq.finished:
            seq.finish("abort")
            self.scheduler.release(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        """Run one batched forward; return the outputs of sequences that produced text or finished."""
        chunks = self.scheduler.schedule()
        if not chunks:
            return []
        deltas = self.runner.execute(chunks)
        outputs = []
        for chunk in chunks:
            seq = chunk.seq
            if seq.request_id not in deltas:
                continue
            if seq.finished:
                self.scheduler.release(seq)
                del self.sequences[seq.request_id]
            outputs.append(self.output_of(seq))
        return outputs

    @staticmethod
    def output_of(seq: Sequence) -> RequestOutput:
        completion = CompletionOutput(
            index=0,
            text=seq.stopper.text,
            token_ids=list(seq.output_ids),
            cumulative_logprob=seq.cumulative_logprob if seq.logprobs is not None else None,
            logprobs=seq.logprobs,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )
        return RequestOutput(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=list(seq.prompt_ids),
            outputs=[completion],
            finished=seq.finished,
            prompt_logprobs=seq.prompt_logprobs,
        )
