"""Running the app under uvicorn with a graceful shutdown.

On SIGINT/SIGTERM uvicorn stops listening and waits for open connections; `DrainingServer`
starts `ServerState.drain` at that moment, so in-flight requests get ``shutdown_timeout`` seconds
to finish and are then ended cleanly (streams close with an error event) before uvicorn's own
deadline, which is a few seconds later, would cut connections.
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from atlas_core.server.app import create_app
from atlas_core.server.state import ServerState

GRACE_AFTER_DRAIN_S = 5.0


class DrainingServer(uvicorn.Server):
    """A `uvicorn.Server` whose shutdown drains the engine first."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        drained = asyncio.ensure_future(self.state.drain())
        await super().shutdown(sockets)
        await drained

    @property
    def bound_port(self) -> int:
        """The port actually listened on (useful with port 0)."""
        return int(self.servers[0].sockets[0].getsockname()[1])


def make_server(state: ServerState, host: str, port: int, *, log_level: str = "warning") -> DrainingServer:
    config = uvicorn.Config(
        create_app(state), host=host, port=port, log_level=log_level, workers=1, lifespan="on",
        timeout_graceful_shutdown=int(state.config.shutdown_timeout + GRACE_AFTER_DRAIN_S),
    )
    return DrainingServer(config, state)
