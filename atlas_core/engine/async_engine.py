"""`AsyncEngine`: many asyncio consumers, one engine thread.

The engine runs `LLMEngine.step` in a dedicated thread; requests are submitted from the event
loop and each consumer receives its `RequestOutput` updates through its own asyncio queue.
Cancelling a consumer (client disconnect) aborts its request and frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.engine.outputs import RequestOutput
from atlas_core.engine.sampling_params import SamplingParams


class AsyncEngine:
    """Thread-safe front of an `LLMEngine` for asyncio servers."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._ids = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="atlas-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopping:
            with self._lock:
                busy = self.engine.has_unfinished()
                outputs = self._step() if busy else []
            for output in outputs:
                self._deliver(output.request_id, output)
            if not busy:
                self._wake.wait(timeout=0.5)
                self._wake.clear()

    def _step(self) -> list[RequestOutput]:
        try:
            return self.engine.step()
        except Exception as exc:  # a failed step fails its requests, never the engine thread
            failed = list(self.engine.requests)
            for request_id in failed:
                self.engine.abort(request_id)
                self._deliver(request_id, exc)
            return []

    def _deliver(self, request_id: str, item: RequestOutput | Exception) -> None:
        target = self._queues.get(request_id)
        if target is not None:
            loop, queue = target
            loop.call_soon_threadsafe(queue.put_nowait, item)

    async def generate(
        self, prompt: str | None, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Yield the request's output after every step that changed it; the last one has ``finished``.

        Invalid requests raise `InvalidRequestError` before the first yield.
        """
        request_id = request_id or f"req-{next(self._ids)}"
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), queue)
        try:
            with self._lock:
                self.engine.add_request(request_id, prompt, prompt_ids, params)
            self._wake.set()
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            with self._lock:
                self.engine.abort(request_id)

    def abort_all(self) -> int:
        """End every request in flight: its consumer receives its output finished with reason
        ``abort`` (so a stream ends cleanly) and its KV blocks are freed. Returns how many."""
        ended = []
        with self._lock:
            for request_id in list(self._queues):
                request = self.engine.requests.get(request_id)
                if request is not None:
                    self.engine.abort(request_id)
                    ended.append((request_id, request.output()))
        for request_id, output in ended:
            self._deliver(request_id, output)
        return len(ended)

    async def drain(self, timeout: float) -> int:
        """Graceful shutdown: wait up to ``timeout`` seconds for the requests in flight to finish,
        then `abort_all` the rest; returns how many were ended early."""
        deadline = time.monotonic() + timeout
        while self._queues and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.abort_all()

    def shutdown(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=5)
