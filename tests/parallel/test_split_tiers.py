"""KV storage tiers on a model split over ranks: every rank swaps and spills its own shard of each block (and
of a hybrid model's recurrent state) as rank 0 decides, so TP=2 under KV pressure gives the unsplit run's
outputs; a spilled prefix hits as a miss answers; a record corrupted on one rank is recomputed on every rank;
each rank's NVMe directory persists its shards for a restart of the same sizes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from atlas_core import LLM
from atlas_core.comm import CommError
from atlas_core.kvtiers.place import TierPlace
from atlas_core.storage.backend import RecordFormat
from atlas_core.testing.family import mixed_prompts
from tests.conftest import TINY
from tests.parallel.test_split_processes import replica_processes
from tests.test_kv_spill import GREEDY, PROMPTS_33, small_cache, tokens
from tests.test_kv_swap import SCORED, assert_nothing_held, assert_same_outputs, tight_engine

SPLIT_TOLERANCE = 1e-5


def split_like(whole: LLM, name: str, **settings: object) -> LLM:
    """A TP=2 engine whose rank 0 has ``whole``'s KV blocks (and state slots): its shards are half as large."""
    budget = whole.engine.config.kv_cache_memory_gib / 2
    config = whole.engine.config
    split = LLM(
        TINY / name,
        block_size=config.block_size,
        max_seq_len=config.max_seq_len,
        max_prefill_tokens=config.max_prefill_tokens,
        kv_cache_memory_gib=budget,
        tensor_parallel_size=2,
        **settings,
    )
    assert split.engine.kv_plan.num_blocks == whole.engine.kv_plan.num_blocks
    return split


@pytest.mark.parametrize("name", ["llama", "qwen3_next"])
def test_swap_split_equals_whole(name: str) -> None:
    """Dense and hybrid: preempted sequences swap their shards out and back on both ranks and continue."""
    whole = tight_engine(name, swap_space_gb=0.01)
    prompts = mixed_prompts(whole.loaded.model.vocab_size)
    expected = whole.generate(prompts, SCORED)
    with split_like(whole, name, swap_space_gb=0.01) as split:
        swapped = split.generate(prompts, SCORED)
        offload = split.engine.offload
        assert offload is not None and offload.swap_outs > 0 and offload.swap_ins == offload.swap_outs
        assert_same_outputs(expected, swapped, SPLIT_TOLERANCE)
        assert_nothing_held(split)


def test_split_spill_hits_corruption_on_one_rank_and_a_restart(tmp_path: Path) -> None:
    """TP=2 with an NVMe tier per rank: a spilled prefix hit answers as a miss; a record corrupted on rank 1
    only is recomputed (never combined with rank 0's shard); rank 0's and rank 1's indexes agree on close, and a
    restarted TP=2 replica hits what they persisted."""
    expected = tokens(LLM(TINY / "llama", enable_prefix_caching=False), PROMPTS_33)
    whole = small_cache()
    settings = {"kv_spill_dir": str(tmp_path), "kv_spill_gb": 0.01, "kv_spill_persist": True}
    split = split_like(whole, "llama", **settings)
    assert tokens(split, PROMPTS_33) == expected
    outputs = [split.generate(prompt, GREEDY)[0] for prompt in PROMPTS_33]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert [o.num_cached_tokens for o in outputs] == [32, 32, 32]
    offload = split.engine.offload
    assert offload is not None and offload.spill_hit_tokens == 96 and offload.spill_lost_blocks == 0
    offload.sync()
    flip_every_payload(tmp_path / "rank-1" / "kv" / "blocks.bin")
    assert tokens(split, PROMPTS_33) == expected
    assert offload.spill_lost_blocks >= 8  # rank 0's records were intact: rank 1's loss voided them
    split.close()
    indexes = [json.loads((tmp_path / f"rank-{r}" / "kv" / "index.json").read_text()) for r in (0, 1)]
    assert indexes[0]["slots"] == indexes[1]["slots"] and indexes[0]["slots"]
    assert indexes[0]["identity"] != indexes[1]["identity"]  # each rank's shards are its own
    with split_like(whole, "llama", **settings) as restarted:
        outputs = [restarted.generate(prompt, GREEDY)[0] for prompt in PROMPTS_33]
        assert [o.outputs[0].token_ids for o in outputs] == expected
        assert restarted.engine.offload is not None and restarted.engine.offload.spill_hit_tokens > 0


def test_records_moved_down_to_disk_keep_their_keys_on_every_rank(tmp_path: Path) -> None:
    """Host tier above the NVMe tier: records demoted at close (and on the way) are filed under their keys on
    rank 1 as on rank 0, so both indexes list the same persisted slots."""
    settings = {"kv_spill_dir": str(tmp_path), "kv_spill_gb": 0.01, "kv_spill_persist": True, "swap_space_gb": 0.01}
    split = split_like(small_cache(), "llama", **settings)
    tokens(split, PROMPTS_33)
    split.close()
    indexes = [json.loads((tmp_path / f"rank-{r}" / "kv" / "index.json").read_text()) for r in (0, 1)]
    assert indexes[0]["slots"] and indexes[0]["slots"] == indexes[1]["slots"]


def test_close_after_a_lost_rank_stops_the_replica() -> None:
    """With a tier, closing a replica whose rank died neither raises nor leaves the other processes running."""
    split = split_like(small_cache(), "llama", swap_space_gb=0.01, comm_timeout=20)
    (worker,) = replica_processes(split)
    worker.kill()
    worker.wait()
    with pytest.raises(CommError):
        split.generate(PROMPTS_33[0], GREEDY)
    split.close()
    assert all(process.returncode is not None for process in replica_processes(split))


def flip_every_payload(path: Path, record_bytes: int = 4096) -> None:
    """Flip one payload byte (past the 64-byte header) of every 4 KiB-aligned record start in ``path`` that holds
    one (a record's slot is a multiple of 4 KiB; flipping a byte of padding or of an unwritten slot is harmless)."""
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        for offset in range(0, size, record_bytes):
            if os.pread(fd, 4, offset) != b"\0\0\0\0":
                byte = os.pread(fd, 1, offset + 71)[0]
                os.pwrite(fd, bytes([byte ^ 1]), offset + 71)
    finally:
        os.close(fd)


def test_rank_directories_and_identities_depend_on_the_sizes(tmp_path: Path) -> None:
    """Each rank's NVMe tier has its own directory; a replica of other sizes reads none of its records."""
    fmt = RecordFormat((((4,), np.dtype(np.float32)),))
    specs = [TierPlace(tmp_path, "m", True, tag).spec(fmt, 1 << 20, "kv") for tag in [(0, 2, 1), (1, 2, 1), (0, 4, 1)]]
    assert [spec.directory for spec in specs] == [tmp_path / f"rank-{r}" / "kv" for r in (0, 1, 0)]
    assert len({spec.identity for spec in specs}) == 3
    assert TierPlace(tmp_path, "m", True).spec(fmt, 1 << 20, "kv").directory == tmp_path / "kv"
