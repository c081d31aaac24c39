"""`SamplingParams`: per-request generation settings, named as in vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field

from atlas_core.engine.pooling import PoolingType
from atlas_core.errors import InvalidRequestError
from atlas_core.parsing.structured import StructuredOutput, ThinkingBudget

MAX_LOGPROBS = 20
MAX_N = 128


@dataclass
class SamplingParams:
    """How to generate one completion. Invalid values raise `InvalidRequestError` on construction.

    temperature 0 means greedy. ``top_k`` 0 or -1 disables top-k; ``top_n_sigma`` 0 disables
    top-nσ. ``seed`` makes sampling reproducible: the same seed gives the same tokens whether the
    request runs alone or batched (completion i of ``n`` draws from its own stream ``(seed, i)``).
    ``repetition_penalty`` (1 = off) applies to tokens of the prompt and the output;
    ``presence_penalty`` / ``frequency_penalty`` (OpenAI semantics) to output tokens only;
    ``logit_bias`` maps token ids to values added to their logits. ``min_tokens`` suppresses EOS
    and stop tokens until that many tokens were generated.
    ``stop`` strings end generation and are not included in the text (unless
    ``include_stop_str_in_output``). ``logprobs`` / ``prompt_logprobs`` ask for that many top
    alternatives per position (0-20) besides the chosen token.
    ``structured`` constrains the output to a grammar (JSON Schema, tool-call markup);
    ``thinking_budget`` caps the reasoning tokens and then forces the block closed
    (`atlas_core.parsing.structured`).
    ``pooling`` (``last`` or ``mean``) makes the request an embedding request: its prompt is computed
    and pooled into `RequestOutput.embedding`, nothing is sampled (`atlas_core.engine.pooling`; n must be 1).
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    top_n_sigma: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    structured: StructuredOutput | None = None
    thinking_budget: ThinkingBudget | None = None
    pooling: PoolingType | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        if self.top_k < 0:
            self.top_k = 0
        self.logit_bias = {int(token): float(value) for token, value in self.logit_bias.items()}
        checks = [
            (1 <= self.n <= MAX_N, f"n must be between 1 and {MAX_N}, got {self.n}"),
            (self.pooling in (None, "last", "mean"), f"pooling must be last or mean, got {self.pooling!r}"),
            (self.pooling is None or self.n == 1, f"a pooling request has one output, got n={self.n}"),
            (self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
            ),
            (0.0 <= self.temperature <= 100.0, f"temperature must be in [0, 100], got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.top_n_sigma >= 0.0, f"top_n_sigma must be >= 0, got {self.top_n_sigma}"),
            (
                0.0 < self.repetition_penalty <= 10.0,
                f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}",
            ),
            (-2.0 <= self.presence_penalty <= 2.0, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (
                -2.0 <= self.frequency_penalty <= 2.0,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (
                all(-100.0 <= v <= 100.0 for v in self.logit_bias.values()),
                "logit_bias values must be in [-100, 100]",
            ),
            (
                self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS,
                f"logprobs must be between 0 and {MAX_LOGPROBS}, got {self.logprobs}",
            ),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS,
                f"prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {self.prompt_logprobs}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequestError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
