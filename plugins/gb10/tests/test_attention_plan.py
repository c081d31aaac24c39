"""How the cuda backend plans attention, checked without a GPU (NumPy stands in for CuPy): MLA's work list
in eager forwards, the static plan captured decode graphs derive from the attention plan, and the shared
memory the kernels need at DeepSeek-V3's latent widths and Gemma 4's 512-wide heads on each target."""

from __future__ import annotations

import types

import numpy as np
import pytest
from atlas_gb10.attention import AttentionRunner
from atlas_gb10.attention_work import longest_first, query_tiles
from atlas_gb10.hardware import GB10, HOPPER
from atlas_gb10.mla import CudaMLAOps, mla_shared_bytes
from atlas_gb10.registry import all_variants, lookup

from atlas_core.backends.base import AttentionMetadata

DEEPSEEK_WIDTH = 512 + 64
"""A DeepSeek-V3 latent cache row: kv_lora_rank + qk_rope_head_dim."""


class HostBackend:
    """The parts of `CudaBackend` that planning reads, on the host."""

    def __init__(self, profile: object) -> None:
        self.cp = types.SimpleNamespace(asarray=np.asarray, asnumpy=np.asarray)
        self.profile = profile
        self.kernels = types.SimpleNamespace(variant=lambda op, dtype="bf16": lookup(profile.name, op, dtype))
        self.attention_runner = AttentionRunner(self)


def meta(lengths: list[tuple[int, int]]) -> AttentionMetadata:
    starts = np.cumsum([0] + [new for _, new in lengths]).astype(np.int32)
    seq_lens = np.asarray([cached + new for cached, new in lengths], dtype=np.int32)
    return AttentionMetadata(starts, seq_lens, np.zeros((len(lengths), 1), np.int32), np.zeros(starts[-1], np.int32))


@pytest.mark.parametrize("profile", [HOPPER, GB10], ids=["hopper", "gb10"])
def test_deepseek_rows_fit_decode_blocks_double_buffered(profile: object) -> None:
    variant = lookup(profile.name, "mla", "bf16")
    tile, split = variant.define("MLA_TILE_N", 0), variant.define("MLA_SPLIT", 0)
    assert split % tile == 0 and tile % 32 == 0, "a split is whole tiles, a tile whole 32-key warp quarters"
    assert mla_shared_bytes(1, 2, DEEPSEEK_WIDTH, tile, split) <= profile.shared_memory_per_block
    ops = CudaMLAOps(HostBackend(profile))
    assert ops._fitting_shape(DEEPSEEK_WIDTH, 1) == (1, 2)
    assert ops._fitting_shape(DEEPSEEK_WIDTH, 2)[0] == 2, "prefill-sized blocks fit, single-buffered at worst"


@pytest.mark.parametrize("profile", [HOPPER, GB10], ids=["hopper", "gb10"])
def test_512_wide_heads_fit_decode_blocks(profile: object) -> None:
    """Gemma 4's global layers run 16-row blocks with one key/value buffer and the output in registers."""
    runner = HostBackend(profile).attention_runner
    assert runner.shared_bytes(16, 16, 512) <= profile.shared_memory_per_block
    assert runner.shared_bytes(16, 8, 256) <= profile.shared_memory_per_block


@pytest.mark.parametrize("profile", [HOPPER, GB10], ids=["hopper", "gb10"])
def test_fp8_kv_blocks_take_less_shared_memory(profile: object) -> None:
    """fp8 caches' key and value tiles hold bytes: every block shape bf16 caches fit, fp8 ones fit in less."""
    runner = HostBackend(profile).attention_runner
    for rows, dpt, d in ((16, 4, 128), (16, 8, 256), (64, 4, 128), (16, 16, 512)):
        assert runner.shared_bytes(rows, dpt, d, "fp8") < runner.shared_bytes(rows, dpt, d)
        assert runner.shared_bytes(rows, dpt, d, "fp8") <= profile.shared_memory_per_block


def test_mla_split_is_one_number_per_target() -> None:
    splits = {v.define("MLA_SPLIT", 0) for (_, op, _), v in all_variants() if op == "mla"}
    assert len(splits) == 1


def test_eager_plans_cut_idle_decodes_into_splits_and_keep_prefills_whole() -> None:
    ops = CudaMLAOps(HostBackend(HOPPER))
    decode = ops._plan(meta([(1000, 1), (10, 1)]), heads=128, width=DEEPSEEK_WIDTH)
    assert (decode.m_tiles, decode.splits, decode.items) == (1, 4, 8)  # 2 sequences x 4 splits of 256 keys
    assert decode.work[:, 2].tolist() == [0, 1, 2, 3] * 2
    prefill_meta = meta([(0, 300), (5, 1)])
    prefill = ops._plan(prefill_meta, heads=128, width=DEEPSEEK_WIDTH)
    assert (prefill.m_tiles, prefill.splits) == (2, 0)
    assert prefill.items == 301 and (prefill.work[:, 2] == -1).all(), "one token (128 heads: 4 blocks) per item"
    assert ops._plan(prefill_meta, heads=128, width=DEEPSEEK_WIDTH) is prefill, "one plan per forward"
    few_heads = ops._plan(meta([(0, 300)]), heads=4, width=40)  # 38 blocks leave SMs idle: split mode
    assert few_heads.splits == 2 and few_heads.items == 38 * 2
    assert few_heads.work[::2, 1].tolist()[:3] == [0, 8, 16], "32-row blocks hold 8 tokens of 4 heads"


def test_wgmma_prefill_takes_128_wide_heads_over_bf16_caches_on_hopper() -> None:
    hopper, gb10 = HostBackend(HOPPER).attention_runner, HostBackend(GB10).attention_runner
    assert hopper.takes_wgmma(128, 8, "bf16", 100)
    assert not gb10.takes_wgmma(128, 8, "bf16", 100), "no wgmma on sm_121"
    assert not hopper.takes_wgmma(64, 8, "bf16", 100), "64-row items: attention_mma.cu"
    assert not hopper.takes_wgmma(128, 5, "bf16", 100), "heads of 80: attention_mma.cu"
    assert not hopper.takes_wgmma(128, 8, "fp8", 100), "fp8 caches: attention_mma.cu"
    assert hopper.takes_wgmma(128, 8, "bf16", 65535)
    assert not hopper.takes_wgmma(128, 8, "bf16", 65536), "more items than a grid's second dimension holds"


def test_prefill_tiles_run_longest_first() -> None:
    """The tensor-core prefill items start with those whose last token sees the most keys; none is lost."""
    q_lens, lengths = np.asarray([70, 5, 40]), np.asarray([100, 500, 40])
    seqs, first = query_tiles(q_lens, 32)
    ordered = longest_first(seqs, first, q_lens, lengths, 32)
    last_keys = [int(lengths[s] - q_lens[s] + min(f + 32, q_lens[s]) - 1) for s, f in zip(*ordered, strict=True)]
    assert last_keys == [499, 99, 93, 61, 39, 31]
    assert sorted(zip(*ordered, strict=True)) == sorted(zip(seqs, first, strict=True))


def test_graph_plans_derive_from_the_static_attention_plan() -> None:
    backend = HostBackend(HOPPER)
    ops, runner = CudaMLAOps(backend), backend.attention_runner
    decode = meta([(100, 1), (0, 1)])
    runner.static = runner.static_work(2, 16)  # 16 attention splits of 64 keys: contexts up to 1024
    plan = ops._plan(decode, heads=128, width=DEEPSEEK_WIDTH)
    assert (plan.m_tiles, plan.splits, plan.items) == (1, 4, 8)
    assert ops._plan(decode, heads=128, width=DEEPSEEK_WIDTH).work is plan.work, "derived once, kept with the graph"
    assert runner.static.derived["mla"].work is plan.work
    runner.static = runner.static_work(2, 4)  # 256 keys: one MLA split, so direct mode
    assert ops._plan(decode, heads=128, width=DEEPSEEK_WIDTH).splits == 0
    runner.static = runner.static_work(32, 1)  # large buckets: attention in direct mode, MLA too
    direct = ops._plan(meta([(5, 1)] * 32), heads=128, width=DEEPSEEK_WIDTH)
    assert direct.splits == 0 and direct.work is runner.static.work
