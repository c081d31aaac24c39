"""`ReplicaSettings`: what every rank of a split replica is started with (`EngineConfig.replica_settings`
makes them from the engine settings; a rank started here gets them as JSON)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from atlas_core.errors import ConfigError
from atlas_core.model.load import LoadFormat
from atlas_core.model.sharding import ShardPlan

DEFAULT_MASTER_PORT = 29500
"""Where rank 0 listens when the ranks are started by hand and ``master_port`` is not given."""

Launcher = Literal["mp", "ray"]
"""How rank 0 starts ranks 1..: ``mp``, processes of its own host; ``ray``, actors of a Ray cluster."""


@dataclass(frozen=True)
class ReplicaSettings:
    """The parallel sizes, how the ranks meet, and the load settings every rank must share.

    ``rank`` and ``world_size`` are given (both) when each rank is started by hand, else None: rank 0
    starts the others, as processes of its host (``distributed_executor_backend`` ``mp``) or as actors of
    the Ray cluster at ``ray_address`` (``ray``, `atlas_core.parallel.ray_ranks`). ``max_seq_len`` (None:
    the model's context, at most ``default_max_seq_len``), ``gguf_weights`` and ``load_format`` shape what each
    rank loads;
    ``batch_invariant`` picks the same kernels on every rank (`Backend.batch_invariant`).
    `ConfigError` for values that do not compose."""

    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1
    comm_backend: str | None = None
    comm_timeout: float = 300.0
    rank: int | None = None
    world_size: int | None = None
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    distributed_executor_backend: Launcher = "mp"
    ray_address: str = "auto"
    max_seq_len: int | None = None
    default_max_seq_len: int = 8192
    gguf_weights: str = "auto"
    load_format: LoadFormat = "auto"
    batch_invariant: bool = False

    def __post_init__(self) -> None:
        plan = self.shard_plan(self.rank or 0)  # sizes that do not compose are refused here
        if (self.rank is None) != (self.world_size is None):
            raise ConfigError("rank and world_size go together: give both (ranks started by hand) or neither")
        if self.world_size is not None and self.world_size != plan.world_size:
            raise ConfigError(
                f"world_size={self.world_size}, but tensor_parallel_size={self.tensor_parallel_size} and "
                f"expert_parallel_size={self.expert_parallel_size} make {plan.world_size} ranks"
            )
        if self.distributed_executor_backend not in ("mp", "ray"):
            raise ConfigError(
                f"distributed_executor_backend must be mp or ray, got {self.distributed_executor_backend!r}"
            )
        if self.distributed_executor_backend == "ray" and self.rank is not None:
            raise ConfigError(
                "distributed_executor_backend=ray starts ranks 1.. itself; ranks started by hand (rank, world_size) "
                "need distributed_executor_backend=mp"
            )
        if self.comm_timeout <= 0:
            raise ConfigError(f"comm_timeout must be positive, got {self.comm_timeout}")

    def shard_plan(self, rank: int) -> ShardPlan:
        """Rank ``rank``'s `ShardPlan`."""
        return ShardPlan(rank, self.tensor_parallel_size, self.expert_parallel_size)

    @property
    def world(self) -> int:
        """How many ranks the replica has (1: the model is not split)."""
        return self.shard_plan(0).world_size

    @property
    def max_positions(self) -> int:
        """How long each rank builds its position tables (RoPE)."""
        return self.max_seq_len or self.default_max_seq_len

    @property
    def port(self) -> int | None:
        """Rank 0's port: ``master_port``, else `DEFAULT_MASTER_PORT` for ranks started by hand, else None
        (rank 0 picks a free one)."""
        if self.master_port is not None:
            return self.master_port
        return DEFAULT_MASTER_PORT if self.rank is not None else None
