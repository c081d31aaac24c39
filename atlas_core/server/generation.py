"""Running engine requests for the routes: timeouts, metrics, failures as `APIError`, and merging.

`generate` yields a request's `RequestOutput` after every engine step that changed it. Closing
the iterator (a client that went away, a timeout) aborts the engine request, which frees its KV
blocks. `start` waits for the first output so that a request the engine rejects becomes an HTTP
error before any response byte is sent. `unless_disconnected` ends the wait for a response (first
output or final result) as soon as the client hangs up, which aborts the work behind it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Sequence
from typing import TypeVar

from litestar.types import Receive

from atlas_core.engine.outputs import RequestOutput
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.model.vision import PreparedImage
from atlas_core.server.errors import CLIENT_CLOSED, APIError, invalid
from atlas_core.server.state import ServerState

T = TypeVar("T")

log = logging.getLogger("atlas.requests")


async def generate(
    state: ServerState,
    prompt: str | None,
    prompt_ids: list[int],
    params: SamplingParams,
    images: Sequence[PreparedImage] = (),
) -> AsyncGenerator[RequestOutput, None]:
    """The outputs of one engine request (with its prepared ``images``, placeholders expanded in
    ``prompt_ids``); raises `APIError` on timeout, failure or shutdown."""
    runtime = state.require_runtime()
    if state.config.log_requests:
        log.info("prompt (%d tokens): %r", len(prompt_ids), prompt if prompt is not None else prompt_ids)
    timeout = state.config.request_timeout
    deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
    stream = runtime.engine.generate(prompt, prompt_ids, params, images=images)
    tracker = state.metrics.track(len(prompt_ids))
    try:
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    output = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise APIError(
                    504,
                    f"the request did not finish within the server's request timeout ({timeout:g} s); ask for "
                    "fewer tokens or raise --request-timeout",
                ) from None
            tracker.observe(output)
            _raise_if_failed(state, output)
            yield output
            if output.finished:
                return
    finally:
        await stream.aclose()
        tracker.done()


def _raise_if_failed(state: ServerState, output: RequestOutput) -> None:
    if output.error and output.error_invalid:  # the request's own constraint could not be followed
        raise invalid(
            f"generation stopped: {output.error}; simplify the requested output format (a JSON schema that refers "
            "to itself, for example, can exceed what the grammar can follow)"
        )
    if output.error:
        raise APIError(500, f"generation failed: {output.error}")
    if output.finished and any(c.finish_reason == "abort" for c in output.outputs):
        reason = "the server is shutting down" if state.shutting_down else "the request was cancelled"
        raise APIError(503, f"{reason}; it was ended after {max(len(c.token_ids) for c in output.outputs)} tokens")


async def start(stream: AsyncGenerator[RequestOutput, None]) -> AsyncGenerator[RequestOutput, None]:
    """``stream`` with its first output already awaited (errors surface here, before streaming)."""
    try:
        first = await anext(stream)
    except StopAsyncIteration:
        first = None

    async def resumed() -> AsyncGenerator[RequestOutput, None]:
        try:
            if first is not None:
                yield first
            async for item in stream:
                yield item
        finally:
            await stream.aclose()

    return resumed()


async def final(stream: AsyncGenerator[RequestOutput, None]) -> RequestOutput:
    """The finished output of ``stream``."""
    last = None
    async for output in stream:
        last = output
    if last is None:
        raise APIError(500, "the engine returned no output for the request")
    return last


async def merge(streams: list[AsyncGenerator[RequestOutput, None]]) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """Interleave several streams as ``(stream index, output)`` in arrival order; the first error
    is raised and every stream is closed (so its engine request is aborted) when iteration stops."""
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[RequestOutput, None]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
            await queue.put((index, None))
        except Exception as exc:
            await queue.put((index, exc))
        finally:
            await stream.aclose()

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _disconnected(receive: Receive) -> None:
    """Return once the client has closed the connection (the request body was already read, so the
    ASGI server's next message is ``http.disconnect``)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(receive: Receive, work: Awaitable[T]) -> T:
    """The result of ``work``; if the client disconnects first, ``work`` is cancelled (closing its
    streams aborts their engine requests) and `APIError` 499 is raised (no one reads it)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if not task.cancelled():
        return task.result()
    raise APIError(CLIENT_CLOSED, "the client closed the connection before the response was ready")
