"""A real uvicorn server on a random loopback port, in a background thread."""

from __future__ import annotations

import threading
import time
from typing import Any

import anthropic
import openai

from atlas_core.engine.async_engine import AsyncEngine
from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.server.state import ModelRuntime, ServerConfig, ServerState
from atlas_core.server.uvicorn_server import DrainingServer, make_server
from atlas_core.tokenizer import Tokenizer


class LiveServer:
    """Serves ``state`` on 127.0.0.1 at a free port until `stop` (which shuts down gracefully)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.server: DrainingServer = make_server(state, "127.0.0.1", 0)
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.server.bound_port}"

    @property
    def engine(self) -> LLMEngine:
        assert self.state.runtime is not None
        return self.state.runtime.engine.engine

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)

    def openai(self, api_key: str = "unused", **kwargs: Any) -> openai.OpenAI:
        """An ``openai`` SDK client of this server (no retries); more client options as keywords."""
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kwargs)

    def anthropic(self, api_key: str = "unused") -> anthropic.Anthropic:
        """An ``anthropic`` SDK client of this server (no retries)."""
        return anthropic.Anthropic(base_url=self.url, api_key=api_key, max_retries=0)


def serve(engine: LLMEngine, tokenizer: Tokenizer, name: str, **config: object) -> LiveServer:
    """Start a live server for ``engine`` (a fresh `AsyncEngine` thread) named ``name``; `ServerConfig`
    fields as keywords (``model_names`` given there replaces ``[name]``)."""
    config.setdefault("model_names", [name])
    state = ServerState(ServerConfig(**config), ModelRuntime(AsyncEngine(engine), tokenizer))  # type: ignore[arg-type]
    return LiveServer(state)
