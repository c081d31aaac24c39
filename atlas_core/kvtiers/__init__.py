"""The parts of the KV storage tiers that every rank runs, below `parallel` and `engine`: record formats and
where tiers live (`place`), loads coming back from the tiers (`loads`), and what the ranks of a split replica
agree on together (`agree`). Rank 0's policy (swap, spill, persistence) is `atlas_core.engine.kv_offload`."""
