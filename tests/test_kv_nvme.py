"""The NVMe tier (atlas-storage-nvme) under the engine: preemption by swap to disk equals an
unconstrained run (dense and hybrid), a prefix spilled to disk hits with the outputs of a miss, a corrupt
block on disk is recomputed, a full disk or an unwritable directory degrades with one warning, persisted
prefixes survive a restart, and nothing stays held afterwards."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from atlas_core import LLM
from atlas_core.cli import build_parser
from atlas_core.engine.async_engine import AsyncEngine
from atlas_core.engine.config import EngineConfig
from atlas_core.engine.kv_offload import KVOffload
from atlas_core.server.cli_serve import serve_settings
from atlas_core.storage.tiered import TieredStore
from atlas_core.testing.family import mixed_prompts
from tests.conftest import TINY
from tests.test_kv_spill import GREEDY, PROMPTS_33, small_cache, tokens
from tests.test_kv_swap import LOGPROB_TOLERANCE, SCORED, assert_nothing_held, assert_same_outputs, tight_engine

pytest.importorskip("atlas_storage_nvme", reason="the atlas-storage-nvme plugin is not installed")

from atlas_storage_nvme.records import HEADER  # noqa: E402  # the plugin is optional
from atlas_storage_nvme.tier import DATA_FILE, NvmeStorage  # noqa: E402


def nvme_tier(offload: KVOffload | None, store: TieredStore | None = None) -> NvmeStorage:
    """The NVMe tier of the offload's KV store (or of ``store``), its only tier."""
    assert offload is not None
    store = store or offload.store
    assert store.tier_names == ["nvme"]
    backend = store._tiers[0].backend
    assert isinstance(backend, NvmeStorage)
    return backend


@pytest.mark.parametrize("name", ["llama", "qwen3_next"])
def test_swap_to_disk_equals_unconstrained(name: str, tmp_path: Path) -> None:
    """Recompute preemption equals the unconstrained run (`tests/test_kv_swap.py`); so does swap to disk."""
    unconstrained = LLM(TINY / name, block_size=4, max_seq_len=128, max_prefill_tokens=3)
    prompts = mixed_prompts(unconstrained.loaded.model.vocab_size)
    expected = unconstrained.generate(prompts, SCORED)
    swap = tight_engine(name, kv_spill_dir=str(tmp_path), kv_spill_gb=0.02)
    swapped = swap.generate(prompts, SCORED)
    offload = swap.engine.offload
    tier = nvme_tier(offload)
    assert offload is not None and offload.swap_outs > 0 and offload.swap_ins == offload.swap_outs
    assert_same_outputs(expected, swapped, LOGPROB_TOLERANCE[name])
    assert_nothing_held(swap)
    assert len(tier._keys) == len(offload.store) > 0  # the file holds what the store indexes: spilled prefixes
    if offload.state_store is not None:  # and, on the hybrid model, the state snapshots spilled with them
        assert len(nvme_tier(offload, offload.state_store)._keys) == len(offload.state_store) > 0


def test_spilled_prefix_hit_from_disk_equals_miss(tmp_path: Path) -> None:
    expected = tokens(LLM(TINY / "llama", enable_prefix_caching=False), PROMPTS_33)
    llm = small_cache(kv_spill_dir=str(tmp_path), kv_spill_gb=0.01)
    assert tokens(llm, PROMPTS_33) == expected
    outputs = [llm.generate(prompt, GREEDY)[0] for prompt in PROMPTS_33]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert [o.num_cached_tokens for o in outputs] == [32, 32, 32]
    offload = llm.engine.offload
    assert offload is not None and offload.spill_hit_tokens == 96
    assert offload.store.stats()["nvme"][2] >= 24  # records read from disk


def test_corrupt_block_on_disk_is_recomputed(tmp_path: Path) -> None:
    """Every record on disk gets one flipped payload byte: each is dropped on read and recomputed."""
    expected = tokens(LLM(TINY / "llama", enable_prefix_caching=False), PROMPTS_33)
    llm = small_cache(kv_spill_dir=str(tmp_path), kv_spill_gb=0.01)
    tokens(llm, PROMPTS_33)
    tier = nvme_tier(llm.engine.offload)
    llm.engine.offload.sync()  # type: ignore[union-attr]  # every spilled record is on disk before it is flipped
    fd = os.open(tmp_path / "kv" / DATA_FILE, os.O_RDWR)
    for slot in list(tier._keys):
        offset = slot * tier.codec.slot_bytes + HEADER.size + 7
        os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ 1]), offset)
    os.close(fd)
    outputs = [llm.generate(prompt, GREEDY)[0] for prompt in PROMPTS_33]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    offload = llm.engine.offload
    assert offload is not None and offload.spill_lost_blocks >= 8


def test_full_disk_mid_run_degrades_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    expected = tokens(LLM(TINY / "llama", enable_prefix_caching=False), PROMPTS_33)
    llm = small_cache(kv_spill_dir=str(tmp_path), kv_spill_gb=0.01)
    tier = nvme_tier(llm.engine.offload)

    def full(requests: object, write: bool) -> list[int]:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tier.file.io, "start", full)
    with caplog.at_level(logging.WARNING, logger="atlas.storage"):
        assert tokens(llm, PROMPTS_33) == expected
        assert tokens(llm, PROMPTS_33) == expected
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "No space left" in warnings[0].getMessage()


@pytest.mark.parametrize("problem", ["full disk", "unwritable path"])
def test_unusable_directory_at_start_runs_without_the_tier(
    problem: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if problem == "full disk":
        directory, size = tmp_path, 2 * os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize / 2**30
    else:
        (tmp_path / "file").write_text("")
        directory, size = tmp_path / "file" / "spill", 0.01
    expected = tokens(LLM(TINY / "llama", enable_prefix_caching=False), PROMPTS_33)
    with caplog.at_level(logging.WARNING, logger="atlas.engine"):
        llm = small_cache(kv_spill_dir=str(directory), kv_spill_gb=size)
    assert [r.levelno for r in caplog.records].count(logging.WARNING) == 1
    assert llm.engine.offload is not None and llm.engine.offload.store.tier_names == []
    assert tokens(llm, PROMPTS_33) == expected


def test_persisted_prefixes_survive_a_restart(tmp_path: Path) -> None:
    expected = tokens(LLM(TINY / "llama", enable_prefix_caching=False), PROMPTS_33)
    first = small_cache(kv_spill_dir=str(tmp_path), kv_spill_gb=0.01, kv_spill_persist=True)
    tokens(first, PROMPTS_33)
    first.close()
    restarted = small_cache(kv_spill_dir=str(tmp_path), kv_spill_gb=0.01, kv_spill_persist=True)
    outputs = [restarted.generate(prompt, GREEDY)[0] for prompt in PROMPTS_33]
    assert [o.outputs[0].token_ids for o in outputs] == expected
    assert sum(o.num_cached_tokens for o in outputs) > 0
    assert restarted.engine.offload is not None and restarted.engine.offload.spill_hit_tokens > 0


def test_persisted_fp8_prefixes_are_not_read_under_other_scales(tmp_path: Path) -> None:
    """fp8 records stored under one set of KV scales would read wrong under another: a restart with other scales
    starts the persisted tier empty (no hit), one with the same scales hits."""
    from atlas_core.engine.kv_calibration import write_kv_scales

    one, other = tmp_path / "one.json", tmp_path / "other.json"
    write_kv_scales(one, [(0.05, 0.05)] * 3, "llama")
    write_kv_scales(other, [(0.1, 0.1)] * 3, "llama")
    spill = tmp_path / "spill"

    def run(scales: Path) -> LLM:
        llm = small_cache(
            kv_spill_dir=str(spill),
            kv_spill_gb=0.01,
            kv_spill_persist=True,
            kv_cache_dtype="fp8",
            kv_cache_scales=str(scales),
        )
        tokens(llm, PROMPTS_33)
        llm.close()
        return llm

    run(one)
    assert run(other).engine.offload.spill_hit_tokens == 0  # type: ignore[union-attr]
    assert run(other).engine.offload.spill_hit_tokens > 0  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["llama", "qwen3_next"])
def test_shutdown_writes_the_device_prefix_cache_for_a_restart(name: str, tmp_path: Path) -> None:
    """A prefix that never left the device cache is written to disk when the server stops (the engine thread
    closes the engine), with its state snapshot on the hybrid model: the restarted engine hits it."""
    settings = {"block_size": 4, "max_seq_len": 48, "kv_spill_dir": str(tmp_path), "kv_spill_persist": True}
    expected = tokens(LLM(TINY / name, enable_prefix_caching=False), PROMPTS_33[:1])
    first = LLM(TINY / name, kv_spill_gb=0.01, **settings)
    assert tokens(first, PROMPTS_33[:1]) == expected
    assert first.engine.offload is not None and len(first.engine.offload.store) == 0  # nothing was evicted
    AsyncEngine(first.engine).shutdown()
    restarted = LLM(TINY / name, kv_spill_gb=0.01, **settings)
    output = restarted.generate(PROMPTS_33[0], GREEDY)[0]
    assert output.outputs[0].token_ids == expected[0] and output.num_cached_tokens == 32
    assert restarted.engine.offload is not None and restarted.engine.offload.spill_hit_tokens == 32
    restarted.close()


def test_abort_while_swapped_to_disk_frees_its_records(tmp_path: Path) -> None:
    llm = tight_engine("llama", kv_spill_dir=str(tmp_path), kv_spill_gb=0.02)
    engine = llm.engine
    for i, prompt in enumerate(mixed_prompts(256)):
        engine.add_request(str(i), None, prompt, SCORED)
    while engine.offload is not None and engine.offload.num_swapped == 0:
        engine.step()
    tier = nvme_tier(engine.offload)
    engine.offload.sync()
    assert engine.offload.store.num_pinned > 0 and len(tier._keys) == len(engine.offload.store)
    for request_id in list(engine.requests):
        engine.abort(request_id)
    assert_nothing_held(llm)
    assert len(tier._keys) == len(engine.offload.store)


def test_serve_flags_and_environment_reach_the_tier(tmp_path: Path) -> None:
    """`atlas serve --kv-spill-dir DIR` with ``ATLAS_KV_SPILL_GB`` / ``ATLAS_KV_SPILL_PERSIST``: the engine finds
    the plugin through the StorageBackend hook and builds its tier there."""
    args = build_parser().parse_args(["serve", str(TINY / "llama"), "--kv-spill-dir", str(tmp_path)])
    settings = serve_settings(args, {"ATLAS_KV_SPILL_GB": "0.01", "ATLAS_KV_SPILL_PERSIST": "yes"}).of(EngineConfig)
    assert (settings["kv_spill_dir"], settings["kv_spill_gb"], settings["kv_spill_persist"]) == (
        str(tmp_path),
        0.01,
        True,
    )
    llm = LLM(TINY / "llama", **{name: settings[name] for name in ("kv_spill_dir", "kv_spill_gb", "kv_spill_persist")})
    tier = nvme_tier(llm.engine.offload)
    assert tier.capacity_slots > 0 and (tmp_path / "kv" / DATA_FILE).exists() and (tmp_path / "kv" / "LOCK").exists()
