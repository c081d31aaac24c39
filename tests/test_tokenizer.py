"""Tests of atlas_core.tokenizer with small tokenizers built in memory (no network, no torch)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from tokenizers import Tokenizer as Backend

from atlas_core.errors import InvalidRequestError, ModelLoadError
from atlas_core.tokenizer import ChatTemplate, Tokenizer
from tests.tokenizer_backends import CHATML, make, write_folder

# Block tags on their own lines: renders the same as CHATML only with trim_blocks and lstrip_blocks.
CHATML_THINKING = """\
{% for message in messages %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
    {% if enable_thinking is defined and not enable_thinking %}
<think>

</think>

    {% endif %}
{% endif %}
"""


# --- encode / decode -------------------------------------------------------------------------


def test_explicit_add_bos_prepends_once(byte_backend: Backend) -> None:
    tok = make(byte_backend, add_bos_token=True)
    bos = tok.bos_token_id
    plain = tok.encode("Hello world", add_special_tokens=False)
    assert bos not in plain
    assert tok.encode("Hello world") == [bos, *plain]
    assert tok.encode("<s>Hello world") == [bos, *plain]
    assert tok.encode("") == [bos]


def test_add_bos_false_ignores_post_processor(sp_backend: Backend) -> None:
    tok = make(sp_backend, add_bos_token=False)
    assert tok.encode("hello") == [sp_backend.token_to_id("▁hello")]


def test_unset_add_bos_defers_to_post_processor(sp_backend: Backend) -> None:
    tok = make(sp_backend, add_bos_token=None)
    hello = sp_backend.token_to_id("▁hello")
    assert tok.encode("hello") == [1, hello]
    assert tok.encode("hello", add_special_tokens=False) == [hello]
    assert tok.encode("<s>hello") == [1, hello]  # the post-processor's second BOS is dropped


def test_decode_and_token_strings(byte_backend: Backend) -> None:
    tok = make(byte_backend, add_bos_token=True)
    ids = tok.encode("Hello world")
    assert tok.decode(ids) == "Hello world"
    assert tok.decode(ids, skip_special_tokens=False) == "<s>Hello world"
    assert tok.vocab_size == byte_backend.get_vocab_size(with_added_tokens=True)
    pieces = [tok.token_to_str(i) for i in tok.encode(" world", add_special_tokens=False)]
    assert pieces[0].startswith("Ġ")
    assert tok.token_to_str(10**6) == ""


# --- from_folder -----------------------------------------------------------------------------


def test_from_folder_reads_config_and_merges_generation_eos(tmp_path: Path, byte_backend: Backend) -> None:
    folder = write_folder(
        tmp_path / "m",
        byte_backend,
        tokenizer_config__json={
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False},
            "eos_token": "<|im_end|>",
            "pad_token": "<pad>",
            "add_bos_token": True,
            "chat_template": "{{ bos_token }}{{ messages[0]['content'] }}{{ eos_token }}|{{ pad_token }}",
        },
        generation_config__json={"eos_token_id": [1, 3]},
        config__json={"bos_token_id": 4, "eos_token_id": 4},
    )
    tok = Tokenizer.from_folder(folder)
    assert tok is not None
    assert tok.bos_token_id == byte_backend.token_to_id("<s>")
    assert tok.eos_token_ids == [byte_backend.token_to_id("<|im_end|>"), 1]  # merged, deduplicated
    assert tok.encode("Hello")[0] == tok.bos_token_id
    rendered = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert rendered == "<s>Hi<|im_end|>|<pad>"
    assert str(folder) in tok.source


def test_from_folder_generation_config_int_eos(tmp_path: Path, byte_backend: Backend) -> None:
    folder = write_folder(
        tmp_path / "m",
        byte_backend,
        tokenizer_config__json={"eos_token": "</s>"},
        generation_config__json={"eos_token_id": 3},
    )
    tok = Tokenizer.from_folder(folder)
    assert tok is not None and tok.eos_token_ids == [1, 3]


def test_from_folder_falls_back_to_config_json(tmp_path: Path, byte_backend: Backend) -> None:
    folder = write_folder(tmp_path / "m", byte_backend, config__json={"bos_token_id": 0, "eos_token_id": [1, 3]})
    tok = Tokenizer.from_folder(folder)
    assert tok is not None
    assert (tok.bos_token_id, tok.eos_token_ids) == (0, [1, 3])
    assert tok.special_token_strings["bos_token"] == "<s>"
    assert tok.add_bos_token is None
    assert tok.encode("Hello")[:1] != [0]  # tokenizer.json has no post-processor adding BOS
    assert tok.chat_template is None


def test_from_folder_without_tokenizer_json_is_none(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert Tokenizer.from_folder(tmp_path) is None


@pytest.mark.parametrize("content", ["{not json", '{"model": 3}', ""])
def test_corrupt_tokenizer_json(tmp_path: Path, content: str) -> None:
    (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        Tokenizer.from_folder(tmp_path)


@pytest.mark.parametrize("content", ["{", "[1, 2]", '{"add_bos_token": "yes"}', '{"eos_token": "<nope>"}'])
def test_corrupt_tokenizer_config(tmp_path: Path, byte_backend: Backend, content: str) -> None:
    write_folder(tmp_path, byte_backend, tokenizer_config__json=content)
    with pytest.raises(ModelLoadError, match="tokenizer_config.json"):
        Tokenizer.from_folder(tmp_path)


def test_chat_template_file_precedence(tmp_path: Path, byte_backend: Backend) -> None:
    config = {"chat_template": "from tokenizer_config"}
    folder = write_folder(tmp_path / "a", byte_backend, tokenizer_config__json=config)
    assert Tokenizer.from_folder(folder).chat_template == "from tokenizer_config"
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "from json"}))
    assert Tokenizer.from_folder(folder).chat_template == "from json"
    (folder / "chat_template.jinja").write_text("from jinja")
    assert Tokenizer.from_folder(folder).chat_template == "from jinja"


def test_named_templates_pick_tool_use_for_tools(tmp_path: Path, byte_backend: Backend) -> None:
    templates = [
        {"name": "default", "template": "plain"},
        {"name": "tool_use", "template": "tools={{ tools | length }}"},
    ]
    folder = write_folder(tmp_path, byte_backend, tokenizer_config__json={"chat_template": templates})
    tok = Tokenizer.from_folder(folder)
    messages = [{"role": "user", "content": "Hi"}]
    assert tok.apply_chat_template(messages) == "plain"
    assert tok.apply_chat_template(messages, tools=[{"type": "function"}]) == "tools=1"


# --- chat templates --------------------------------------------------------------------------

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
CHATML_EXPECTED = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.parametrize("source", [CHATML, CHATML_THINKING])
def test_chatml_rendering(source: str) -> None:
    template = ChatTemplate(source)
    assert template.render(MESSAGES, add_generation_prompt=False) == CHATML_EXPECTED
    assert template.render(MESSAGES) == CHATML_EXPECTED + "<|im_start|>assistant\n"


@pytest.mark.parametrize("content", ["Once upon", "Once upon  "])
def test_continue_final_message_leaves_the_last_message_open(content: str) -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": content}]
    rendered = ChatTemplate(CHATML).render(messages, add_generation_prompt=False, continue_final_message=True)
    assert rendered == CHATML_EXPECTED + "<|im_start|>assistant\n" + content
    with pytest.raises(InvalidRequestError, match="cannot both be true"):
        ChatTemplate(CHATML).render(messages, continue_final_message=True)
    with pytest.raises(InvalidRequestError, match="does not render the last message's content"):
        ChatTemplate("{{ messages | length }}").render(
            messages, add_generation_prompt=False, continue_final_message=True
        )


@pytest.mark.parametrize("name", ["messages", "tools", "add_generation_prompt", "continue_final_message"])
def test_template_variables_cannot_replace_the_named_arguments(name: str) -> None:
    with pytest.raises(InvalidRequestError, match=f"chat_template_kwargs must not set {name}"):
        ChatTemplate(CHATML).render(MESSAGES, variables={name: True})


def test_enable_thinking_kwarg(byte_backend: Backend) -> None:
    tok = make(byte_backend, chat_template=CHATML_THINKING)
    on = tok.apply_chat_template(MESSAGES, chat_template_kwargs={"enable_thinking": True})
    off = tok.apply_chat_template(MESSAGES, chat_template_kwargs={"enable_thinking": False})
    assert on == CHATML_EXPECTED + "<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"


def test_raise_exception_message_is_forwarded(byte_backend: Backend) -> None:
    source = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok"
    )
    tok = make(byte_backend, chat_template=source)
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(InvalidRequestError, match="Conversation must start with user"):
        tok.apply_chat_template(MESSAGES)


def test_tools_rendered_with_transformers_tojson() -> None:
    source = (
        "{% if tools %}{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}{% endif %}"
        "{{ tools | tojson(indent=2) }}"
    )
    tool = {"type": "function", "function": {"name": "météo", "parameters": {"city": "<b>"}}}
    rendered = ChatTemplate(source).render(MESSAGES, tools=[tool])
    assert rendered.startswith(json.dumps(tool, ensure_ascii=False) + "\n")  # no \\u escapes, no HTML escaping
    assert rendered.endswith(json.dumps([tool], ensure_ascii=False, indent=2))
    assert ChatTemplate(source).render(MESSAGES) == "null"  # tools=None, as transformers passes


def test_no_chat_template(byte_backend: Backend) -> None:
    with pytest.raises(InvalidRequestError, match="no chat template"):
        make(byte_backend).apply_chat_template(MESSAGES)


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ messages.append({'role': 'user'}) }}",
        "{{ messages[0].__class__.__init__.__globals__ }}",
    ],
)
def test_sandbox_blocks_unsafe_access(source: str) -> None:
    with pytest.raises(InvalidRequestError, match="forbidden"):
        ChatTemplate(source).render(MESSAGES)


def test_syntax_error_names_line() -> None:
    with pytest.raises(InvalidRequestError, match="line 2"):
        ChatTemplate("ok\n{% for m in messages %}{{ m }")


def test_render_failure_is_invalid_request() -> None:
    with pytest.raises(InvalidRequestError, match="failed to render"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render(MESSAGES)


def test_text_parts_flattened_and_tool_arguments_decoded() -> None:
    template = ChatTemplate(
        "{% for m in messages %}[{{ m.content }}]{% if m.tool_calls %}"
        "{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}{% endfor %}"
    )
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}],
        },
    ]
    assert template.render(messages, add_generation_prompt=False) == '[a\nb][]{"x": 1}'
    assert messages[0]["content"][0] == {"type": "text", "text": "a"}  # input untouched


def test_jinja_extras() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
        "|{{ strftime_now('%Y') }}|{% generation %}{{ messages[1].content }}{% endgeneration %}"
    )
    assert ChatTemplate(source).render(MESSAGES) == f"Be brief.|{datetime.now():%Y}|Hi"
