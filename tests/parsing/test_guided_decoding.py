"""`GuidedDecoding` without a model: masks as bans, padding ids, n > 1, thinking-budget counting."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from atlas_core import SamplingParams
from atlas_core.engine.guided_decoding import GuidedDecoding
from atlas_core.errors import InvalidRequestError
from atlas_core.parsing import response_format_constraint
from atlas_core.parsing.structured import StructuredOutputError, ThinkingBudget
from atlas_core.testing.grammars import byte_tokenizer

TOKENIZER = byte_tokenizer()
EOS = TOKENIZER.eos_token_ids[0]
PADDED_VOCAB = TOKENIZER.vocab_size + 40


class FakeSequence:
    """What `GuidedDecoding` reads of a sequence: its identity and its stop tokens."""

    stop_token_ids = frozenset({EOS})


def request(params: SamplingParams) -> SimpleNamespace:
    return SimpleNamespace(params=params, seqs=[FakeSequence() for _ in range(params.n)])


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


def allowed(guided: GuidedDecoding, seqs: list) -> list[set[int]]:
    rows, tokens = guided.banned_tokens(seqs, skip={})
    return [set(range(PADDED_VOCAB)) - set(tokens[rows == r].tolist()) for r in range(len(seqs))]


def test_bans_follow_each_sequence_grammar_and_never_allow_padding_ids() -> None:
    guided = GuidedDecoding(TOKENIZER, PADDED_VOCAB, [EOS])
    structured = response_format_constraint({"type": "json_object"})
    req = request(SamplingParams(n=2, structured=structured))
    plain = FakeSequence()
    guided.add(req)
    first, second = req.seqs
    assert allowed(guided, [first, second]) == [set(ids("{")), set(ids("{"))]
    for token in ids('{"a": 1'):
        guided.accept(first, token)
    now = allowed(guided, [first, plain, second])
    assert ids("}")[0] in now[0] and ids(",")[0] in now[0] and EOS not in now[0]
    assert now[1] == set(range(PADDED_VOCAB))  # not constrained: nothing banned
    assert now[2] == set(ids("{"))  # its own matcher, untouched by the first
    assert all(t < TOKENIZER.vocab_size for row in now[::2] for t in row)
    guided.accept(first, ids("}")[0])
    assert allowed(guided, [first])[0] == {EOS}
    with pytest.raises(StructuredOutputError, match="rejected token"):
        guided.accept(second, ids("x")[0])
    guided.release(first)
    guided.release(second)
    assert not guided.active


def test_thinking_budget_counts_inside_the_block_and_forces_the_end() -> None:
    end, start = tuple(ids("</t>")), tuple(ids("<t>"))
    guided = GuidedDecoding(TOKENIZER, PADDED_VOCAB, [EOS])
    req = request(SamplingParams(thinking_budget=ThinkingBudget(3, end, start_token_ids=start)))
    guided.add(req)
    seq = req.seqs[0]
    generated = []

    def step(token: int) -> None:
        forced = guided.forced_tokens([seq]).get(0)
        generated.append(forced if forced is not None else token)
        guided.accept(seq, generated[-1])

    for token in ids("ab<t>xyz") + ids("qqqqqq") + ids("after"):
        step(token)
    text = TOKENIZER.decode(generated)
    assert text == "ab<t>xyz</t>qq" + "after"  # 3 reasoning tokens, then the forced end marker
    assert guided.forced_tokens([seq]) == {}


def test_thinking_budget_ends_when_the_model_closes_the_block_itself() -> None:
    close = tuple(ids("</t>"))
    guided = GuidedDecoding(TOKENIZER, PADDED_VOCAB, [EOS])
    req = request(SamplingParams(thinking_budget=ThinkingBudget(6, tuple(ids("\n</t>")), close_token_ids=close)))
    guided.add(req)
    seq = req.seqs[0]
    for token in ids("ok</t>") + ids("a long answer"):
        assert guided.forced_tokens([seq]) == {}
        guided.accept(seq, token)


def test_budget_and_constraint_errors_name_the_problem() -> None:
    guided = GuidedDecoding(TOKENIZER, PADDED_VOCAB, [EOS])
    with pytest.raises(InvalidRequestError, match="outside"):
        guided.add(request(SamplingParams(thinking_budget=ThinkingBudget(1, (PADDED_VOCAB,)))))
    with pytest.raises(InvalidRequestError, match="needs the token ids"):
        ThinkingBudget(1, ())
    with pytest.raises(InvalidRequestError, match=">= 0"):
        ThinkingBudget(-1, (1,))
    no_tokenizer = GuidedDecoding(None, 100, [])
    with pytest.raises(InvalidRequestError, match="needs the model's tokenizer"):
        no_tokenizer.add(request(SamplingParams(structured=response_format_constraint({"type": "json_object"}))))
