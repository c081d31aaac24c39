"""Stop strings on streamed text: held back while they might still match, never shown then retracted."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.stop import TextStopper
from atlas_core.tokenizer import Tokenizer

ALPHABET = "abcdefghijklmnopqrstuvwxyzXYZ."


@pytest.fixture(scope="module")
def char_tokenizer() -> Tokenizer:
    """One token per character, so every character arrives as its own delta."""
    backend = HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(ALPHABET)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend, bos_token_id=None, eos_token_ids=[], chat_template=None, add_bos_token=False)


def stream(tokenizer: Tokenizer, text: str, **params: object) -> tuple[list[str], TextStopper]:
    stopper = TextStopper(tokenizer, [], SamplingParams(**params))
    deltas = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        deltas.append(stopper.push(token))
        if stopper.stopped_by is not None:
            break
    else:
        deltas.append(stopper.finish())
    return deltas, stopper


def test_partial_match_is_held_back_then_released(char_tokenizer: Tokenizer) -> None:
    deltas, stopper = stream(char_tokenizer, "abXYqXYZc", stop=["XYZ"])
    assert deltas == ["a", "b", "", "", "XYq", "", "", ""]
    assert stopper.text == "abXYq" and stopper.stopped_by == "XYZ"


def test_emitted_text_is_always_a_prefix_of_the_final_text(char_tokenizer: Tokenizer) -> None:
    deltas, stopper = stream(char_tokenizer, "hello.world.stop.here", stop=["stop", "ld.x"])
    shown = ""
    for delta in deltas:
        shown += delta
        assert stopper.text.startswith(shown)
    assert stopper.text == "hello.world." and stopper.stopped_by == "stop"


def test_include_stop_string_and_no_match(char_tokenizer: Tokenizer) -> None:
    _, stopper = stream(char_tokenizer, "abcXYZdef", stop=["XYZ"], include_stop_str_in_output=True)
    assert stopper.text == "abcXYZ"
    deltas, stopper = stream(char_tokenizer, "abcXY", stop=["XYZ"])
    assert stopper.stopped_by is None and "".join(deltas) == "abcXY"  # held-back text is released at the end
