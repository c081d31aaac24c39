"""Embeddings: pooled final hidden states from the engine (`LLM.embed`) checked against NumPy
computations from the model's own outputs, the model's pooling config, and ``POST /v1/embeddings``
through the OpenAI SDK."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from atlas_core import LLM
from atlas_core.engine.pooling import Pooler
from atlas_core.engine.pooling_config import PoolingConfig, pooling_config
from atlas_core.tokenizer import Tokenizer
from tests.conftest import TINY, reference
from tests.server.live import LiveServer, serve

CHECKPOINT = "qwen3"


def tiny_llm() -> LLM:
    return LLM(TINY / CHECKPOINT, backend="numpy", max_seq_len=128, kv_cache_memory_gib=1 / 64)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return tiny_llm()


def prompts() -> list[list[int]]:
    ref = reference(CHECKPOINT)
    return [[int(t) for t in ref[f"prompt_{i}"]] for i in range(4)]


def test_last_token_state_projects_to_the_reference_logprobs(llm: LLM) -> None:
    ref = reference(CHECKPOINT)
    raw = llm.embed(prompts(), normalize=False)
    lm_head = llm.backend.to_numpy(llm.loaded.model.lm_head).astype(np.float64)
    for i, out in enumerate(raw):
        logits = out.embedding.astype(np.float64) @ lm_head.T
        logprobs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        np.testing.assert_allclose(logprobs, ref[f"logprobs_{i}"][-1], atol=2e-4)
    normalized = llm.embed(prompts())  # the default: last token, L2-normalised
    for plain, unit in zip(raw, normalized, strict=True):
        np.testing.assert_allclose(unit.embedding, plain.embedding / np.linalg.norm(plain.embedding), atol=1e-6)


def test_mean_pooling_is_the_mean_of_every_position(llm: LLM) -> None:
    """A causal model's state at position t is the last-token state of the prefix ending at t."""
    for prompt in prompts()[1:3]:
        (mean,) = llm.embed([prompt], pooling="mean", normalize=False)
        prefixes = llm.embed([prompt[: t + 1] for t in range(len(prompt))], normalize=False)
        expected = np.mean([p.embedding for p in prefixes], axis=0)
        np.testing.assert_allclose(mean.embedding, expected, atol=1e-5)


def test_pooler_counts_each_position_once() -> None:
    pooler = Pooler("mean", 4)
    states = np.arange(8, dtype=np.float32).reshape(4, 2)
    pooler.add(0, states[:3])
    pooler.add(0, states[:2])  # recomputed after a preemption
    assert pooler.result() is None and pooler.rows_wanted(0, 4) == (3, 4)
    pooler.add(3, states[3:])
    np.testing.assert_allclose(pooler.result(), states.mean(axis=0))  # type: ignore[arg-type]


def test_pooling_config_from_sentence_transformers_files(tmp_path: Path) -> None:
    assert pooling_config(tmp_path, {}) == PoolingConfig("last", True, False, None)
    (tmp_path / "modules.json").write_text(
        json.dumps([{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}])
    )
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    assert pooling_config(tmp_path, {"matryoshka_dimensions": [32, 64]}) == PoolingConfig("mean", False, True, (32, 64))
    assert pooling_config(tmp_path, {"is_matryoshka": True}, override="last").pooling == "last"


@pytest.mark.parametrize("tied", [True, False])
def test_a_headless_base_model_checkpoint_embeds_as_its_causal_lm(llm: LLM, tmp_path: Path, tied: bool) -> None:
    """Embedding checkpoints saved as the base model (``Qwen3Model``: no ``model.`` prefix, no LM head, as
    Qwen3-Embedding ships) load through the family and embed exactly as the causal LM holding the same
    weights; untied, the embedding matrix serves as the LM head. Within float32 rounding, not bit for bit: the
    two engines hold their weights in different arrays, and BLAS may sum them in another order."""
    from safetensors.numpy import load_file, save_file

    folder = TINY.edited_copy(tmp_path, CHECKPOINT)
    for path in folder.glob("*.safetensors"):
        tensors = load_file(path)
        path.unlink()
        headless = {name.removeprefix("model."): a for name, a in tensors.items() if name != "lm_head.weight"}
        save_file(headless, folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["Qwen3Model"], tie_word_embeddings=tied)
    (folder / "config.json").write_text(json.dumps(config))
    base = LLM(folder, backend="numpy", max_seq_len=128, kv_cache_memory_gib=1 / 64)
    for got, want in zip(base.embed(prompts(), normalize=False), llm.embed(prompts(), normalize=False), strict=True):
        np.testing.assert_allclose(got.embedding, want.embedding, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def tiny_server(chatml_tokenizer: Tokenizer) -> Iterator[LiveServer]:
    """The tiny checkpoint behind a live server (token-id inputs: its vocabulary is tiny)."""
    server = serve(tiny_llm().engine, chatml_tokenizer, "tiny-embed")
    yield server
    server.stop()


def test_embeddings_through_the_openai_sdk(tiny_server: LiveServer, llm: LLM) -> None:
    sdk = tiny_server.openai()
    inputs = prompts()[:3]
    expected = [e.embedding for e in llm.embed(inputs)]
    result = sdk.embeddings.create(model="tiny-embed", input=inputs)  # the SDK asks for base64
    assert [d.index for d in result.data] == [0, 1, 2] and result.model == "tiny-embed"
    for got, want in zip(result.data, expected, strict=True):
        np.testing.assert_allclose(got.embedding, want, atol=1e-6)
    assert result.usage.prompt_tokens == result.usage.total_tokens == sum(len(p) for p in inputs)
    floats = sdk.embeddings.create(model="tiny-embed", input=inputs[1], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, expected[1], atol=1e-6)
    raw = httpx.post(tiny_server.url + "/v1/embeddings", json={"input": inputs[0], "encoding_format": "base64"})
    vector = np.frombuffer(base64.b64decode(raw.json()["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(vector, expected[0], atol=1e-6)


def test_mean_pooling_and_dimensions_on_the_server(tiny_server: LiveServer, llm: LLM) -> None:
    config = tiny_server.state.config
    saved = config.pooling
    config.pooling = PoolingConfig("mean", True, truncatable=True)
    try:
        prompt = prompts()[2]
        result = tiny_server.openai().embeddings.create(model="tiny-embed", input=[prompt], dimensions=16)
        full = llm.embed([prompt], pooling="mean", normalize=False)[0].embedding[:16]
        np.testing.assert_allclose(result.data[0].embedding, full / np.linalg.norm(full), atol=1e-6)
    finally:
        config.pooling = saved


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [[1, 2], []]}, "input"),
        ({"input": [1, 99999]}, "input"),
        ({"input": list(range(1, 200))}, "input"),
        ({"input": "", "model": "tiny-embed"}, "input"),
        ({"input": [1, 2], "dimensions": 8}, "dimensions"),
        ({"input": [1, 2], "encoding_format": "hex"}, "encoding_format"),
        ({"input": 3}, "input"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(tiny_server: LiveServer, body: dict[str, object], param: str) -> None:
    response = httpx.post(tiny_server.url + "/v1/embeddings", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param or f"`{param}`" in error["message"], error


def test_unknown_model_is_a_404(tiny_server: LiveServer) -> None:
    with pytest.raises(openai.NotFoundError):
        tiny_server.openai().embeddings.create(model="text-embedding-3-small", input=[1, 2])
