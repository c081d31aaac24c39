"""`LLM`: the offline Python API, with vLLM's names (``LLM(model).generate(...)`` / ``.chat(...)``)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence as Seq
from typing import Any, cast

from tqdm.auto import tqdm

from atlas_core.backends.base import Backend
from atlas_core.backends.select import select_backend
from atlas_core.engine.config import EngineConfig
from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.engine.outputs import EmbeddingOutput, RequestOutput
from atlas_core.engine.pooling import PoolingType
from atlas_core.engine.pooling_config import PoolingConfig, pooling_config
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.errors import InvalidRequestError
from atlas_core.model.images import decode_image, prepare_image
from atlas_core.model.load import load_model
from atlas_core.model.sharding import TensorParallel
from atlas_core.model.vision import PreparedImage
from atlas_core.parallel.mirror import RankMirror
from atlas_core.parallel.replica import load_engine_model
from atlas_core.plugins import get_registry

PromptInput = str | list[int] | dict[str, Any]
Message = dict[str, Any]


def _prompt_list(prompts: PromptInput | Seq[PromptInput]) -> list[PromptInput]:
    """``prompts`` as a list of prompts: one prompt (text, a dict, or a list of token ids, told apart
    from a list of prompts by its first item being an int) becomes a list of one."""
    if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
        return [cast(PromptInput, prompts)]
    return list(cast(Seq[PromptInput], prompts))


class LLM:
    """Load a model once and generate from many prompts, batched.

    ``model``: a folder, a ``.gguf`` file, a Hugging Face repo id, or None for the built-in
    default model. ``backend``: a backend name or a `Backend` already made, or None for the best
    available. ``parallel``: this rank's shard plan and communicator when every rank of a split model
    runs its own `LLM` on the same requests in the same order (`atlas_core.parallel.world`). Other keyword
    arguments are `EngineConfig` fields (``max_seq_len``, ``max_num_seqs``, ...); with ``tensor_parallel_size`` or
    ``expert_parallel_size`` above 1 the `LLM` starts the other ranks as processes of this host and
    `close` (or leaving a ``with`` block) stops them.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        backend: str | Backend | None = None,
        parallel: TensorParallel | None = None,
        **engine_args: Any,
    ) -> None:
        registry = get_registry()
        self.backend = backend if isinstance(backend, Backend) else select_backend(registry, backend)
        config = EngineConfig(**engine_args)
        if parallel is None:
            reference = None if model is None else str(model)
            self.loaded = load_engine_model(reference, self.backend, registry, config.replica_settings())
        else:
            self.loaded = load_model(
                model,
                self.backend,
                registry,
                max_positions=config.max_seq_len or config.default_max_seq_len,
                gguf_weights=config.gguf_weights,
                parallel=parallel,
                load_format=config.load_format,
            )
        try:
            self.engine = LLMEngine(self.loaded, self.backend, config)
        except BaseException:
            self.close()
            raise
        self._ids = itertools.count()
        self._pooling: PoolingConfig | None = None

    @property
    def mirror(self) -> RankMirror | None:
        """Rank 0's end of a split model (None on one rank)."""
        mirror = self.loaded.model.mirror
        return mirror if isinstance(mirror, RankMirror) else None

    def close(self) -> None:
        """Close the KV storage tiers (with ``kv_spill_persist``, after writing the device prefix cache to
        disk for the next start) and stop the other ranks of a split model (the processes started for them are
        reaped). The `LLM` is unusable afterwards; closing again does nothing more."""
        engine: LLMEngine | None = getattr(self, "engine", None)
        try:
            if engine is not None:
                engine.close()
        finally:  # a failed replica still stops its ranks
            if self.mirror is not None:
                self.mirror.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pooling_config(self) -> PoolingConfig:
        """How this model's embeddings are made (`atlas_core.engine.pooling_config`), read once."""
        if self._pooling is None:
            self._pooling = pooling_config(self.loaded.resolved.path, self.loaded.config)
        return self._pooling

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def require_tokenizer(self) -> Any:
        if self.loaded.tokenizer is None:
            raise InvalidRequestError(
                f"{self.loaded.resolved.path} has no tokenizer (tokenizer.json or tokenizer.model); "
                "pass prompts as token id lists"
            )
        return self.loaded.tokenizer

    def _prompt(self, prompt: PromptInput) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.require_tokenizer().encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), [int(t) for t in prompt["prompt_token_ids"]]
            if "prompt" in prompt:
                return self._prompt(str(prompt["prompt"]))
            raise InvalidRequestError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
        return None, [int(t) for t in prompt]

    def generate(
        self,
        prompts: PromptInput | Seq[PromptInput],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Complete every prompt; outputs come back in prompt order."""
        prompts = _prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise InvalidRequestError(f"{len(prompts)} prompts but {len(params_list)} sampling params")
        order = []
        for index, (prompt, params) in enumerate(zip(prompts, params_list, strict=True)):
            text, ids = self._prompt(prompt)
            request_id = str(next(self._ids))
            self.engine.add_request(request_id, text, ids, params, self._images(prompt, index))
            order.append(request_id)
        return self._run(order, use_tqdm)

    def _images(self, prompt: PromptInput, index: int) -> list[PreparedImage]:
        """A prompt dict's ``images`` (PIL images or encoded image files as bytes), prepared by the model."""
        items = prompt.get("images") if isinstance(prompt, dict) else None
        if not items:
            return []
        vision = self.loaded.model.vision
        if vision is None:
            raise InvalidRequestError(f"the model ({self.loaded.name}) reads text only: it has no vision tower")
        prepared = []
        for k, item in enumerate(items):
            part = f"prompts[{index}].images[{k}]"
            image = decode_image(bytes(item), part) if isinstance(item, (bytes, bytearray)) else item
            prepared.append(prepare_image(vision, image, part))
        return prepared

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | None = None,
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Render each conversation with the model's chat template and complete it."""
        tokenizer = self.require_tokenizer()
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = []
        for conversation in conversations:
            text = tokenizer.apply_chat_template(
                conversation,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                chat_template_kwargs=chat_template_kwargs,
            )
            prompts.append({"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def embed(
        self,
        prompts: PromptInput | Seq[PromptInput],
        *,
        pooling: PoolingType | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
        use_tqdm: bool = False,
    ) -> list[EmbeddingOutput]:
        """The embedding of every prompt, in prompt order: its final hidden states (after the final
        norm), pooled as the model says (`pooling_config`; ``pooling`` and ``normalize`` override it),
        truncated to ``dimensions`` where the model allows it. The prompts are scheduled and batched
        like generation requests (prefill only, nothing sampled)."""
        config = self.pooling_config
        kind = pooling or config.pooling
        normalize = config.normalize if normalize is None else normalize
        finish = PoolingConfig(kind, normalize, config.truncatable, config.dimension_choices)
        order, prompt_ids = [], []
        for prompt in _prompt_list(prompts):
            text, ids = self._prompt(prompt)
            request_id = str(next(self._ids))
            self.engine.add_request(request_id, text, ids, SamplingParams(max_tokens=1, pooling=kind))
            order.append(request_id)
            prompt_ids.append(ids)
        outputs = self._run(order, use_tqdm)
        embeddings = []
        for output in outputs:
            if output.error or output.embedding is None:
                raise InvalidRequestError(f"embedding failed: {output.error or 'no hidden states'}")
            embeddings.append(EmbeddingOutput(output.prompt_token_ids, finish.finish(output.embedding, dimensions)))
        return embeddings

    def _run(self, order: list[str], use_tqdm: bool) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(order), desc="generating", disable=not use_tqdm) as progress:
            try:
                while self.engine.has_unfinished():
                    for output in self.engine.step(finished_only=True):
                        if output.finished:
                            results[output.request_id] = output
                            progress.update(1)
            except BaseException:
                for request_id in order:
                    self.engine.abort(request_id)
                raise
        if self.mirror is not None and self.mirror.failure is not None:
            raise self.mirror.failure  # another rank is gone: this LLM cannot run again
        return [results[request_id] for request_id in order]
