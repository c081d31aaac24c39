"""Entry point of the ``atlas-comm-nccl`` distribution (group ``atlas``): registers the ``nccl`` comm backend.

Importing this module imports nothing heavy: CuPy and NCCL are imported only when a split model on a
GPU backend connects its ranks.
"""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_comm_backends(register: Register) -> None:
    register("nccl", "atlas_comm_nccl.nccl:NcclComm")
