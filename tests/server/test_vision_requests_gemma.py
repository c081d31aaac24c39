"""Images through the chat API on the tiny Gemma 3 checkpoint (a character-level tokenizer and a Gemma-style
chat template that writes only ``<start_of_image>`` for an image, written beside a copy of it): the server
rewrites each marker into Gemma 3's image sequence as its processor does (blank lines, begin-of-image, the
image's soft tokens, end-of-image), counts the tokens, and answers as the offline API does with that prompt."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import httpx
import pytest

from atlas_core import LLM, SamplingParams
from tests.conftest import TINY
from tests.server.live import LiveServer, serve
from tests.server.test_vision_requests import data_url, openai_messages, png, write_tokenizer

BOI, EOI, IMAGE = 253, 254, 255
SPECIALS = {"<start_of_turn>": 250, "<end_of_turn>": 251, "<start_of_image>": BOI, "<end_of_image>": EOI}
SPECIALS["<image_soft_token>"] = IMAGE
TEMPLATE = (
    "{%- for m in messages %}<start_of_turn>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% else %}{% for c in m.content %}"
    "{% if c.type == 'image' %}<start_of_image>{% else %}{{ c.text }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
IMAGE_TOKENS = 16  # mm_tokens_per_image of the tiny checkpoint


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    folder = tmp_path_factory.mktemp("gemma") / "gemma3_vl"
    shutil.copytree(TINY / "gemma3_vl", folder)
    write_tokenizer(folder, SPECIALS, TEMPLATE, eos="<end_of_turn>")
    return LLM(folder, backend="numpy", kv_cache_memory_gib=1 / 16)


@pytest.fixture(scope="module")
def server(llm: LLM) -> Iterator[LiveServer]:
    live = serve(llm.engine, llm.require_tokenizer(), "gemma3")
    yield live
    live.stop()


def test_image_marker_becomes_gemma3_image_sequence(server: LiveServer, llm: LLM) -> None:
    image = png()
    tokenizer = llm.require_tokenizer()

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    expected = (
        encode("<start_of_turn>user\n\n\n")
        + [BOI, *[IMAGE] * IMAGE_TOKENS, EOI]
        + encode("\n\nWhat is here?<end_of_turn>\n<start_of_turn>model\n")
    )
    tokens = httpx.post(server.url + "/tokenize", json={"messages": openai_messages(data_url(image))}).json()["tokens"]
    assert tokens == expected
    chat = server.openai().chat.completions.create(
        model="gemma3", messages=openai_messages(data_url(image)), max_tokens=5, temperature=0
    )
    assert chat.usage is not None and chat.usage.prompt_tokens == len(expected)
    params = SamplingParams(temperature=0, max_tokens=5)
    # a second LLM of the same folder: the server's engine thread is never stepped from this one too
    with LLM(llm.loaded.resolved.path, backend="numpy", kv_cache_memory_gib=1 / 16) as offline_llm:
        offline = offline_llm.generate({"prompt_token_ids": expected, "images": [image]}, params)[0]
    assert chat.choices[0].message.content == offline.outputs[0].text


def test_text_only_requests_are_not_rewritten(server: LiveServer, llm: LLM) -> None:
    """A marker spelled in the text is plain text; without images the template text is kept as rendered."""
    messages = [{"role": "user", "content": "see <start_of_image> here"}]
    tokens = httpx.post(server.url + "/tokenize", json={"messages": messages}).json()["tokens"]
    assert BOI not in tokens and EOI not in tokens and IMAGE not in tokens
