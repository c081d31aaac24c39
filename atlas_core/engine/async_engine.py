"""`AsyncEngine`: many asyncio consumers, one engine thread.

The engine thread is the only one that touches the `LLMEngine`: it runs `LLMEngine.step` and, between
steps, the commands consumers send it (add a request, abort one, abort all). Consumers never wait
for the engine: submitting a command only appends it to a queue, so the event loop stays free while
a forward step runs, however long. Each consumer receives its `RequestOutput` updates through its own
asyncio queue. Cancelling a consumer (client disconnect) aborts its request and frees its KV blocks
at the engine thread's next turn.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.engine.outputs import RequestOutput
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.model.vision import PreparedImage

log = logging.getLogger("atlas.engine")

T = TypeVar("T")

STOP_WAIT_S = 5.0
"""How long `AsyncEngine.shutdown` waits for the engine thread's last step and the tiers to close."""
PERSIST_WAIT_S = 600.0
"""How much longer it waits when the NVMe tier persists: closing writes the device prefix cache to disk."""


class AsyncEngine:
    """Thread-safe front of an `LLMEngine` for asyncio servers."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]] = {}
        self._ids = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="atlas-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            self._run_commands()
            if self._stopping:
                self._close_engine()
                return
            busy = self.engine.has_unfinished()
            for output in self._step() if busy else []:
                self._deliver(output.request_id, output)
            if not busy:
                self._wake.wait(timeout=0.5)
                self._wake.clear()

    def _close_engine(self) -> None:
        """Engine thread, once stopping: close the engine's storage tiers (writing what they persist)."""
        try:
            self.engine.close()
        except Exception:  # shutting down anyway: the tiers' files are left as a crash would leave them
            log.exception("closing the engine's KV storage tiers failed")

    def _run_commands(self) -> None:
        """Run every queued command (engine thread), each result or exception into its future."""
        while True:
            try:
                command, future = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                future.set_result(command())
            except Exception as exc:  # reported to whoever submitted the command
                future.set_exception(exc)

    def _submit(self, command: Callable[[], T]) -> Future[T]:
        """Queue ``command`` for the engine thread (any thread may call this; it never blocks)."""
        future: Future[T] = Future()
        self._commands.put((command, future))
        self._wake.set()
        return future

    def _step(self) -> list[RequestOutput]:
        try:
            return self.engine.step()
        except Exception as exc:  # a failed step fails its requests, never the engine thread
            log.exception("engine step failed")
            failed = list(self.engine.requests)
            for request_id in failed:
                self.engine.abort(request_id)
                self._deliver(request_id, exc)
            return []

    def _deliver(self, request_id: str, item: RequestOutput | Exception) -> None:
        target = self._queues.get(request_id)
        if target is not None:
            loop, queue_ = target
            loop.call_soon_threadsafe(queue_.put_nowait, item)

    def _add(
        self,
        request_id: str,
        prompt: str | None,
        prompt_ids: list[int],
        params: SamplingParams,
        images: Sequence[PreparedImage] = (),
    ) -> None:
        """Engine thread: queue the request in the engine; an invalid one is reported to its consumer."""
        try:
            self.engine.add_request(request_id, prompt, prompt_ids, params, images)
        except Exception as exc:
            self._deliver(request_id, exc)

    async def generate(
        self,
        prompt: str | None,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        images: Sequence[PreparedImage] = (),
    ) -> AsyncGenerator[RequestOutput, None]:
        """Yield the request's output after every step that changed it; the last one has ``finished``.
        ``images``: the prompt's prepared images (`LLMEngine.add_request`).

        Invalid requests raise `InvalidRequestError` before the first yield. Closing the iterator
        early aborts the request (at the engine thread's next turn).
        """
        request_id = request_id or f"req-{next(self._ids)}"
        queue_: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), queue_)
        finished = False
        try:
            self._submit(lambda: self._add(request_id, prompt, prompt_ids, params, images))
            while True:
                item = await queue_.get()
                if isinstance(item, Exception):
                    finished = True  # failed requests are already out of the engine
                    raise item
                yield item
                if item.finished:
                    finished = True
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self._submit(lambda: self.engine.abort(request_id))

    def _abort_all(self) -> int:
        """Engine thread: end every request in flight; its consumer receives its output finished with
        reason ``abort``."""
        ended = 0
        for request_id in list(self._queues):
            request = self.engine.requests.get(request_id)
            if request is not None:
                self.engine.abort(request_id)
                self._deliver(request_id, request.output())
                ended += 1
        return ended

    async def abort_all(self) -> int:
        """End every request in flight: its consumer receives its output finished with reason
        ``abort`` (so a stream ends cleanly) and its KV blocks are freed. Returns how many."""
        return await asyncio.wrap_future(self._submit(self._abort_all))

    async def drain(self, timeout: float) -> int:
        """Graceful shutdown: wait up to ``timeout`` seconds for the requests in flight to finish,
        then `abort_all` the rest; returns how many were ended early."""
        deadline = time.monotonic() + timeout
        while self._queues and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return await self.abort_all()

    def shutdown(self) -> None:
        """Stop the engine thread once the commands already queued have run; it closes the engine (its KV
        storage tiers) on the way out. Blocks until then (callers on an event loop run it in a thread)."""
        self._stopping = True
        self._wake.set()
        offload = self.engine.offload
        persists = offload is not None and offload.persist_tier is not None
        self._thread.join(timeout=STOP_WAIT_S + (PERSIST_WAIT_S if persists else 0))
