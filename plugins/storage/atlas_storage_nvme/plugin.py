"""Entry point of the ``atlas-storage-nvme`` distribution (group ``atlas``): registers the ``nvme`` storage
tier, selected by the engine's ``kv_spill_dir`` setting. Importing this module opens no file."""

from __future__ import annotations

from atlas_core.hookspecs import Register, hookimpl


@hookimpl
def register_storage_backends(register: Register) -> None:
    register("nvme", "atlas_storage_nvme.tier:NvmeStorage")
