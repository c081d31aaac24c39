"""What every route needs: the server's settings and, once loaded, the model it serves."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from atlas_core.engine.async_engine import AsyncEngine
from atlas_core.engine.pooling_config import PoolingConfig
from atlas_core.errors import ConfigError
from atlas_core.server.errors import APIError
from atlas_core.server.media import MediaPolicy
from atlas_core.server.metrics import ServerMetrics
from atlas_core.server.responses_store import ResponseStore
from atlas_core.server.settings import ServeOptions
from atlas_core.tokenizer import Tokenizer


@dataclass
class ServerConfig:
    """HTTP-level settings (the `atlas serve` flags that are not engine settings).

    ``model_names``: names clients may use in ``model``; the first is reported back (empty until
    the model is loaded when the names come from the model).
    ``tool_call_parser`` / ``reasoning_parser``: parser names, None for none.
    ``default_chat_template_kwargs``: passed to the chat template, a request's own
    ``chat_template_kwargs`` override them key by key. ``api_keys``: when non-empty, `/v1/*` and
    tokenize need one of them. ``request_timeout``: seconds from arrival to the last token (None:
    no limit). ``shutdown_timeout``: seconds in-flight requests may keep running after a shutdown
    signal before they are ended. ``max_sequences_per_request`` / ``max_tokens_per_request`` bound
    the work one request may create (`atlas_core.server.sampling.check_request_work`).
    ``enable_special_tokens_in_content``: special-token strings inside chat messages are special
    tokens (off: plain text; `atlas_core.tokenizer.chat_encoding`). ``responses_store_size``: most
    ``/v1/responses`` responses kept for ``previous_response_id`` (0: none).
    ``accept_any_model_name``: requests naming any model are served (else 404 for names not in
    ``model_names``). ``generation_defaults``: sampler values (``temperature``, ``top_p``, ``top_k``,
    ``min_p``, ``repetition_penalty``) used when a request omits them (the checkpoint's
    ``generation_config.json``). ``log_requests``: log each request's prompt text. ``pooling``: how
    ``/v1/embeddings`` makes a vector from the final hidden states (the model's, or ``--pooling``).
    ``web_ui``: serve the chat page at ``/`` (`atlas_core.server.routes_web`).
    ``media``: what images requests may bring (`atlas_core.server.media.MediaPolicy`).
    """

    model_names: list[str] = field(default_factory=list)
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    api_keys: list[str] = field(default_factory=list)
    request_timeout: float | None = None
    max_body_bytes: int = ServeOptions.max_body_bytes
    cors_allow_origins: list[str] = field(default_factory=list)
    shutdown_timeout: float = ServeOptions.shutdown_timeout
    max_sequences_per_request: int = ServeOptions.max_sequences_per_request
    max_tokens_per_request: int = ServeOptions.max_tokens_per_request
    enable_special_tokens_in_content: bool = ServeOptions.enable_special_tokens_in_content
    responses_store_size: int = ServeOptions.responses_store_size
    accept_any_model_name: bool = ServeOptions.accept_any_model_name
    generation_defaults: dict[str, float | int] = field(default_factory=dict)
    log_requests: bool = ServeOptions.log_requests
    pooling: PoolingConfig = field(default_factory=PoolingConfig)
    web_ui: bool = True
    media: MediaPolicy = field(default_factory=MediaPolicy)

    def __post_init__(self) -> None:
        for name in ("max_sequences_per_request", "max_tokens_per_request"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass
class ModelRuntime:
    """A loaded model behind the HTTP API."""

    engine: AsyncEngine
    tokenizer: Tokenizer

    @property
    def max_seq_len(self) -> int:
        """Longest prompt + completion, in tokens."""
        return self.engine.engine.max_seq_len

    @property
    def vocab_size(self) -> int:
        """Token ids the model accepts: ``[0, vocab_size)``."""
        return self.engine.engine.loaded.model.vocab_size


class ServerState:
    """Shared by all routes. ``runtime`` is None while the model loads (routes answer 503)."""

    def __init__(self, config: ServerConfig, runtime: ModelRuntime | None = None) -> None:
        self.config = config
        self.runtime: ModelRuntime | None = None
        self.metrics = ServerMetrics(lambda: self.model_name)
        self.responses = ResponseStore(config.responses_store_size)
        self.created = int(time.time())
        self.shutting_down = False
        self._drained: asyncio.Future[None] | None = None
        if runtime is not None:
            self.attach(runtime)

    @property
    def model_name(self) -> str:
        """The name reported in responses ("" until the model's name is known)."""
        return self.config.model_names[0] if self.config.model_names else ""

    def attach(self, runtime: ModelRuntime) -> None:
        """The model finished loading: start serving it."""
        self.runtime = runtime
        self.metrics.watch_engine(runtime.engine.engine)

    def require_runtime(self) -> ModelRuntime:
        """The loaded model; `APIError` 503 while it loads or the server shuts down."""
        if self.shutting_down:
            raise APIError(503, "the server is shutting down")
        if self.runtime is None:
            raise APIError(503, "the model is still loading; retry when GET /health answers 200")
        return self.runtime

    def unknown_model(self, name: str, param: str | None) -> APIError:
        """The 404 for a model this server does not serve, blaming the request field ``param``."""
        served = ", ".join(repr(n) for n in self.config.model_names)
        return APIError(
            404,
            f"the model {name!r} does not exist; this server serves {served} (start it with "
            "--served-model-name to add names, or --accept-any-model-name)",
            param=param,
            code="model_not_found",
        )

    def serves(self, name: str | None) -> bool:
        """Whether a request for ``name`` is served: None or "" (the served model), one of
        ``model_names``, or any name with ``accept_any_model_name``."""
        return not name or self.config.accept_any_model_name or name in self.config.model_names

    def check_model(self, name: str | None) -> None:
        """Accept a request for ``name`` (`serves`); 404 for any other."""
        if not self.serves(name):
            raise self.unknown_model(name or "", param="model")

    def runtime_for(self, model: str | None) -> ModelRuntime:
        """The runtime serving a request that names ``model``: 503 while loading or shutting down,
        404 for a model this server does not serve."""
        runtime = self.require_runtime()
        self.check_model(model)
        return runtime

    async def drain(self) -> None:
        """Shut down gracefully (idempotent): refuse new requests (503), give those in flight up to
        ``shutdown_timeout`` seconds, end the rest (a stream then closes with an error event, a
        waiting client gets a 503), and stop the engine thread."""
        if self._drained is None:
            self._drained = asyncio.ensure_future(self._drain())
        await asyncio.shield(self._drained)

    async def _drain(self) -> None:
        self.shutting_down = True
        if self.runtime is not None:
            await self.runtime.engine.drain(self.config.shutdown_timeout)
            await asyncio.to_thread(self.runtime.engine.shutdown)
