"""``POST /v1/embeddings``: OpenAI's embeddings API over the engine's pooling requests.

Each input is its own engine request (`SamplingParams.pooling`): its prompt is computed through the
normal schedule, batched with other work, and its final hidden states (after the final norm) are
pooled as the model says (`ServerConfig.pooling`: last-token or mean, L2-normalised or not, and
whether ``dimensions`` may truncate it). ``encoding_format`` ``base64`` sends little-endian float32
bytes, as the OpenAI SDK expects.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Literal

import msgspec
import numpy as np
from litestar import Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.errors import InvalidRequestError
from atlas_core.server.errors import invalid
from atlas_core.server.generation import final, generate, unless_disconnected
from atlas_core.server.sampling import check_sequences, check_text_chars
from atlas_core.server.state import ModelRuntime, ServerState


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """``input``: a string, a list of strings, a list of token ids, or a list of token-id lists."""

    input: str | list[Any]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class Embedding(msgspec.Struct):
    index: int
    embedding: list[float] | str
    object: str = "embedding"


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: str = "list"


def input_items(raw: str | list[Any]) -> list[str | list[int]]:
    """The request's inputs, each a string or a list of token ids; 400 naming ``input`` when empty,
    mixed or of another shape."""
    if isinstance(raw, str):
        return [raw]
    if raw and all(isinstance(item, int) and not isinstance(item, bool) for item in raw):
        return [list(raw)]
    if raw and all(isinstance(item, str) for item in raw):
        return list(raw)
    if raw and all(isinstance(item, list) and item for item in raw):
        if all(isinstance(t, int) and not isinstance(t, bool) for item in raw for t in item):
            return list(raw)
    raise invalid(
        "input must be a string, a list of strings, a list of token ids or a list of token-id lists (not empty, "
        "not mixed)",
        param="input",
    )


def tokenized(runtime: ModelRuntime, items: list[str | list[int]]) -> list[list[int]]:
    """Token ids of every input; 400 naming ``input`` for an empty input, an id outside the
    vocabulary, or an input longer than the context."""
    vocab, limit = runtime.vocab_size, runtime.max_seq_len
    out = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            check_text_chars(runtime.tokenizer, len(item), limit, param="input")
            ids = runtime.tokenizer.encode(item)
        else:
            ids = list(item)
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise invalid(f"input[{i}]: token ids {bad[:5]} are outside the vocabulary [0, {vocab})", param="input")
        if not ids:
            raise invalid(f"input[{i}] is empty; send at least one token of text", param="input")
        if len(ids) > limit:
            raise invalid(
                f"input[{i}] has {len(ids)} tokens, more than the model's context (max_seq_len {limit}); shorten it",
                param="input",
            )
        out.append(ids)
    return out


def encode(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """``float``: a JSON list; ``base64``: the little-endian float32 bytes, base64-encoded."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in vector]


@post("/v1/embeddings", status_code=200, tags=["OpenAI"], summary="Create embeddings of texts or token ids")
async def embeddings(
    data: JSONBody[EmbeddingRequest], server: NamedDependency[ServerState], request: Request[Any, Any, Any]
) -> EmbeddingList:
    runtime = server.runtime_for(data.model)
    pooling = server.config.pooling
    loaded = runtime.engine.engine.loaded
    hidden_size = int(loaded.config.get("hidden_size") or loaded.model.embed_tokens.shape[-1])
    try:
        pooling.check_dimensions(data.dimensions, hidden_size)
    except InvalidRequestError as exc:
        raise invalid(str(exc), param="dimensions") from None
    items = input_items(data.input)
    check_sequences(server.config, len(items), 1)
    prompts = await asyncio.to_thread(tokenized, runtime, items)
    params = SamplingParams(max_tokens=1, pooling=pooling.pooling)
    tasks = [asyncio.ensure_future(final(generate(server, None, ids, params))) for ids in prompts]
    try:
        outputs = await unless_disconnected(request.receive, asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
    vectors = []
    for output in outputs:
        if output.embedding is None:
            raise invalid("the engine returned no hidden states for an input", param="input")
        try:
            vectors.append(pooling.finish(output.embedding, data.dimensions))
        except InvalidRequestError as exc:
            raise invalid(str(exc), param="dimensions") from None
    tokens = sum(len(ids) for ids in prompts)
    return EmbeddingList(
        data=[Embedding(index=i, embedding=encode(v, data.encoding_format)) for i, v in enumerate(vectors)],
        model=server.model_name,
        usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
    )


ROUTES = [embeddings]
