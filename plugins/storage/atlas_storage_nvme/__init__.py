"""atlas-storage-nvme: the ``nvme`` KV storage tier (`atlas_storage_nvme.tier.NvmeStorage`)."""
