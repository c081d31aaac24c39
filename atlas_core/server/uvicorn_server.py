"""Running the app under uvicorn with a graceful shutdown.

On SIGINT/SIGTERM `DrainingServer` first runs `ServerState.drain` while still listening: new
requests get a 503 (not a refused connection), in-flight ones get ``shutdown_timeout`` seconds to
finish and are then ended cleanly (streams close with an error event). Only then does uvicorn stop
listening and wait for the open connections, with a deadline a few seconds later.
"""

from __future__ import annotations

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
        await self.state.drain()  # the sockets stay open meanwhile, so new requests get the 503
        await super().shutdown(sockets)

    @property
    def bound_port(self) -> int:
        """The port actually listened on (useful with port 0)."""
        return int(self.servers[0].sockets[0].getsockname()[1])


def make_server(state: ServerState, host: str, port: int, *, log_level: str = "warning") -> DrainingServer:
    config = uvicorn.Config(
        create_app(state),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,  # the app logs its own access lines (atlas_core.server.access_log)
        workers=1,
        lifespan="on",
        timeout_graceful_shutdown=int(state.config.shutdown_timeout + GRACE_AFTER_DRAIN_S),
    )
    return DrainingServer(config, state)
