"""Transfers to and from the storage tiers overlap compute: tier writes run on the store's I/O thread while
the engine keeps stepping, and a sequence whose KV is still coming back (read from a tier, then uploaded) holds
its blocks but is not scheduled until it is in; one aborted meanwhile leaves nothing behind."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from atlas_core import LLM, SamplingParams
from atlas_core.backends.base import Array
from atlas_core.backends.transfers import HostTransfers, Transfer
from atlas_core.engine.llm_engine import LLMEngine
from tests.conftest import TINY
from tests.test_kv_spill import GREEDY, PROMPTS_33, small_cache, tokens
from tests.test_kv_swap import assert_nothing_held

THREE = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


class HeldUploads(HostTransfers):
    """Uploads that land at once but report done only after `release` (as a copy stream still busy would)."""

    def __init__(self, inner: HostTransfers) -> None:
        super().__init__(inner.backend)
        self.released = False
        self.fenced = 0

    def scatter(self, arrays: Sequence[Array], rows: Sequence[int], values: Sequence[np.ndarray]) -> Transfer:
        super().scatter(arrays, rows, values)
        return self

    def done(self) -> bool:
        return self.released

    def fence(self) -> None:
        self.fenced += 1


def step_until_finished(engine: LLMEngine) -> None:
    for _ in range(200):
        if not engine.has_unfinished():
            return
        engine.step()
    raise AssertionError("the requests did not finish")


def test_tier_writes_overlap_steps_and_loading_sequences_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = tokens(LLM(TINY / "llama", enable_prefix_caching=False), PROMPTS_33)
    llm = small_cache(swap_space_gb=0.01)
    engine, offload = llm.engine, llm.engine.offload
    assert offload is not None
    tier = offload.store._tiers[0].backend
    writes_may_go, real_write = threading.Event(), tier.write
    monkeypatch.setattr(tier, "write", lambda *args: (writes_may_go.wait(), real_write(*args)))
    uploads = HeldUploads(offload.transfers)
    try:
        # every spill write of this round waits on the I/O thread; the steps do not wait for them
        assert tokens(llm, PROMPTS_33) == expected
        offload.loads.transfers = uploads
        returning = engine.add_request("returning", None, PROMPTS_33[0], GREEDY).seqs[0]
        other = engine.add_request("other", None, [7] * 5, THREE).seqs[0]
        for _ in range(3):  # the spilled prefix's read queues behind the held writes; the other prompt runs
            engine.step()
        assert offload.is_loading(returning) and returning.num_computed == 0 and len(returning.table.blocks) == 9
        assert other.finished and not returning.output_ids
    finally:
        writes_may_go.set()
    offload.sync()
    engine.step()  # the records are read: their upload starts, and is not done
    assert offload.is_loading(returning) and not returning.output_ids
    uploads.released = True
    step_until_finished(engine)
    assert returning.output_ids == expected[0] and returning.request.num_cached_tokens == 32
    uploads.released = False
    aborted = engine.add_request("aborted", None, PROMPTS_33[1], GREEDY).seqs[0]
    engine.step()
    offload.sync()
    engine.step()
    assert offload.is_loading(aborted) and uploads.fenced == 0
    engine.abort("aborted")  # its upload is fenced, so its blocks may be reused at once
    assert uploads.fenced == 1 and not offload.is_loading(aborted)
    assert_nothing_held(llm)
