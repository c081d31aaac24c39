"""`SamplingParams`: per-request generation settings, named as in vLLM."""

from __future__ import annotations

from dataclasses import dataclass, field

from atlas_core.errors import InvalidRequestError

MAX_LOGPROBS = 20


@dataclass
class SamplingParams:
    """How to generate one completion. Invalid values raise `InvalidRequestError` on construction.

    temperature 0 means greedy. ``top_k`` 0 or -1 disables top-k. ``seed`` makes sampling
    reproducible: the same seed gives the same tokens whether the request runs alone or batched.
    ``stop`` strings end generation and are not included in the text (unless
    ``include_stop_str_in_output``). ``logprobs`` / ``prompt_logprobs`` ask for that many top
    alternatives per position (0-20) besides the chosen token.
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        if self.top_k < 0:
            self.top_k = 0
        checks = [
            (self.n == 1, f"n={self.n}: only n=1 is supported"),
            (self.max_tokens is None or self.max_tokens >= 1, f"max_tokens must be at least 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, f"min_tokens must be >= 0, got {self.min_tokens}"),
            (
                self.max_tokens is None or self.min_tokens <= self.max_tokens,
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
            ),
            (0.0 <= self.temperature <= 100.0, f"temperature must be in [0, 100], got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}"),
            (0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p}"),
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
