"""atlas-comm-nccl: the ``nccl`` CommBackend (`atlas_comm_nccl.nccl.NcclComm`)."""
