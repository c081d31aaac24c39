"""Turning a token stream into visible text: incremental detokenization plus stop conditions.

Stop strings are matched on the text; text that might be the beginning of a stop string is
held back, so a stream never shows characters that are later retracted.
"""

from __future__ import annotations

from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.tokenizer import IncrementalDetokenizer, Tokenizer


class TextStopper:
    """Feeds tokens through the detokenizer and watches for stop strings.

    ``push`` returns the newly visible text; after a stop string matched, ``stopped_by`` is set
    and the visible text ends before it (or after it with ``include_stop_str_in_output``).
    """

    def __init__(self, tokenizer: Tokenizer | None, prompt_ids: list[int], params: SamplingParams) -> None:
        self.params = params
        self.stop_strings: list[str] = list(params.stop or [])
        self.detokenizer = (
            IncrementalDetokenizer(tokenizer, prompt_ids, skip_special_tokens=params.skip_special_tokens)
            if tokenizer is not None
            else None
        )
        self.text = ""
        """Text emitted so far."""
        self._pending = ""
        self.stopped_by: str | None = None

    def push(self, token_id: int, *, check_stops: bool = True) -> str:
        """Add one token; ``check_stops=False`` (before ``min_tokens``) only holds text back."""
        if self.detokenizer is None:
            return ""
        return self._accept(self.detokenizer.push(token_id), final=False, check_stops=check_stops)

    def finish(self) -> str:
        """Emit whatever is still held back (end of generation for another reason)."""
        if self.detokenizer is None or self.stopped_by is not None:
            return ""
        return self._accept(self.detokenizer.flush(), final=True)

    def _accept(self, delta: str, final: bool, check_stops: bool = True) -> str:
        self._pending += delta
        for stop in self.stop_strings if check_stops else ():
            index = self._pending.find(stop)
            if index >= 0:
                self.stopped_by = stop
                end = index + len(stop) if self.params.include_stop_str_in_output else index
                return self._emit(self._pending[:end])
        if final:
            return self._emit(self._pending)
        return self._emit(self._pending[: len(self._pending) - self._held_back()])

    def _held_back(self) -> int:
        """Length of the longest pending suffix that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stop_strings:
            for size in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _emit(self, visible: str) -> str:
        self._pending = self._pending[len(visible) :]
        self.text += visible
        return visible
