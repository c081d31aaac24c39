"""`GuidedDecoding`: the per-sequence state that enforces a request's `StructuredOutput` and
`ThinkingBudget` (grammar specifications in `atlas_core.parsing.structured`), owned by the engine
and consulted by the runner at every sampling step.

Each constrained request's grammar is compiled once into an ``llguidance.LLMatcher``; each of its
``n`` sequences gets its own copy. Before sampling, a constrained row's logits get -inf for every
token the grammar does not allow next (EOS only where the grammar can end); after sampling, the
matcher consumes the token. Rows without constraints cost nothing. Preemption by recompute keeps a
sequence's tokens, so its matcher stays valid. A thinking budget counts reasoning tokens and, once
``max_tokens`` are spent inside the block, forces ``end_token_ids`` one per step (the sampled token
is replaced).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from atlas_core.errors import InvalidRequestError
from atlas_core.parsing.structured import StructuredOutput, StructuredOutputError, ThinkingBudget

if TYPE_CHECKING:
    from atlas_core.engine.sequence import Request, Sequence
    from atlas_core.tokenizer import Tokenizer


class _BudgetTracker:
    """Where one sequence stands in its reasoning block: before it, inside (counting), after."""

    def __init__(self, budget: ThinkingBudget) -> None:
        self.budget = budget
        self.inside = not budget.start_token_ids
        self.done = False
        self.count = 0
        self.forced = 0
        self._recent: list[int] = []
        self._window = max(len(budget.start_token_ids), len(budget.close_token_ids))

    def next_forced(self) -> int | None:
        """The end token forced at this step once the budget is spent, else None."""
        if self.inside and not self.done and self.count >= self.budget.max_tokens:
            return self.budget.end_token_ids[self.forced]
        return None

    def accept(self, token: int) -> None:
        """Advance by the sequence's new token (the forced one when `next_forced` named one)."""
        if self.done:
            return
        if self.next_forced() is not None:
            self.forced += 1
            self.done = self.forced == len(self.budget.end_token_ids)
            return
        self._recent = [*self._recent, token][-self._window :]
        if not self.inside:
            self.inside = _ends_with(self._recent, self.budget.start_token_ids)
        elif _ends_with(self._recent, self.budget.close_token_ids):
            self.done = True
        else:
            self.count += 1


def _ends_with(tokens: list[int], suffix: tuple[int, ...]) -> bool:
    return bool(suffix) and tuple(tokens[-len(suffix) :]) == suffix


@dataclass
class _SequenceState:
    matcher: llguidance.LLMatcher | None
    budget: _BudgetTracker | None


class GuidedDecoding:
    """Grammar matchers and thinking-budget trackers of the live sequences that have them.

    The llguidance tokenizer (built from the model's tokenizer over the logits width
    ``vocab_size``, about a second for a large vocabulary) is made on first use.
    """

    def __init__(self, tokenizer: Tokenizer | None, vocab_size: int, eos_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._known_ids = 0
        self._states: dict[Sequence, _SequenceState] = {}

    @property
    def active(self) -> bool:
        """True while any live sequence has a grammar or a thinking budget."""
        return bool(self._states)

    def add(self, request: Request) -> None:
        """Compile the request's constraint once and give each of its sequences its own state."""
        params = request.params
        if params.structured is None and params.thinking_budget is None:
            return
        bad = (
            [t for t in params.thinking_budget.token_ids if not 0 <= t < self.vocab_size]
            if params.thinking_budget
            else []
        )
        if bad:
            raise InvalidRequestError(
                f"thinking budget token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size}); "
                "give token ids of this model's tokenizer"
            )
        matcher = self._compile(params.structured) if params.structured is not None else None
        for i, seq in enumerate(request.seqs):
            own = matcher.deep_copy() if matcher is not None and i > 0 else matcher
            budget = _BudgetTracker(params.thinking_budget) if params.thinking_budget is not None else None
            self._states[seq] = _SequenceState(own, budget)

    def guides(self, seq: Sequence) -> bool:
        """True when ``seq``'s tokens are constrained (structured output or a thinking budget)."""
        return seq in self._states

    def allows_drafts(self, seq: Sequence) -> bool:
        """True when ``seq`` may verify draft tokens: unconstrained, or constrained by a grammar alone (the
        masks of its verified rows follow the drafts, `banned_tokens`); a thinking budget forces tokens."""
        state = self._states.get(seq)
        return state is None or state.budget is None

    def release(self, seq: Sequence) -> None:
        """Forget ``seq`` (finished or aborted); unknown sequences are ignored."""
        self._states.pop(seq, None)

    def forced_tokens(self, seqs: list[Sequence]) -> dict[int, int]:
        """row -> the token a thinking budget forces there."""
        forced = {}
        for row, seq in enumerate(seqs):
            state = self._states.get(seq)
            token = state.budget.next_forced() if state is not None and state.budget is not None else None
            if token is not None:
                forced[row] = token
        return forced

    def banned_tokens(
        self, seqs: list[Sequence], skip: dict[int, int], drafted: list[list[int]] | None = None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows, tokens) the grammars forbid next, for the rows not in ``skip``; None if none.
        ``drafted[row]``: in a verify step, the draft tokens before the row's position: its mask is the
        grammar's after them, and a row behind a draft token the grammar refuses gets none (that token
        can never be accepted, so the row is never used)."""
        constrained = [
            (row, state.matcher)
            for row, seq in enumerate(seqs)
            if row not in skip and (state := self._states.get(seq)) is not None and state.matcher is not None
        ]
        if not constrained:
            return None
        bitmask = allocate_token_bitmask(len(constrained), self._tokenizer().vocab_size)
        rows, tokens = [], []
        for i, (row, matcher) in enumerate(constrained):
            before = drafted[row] if drafted is not None else []
            consumed = matcher.try_consume_tokens(before) if before else 0
            if consumed < len(before):  # a refused draft token: this row is never used
                matcher.rollback(consumed)
                continue
            fill_next_token_bitmask(matcher, bitmask, i)
            if consumed:
                matcher.rollback(consumed)
            allowed = np.unpackbits(bitmask[i].view(np.uint8), bitorder="little")[: self.vocab_size]
            allowed[self._known_ids :] = 0  # padding rows of the embedding: no text, never allowed
            banned = np.flatnonzero(allowed == 0)
            rows.append(np.full(len(banned), row, dtype=np.int32))
            tokens.append(banned.astype(np.int32))
        return np.concatenate(rows), np.concatenate(tokens)

    def accept(self, seq: Sequence, token: int) -> None:
        """Advance ``seq``'s state by its new token; `StructuredOutputError` if the grammar rejects it."""
        state = self._states.get(seq)
        if state is None:
            return
        if state.budget is not None:
            state.budget.accept(token)
        ends = token in seq.stop_token_ids  # the sequence finishes; the matcher is released with it
        if state.matcher is not None and not ends and not state.matcher.consume_token(token):
            raise StructuredOutputError(f"the output constraint rejected token {token}: {state.matcher.get_error()}")

    def _tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            if self.tokenizer is None:
                raise InvalidRequestError("structured output needs the model's tokenizer, and this model has none")
            self._ll_tokenizer = llguidance.LLTokenizer(
                self.tokenizer.backend.to_str(),
                n_vocab=max(self.vocab_size, self.tokenizer.vocab_size),
                eos_token=self.eos_token_ids or None,
            )
            self._known_ids = self.tokenizer.vocab_size
        return self._ll_tokenizer

    def _compile(self, structured: StructuredOutput) -> llguidance.LLMatcher:
        matcher = llguidance.LLMatcher(self._tokenizer(), structured.llguidance_grammar, log_level=0)
        if matcher.is_error():
            raise StructuredOutputError(
                f"the {structured.kind.replace('_', ' ')} constraint cannot be used: {matcher.get_error()}"
            )
        return matcher
