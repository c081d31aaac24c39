"""`LLMEngine`: requests in, one batched forward per `step`, outputs out."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence as Seq

from atlas_core.backends.base import Backend
from atlas_core.backends.kv_dtypes import dtype_label
from atlas_core.batch.kv_cache import KVCache, kv_storage_layouts, plan_kv_cache, with_kv_scales
from atlas_core.engine.block_manager import BlockManager
from atlas_core.engine.config import EngineConfig, kv_budget
from atlas_core.engine.guided_decoding import GuidedDecoding
from atlas_core.engine.images import RequestImages
from atlas_core.engine.kv_calibration import read_kv_scales
from atlas_core.engine.kv_tiers import build_offload
from atlas_core.engine.outputs import RequestOutput
from atlas_core.engine.runner import ModelRunner, ScheduledChunk
from atlas_core.engine.sampling_params import SamplingParams
from atlas_core.engine.scheduler import ScheduledStep, Scheduler, SchedulerConfig
from atlas_core.engine.sequence import Request, Sequence
from atlas_core.engine.spec.speculation import Speculation
from atlas_core.engine.spec.verify import DraftCheckpoints
from atlas_core.engine.state_slots import StateSlotPool, StateSnapshots
from atlas_core.errors import ConfigError, InvalidRequestError
from atlas_core.model.load import LoadedModel
from atlas_core.model.vision import PreparedImage
from atlas_core.parallel.mirror import MirroredGraphs, RankMirror

log = logging.getLogger("atlas.engine")

LOAD_WAIT_S = 0.05
"""When no sequence can run because KV is still coming back from the storage tiers, how long `step` waits."""


class LLMEngine:
    """Owns the KV cache, block manager, scheduler and runner for one loaded model.

    Not thread-safe: one thread calls `add_request` / `abort` / `step` (see `AsyncEngine`).
    """

    def __init__(self, loaded: LoadedModel, backend: Backend, config: EngineConfig) -> None:
        token_budget = config.max_num_batched_tokens
        if token_budget is None:  # the backend's budget, in a copy: the caller's config stays as given
            token_budget = backend.default_token_budget()
            config = dataclasses.replace(config, max_num_batched_tokens=token_budget)
        self.loaded, self.backend, self.config = loaded, backend, config
        backend.batch_invariant = config.batch_invariant
        model = loaded.model
        if config.max_seq_len and config.max_seq_len > model.max_position_embeddings:
            raise InvalidRequestError(
                f"max_seq_len={config.max_seq_len} exceeds the model's context length ({model.max_position_embeddings})"
            )
        self.max_seq_len = min(config.max_seq_len or config.default_max_seq_len, model.max_position_embeddings)
        self.speculation = Speculation.build(config.speculation, loaded, backend, self.max_seq_len)
        extra_layers = self.speculation.kv_layouts if self.speculation else []  # MTP layers: after the model's
        self.kv_layouts = kv_storage_layouts(
            [*model.kv_layouts, *extra_layers], config.kv_cache_dtype, backend, config.kv_high_precision_layers
        )
        if config.kv_cache_scales is not None:
            if config.kv_cache_dtype != "fp8":
                raise ConfigError(
                    f"kv_cache_scales applies to kv_cache_dtype=fp8, not {config.kv_cache_dtype}: set "
                    "kv_cache_dtype=fp8 (--kv-cache-dtype fp8) or drop kv_cache_scales"
                )
            own = len(model.kv_layouts)  # the file covers the model's layers; MTP layers keep their own scales
            scales = read_kv_scales(config.kv_cache_scales, own)
            self.kv_layouts = with_kv_scales(self.kv_layouts[:own], scales) + self.kv_layouts[own:]
        budget, source, more = kv_budget(backend, config)
        # recurrent state: one slot per running sequence, plus the prefix cache's state snapshots
        num_seq_slots = config.max_num_seqs if model.has_recurrent_state else 0
        snapshot_pool = config.max_num_seqs if config.max_state_snapshots is None else config.max_state_snapshots
        num_snapshots = snapshot_pool if config.enable_prefix_caching and num_seq_slots else 0
        # the state at each draft position of a verify step, for the rollback of rejected drafts
        drafts_per_seq = config.speculation.num_speculative_tokens if config.speculation is not None else 0
        num_scratch = num_seq_slots * drafts_per_seq
        num_state_slots = num_seq_slots + num_snapshots + num_scratch
        state_bytes = num_state_slots * model.state_bytes_per_slot()
        if state_bytes:
            budget -= state_bytes
            source += f" minus {state_bytes / 2**20:.1f} MiB of recurrent state ({num_state_slots} slots)"
        if self.speculation:
            target_bytes = sum(layout.bytes_per_token(backend.activation_dtype) for layout in self.kv_layouts)
            budget, more = self.speculation.allocate_kv(budget, target_bytes, config, source, more)
        plan = plan_kv_cache(
            self.kv_layouts,
            backend.activation_dtype,
            config.block_size,
            budget,
            self.max_seq_len,
            source,
            config.max_num_seqs,
            more,
        )
        self.kv_plan = plan
        blocks_per_seq = -(-self.max_seq_len // config.block_size)
        full_length_seqs = plan.num_blocks // blocks_per_seq
        if full_length_seqs < config.max_num_seqs:
            every_one = config.max_num_seqs * blocks_per_seq * config.block_size
            budget_for_all = more(every_one * plan.bytes_per_token - budget) if plan.bytes_per_token else None
            log.info(
                "KV cache: %d tokens hold %d sequences of max_seq_len=%d at once (max_num_seqs=%d); longer "
                "concurrent work is preempted and recomputed. Guaranteed without preemption: max_num_seqs=%d, "
                "or max_seq_len=%d at max_num_seqs=%d%s.",
                plan.capacity_tokens,
                full_length_seqs,
                self.max_seq_len,
                config.max_num_seqs,
                full_length_seqs,
                plan.num_blocks // config.max_num_seqs * config.block_size,
                config.max_num_seqs,
                f", or {budget_for_all} for all of them" if budget_for_all else "",
            )
        mirror = model.mirror if isinstance(model.mirror, RankMirror) else None
        if mirror is not None:  # rank 0 of a split replica: the other ranks allocate their KV cache too
            # speculation runs split: verify steps and MTP steps are posted forwards (the MTP head was built on
            # every rank by `Speculation.build`); a draft model runs whole on rank 0 alone; the storage tiers run
            # split too (`build_offload` opens every rank's)
            self.kv = mirror.kv_cache(self.kv_layouts, plan, config.kv_cache_dtype, config.kv_high_precision_layers)
        else:
            self.kv = KVCache(backend, self.kv_layouts, plan)
        if self.speculation:
            self.speculation.attach(self.kv)
        self.blocks = BlockManager(
            plan.num_blocks, config.block_size, enable_prefix_caching=config.enable_prefix_caching
        )
        self.state_slots, snapshots, checkpoints = None, None, None
        if model.has_recurrent_state:
            model.allocate_state(num_state_slots)
            self.state_slots = StateSlotPool(num_seq_slots, model.reset_state)
            if num_snapshots:
                snapshot_slots = range(num_seq_slots, num_seq_slots + num_snapshots)
                snapshots = StateSnapshots(snapshot_slots, model.copy_state, self.blocks.is_cached)
            if num_scratch:
                checkpoints = DraftCheckpoints(model, num_state_slots - num_scratch, drafts_per_seq)
        self.offload = build_offload(
            config, self.kv, self.blocks, model.recurrent_state, snapshots, loaded.name, mirror
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=token_budget,
                max_prefill_tokens=config.max_prefill_tokens or token_budget,
                policy=config.scheduling_policy,
                tbt_slo_s=config.tbt_slo_ms / 1000,
            ),
            self.blocks,
            self.state_slots,
            snapshots,
            self.speculation.draft_room if self.speculation else None,
            offload=self.offload,
        )
        self.eos_token_ids = list(loaded.tokenizer.eos_token_ids) if loaded.tokenizer else []
        self.guided = GuidedDecoding(loaded.tokenizer, model.vocab_size, self.eos_token_ids)
        graphs = backend.decode_graphs(model, self.kv)
        if graphs is not None and mirror is not None:  # every rank replays its own graph of each step
            graphs = MirroredGraphs(mirror, graphs)
        self.runner = ModelRunner(
            model,
            backend,
            self.kv,
            loaded.tokenizer,
            graphs,
            self.guided,
            checkpoints,
            self.speculation.observer if self.speculation else None,
            None if model.has_recurrent_state else self.scheduler.reserve_next_block,
        )
        if self.speculation:
            self.speculation.guided = self.guided
        self.requests: dict[str, Request] = {}
        self.num_steps = 0
        """Forward steps run since start (steps with nothing scheduled do not count)."""

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_plan.capacity_tokens

    @property
    def kv_dtype(self) -> str:
        """The KV storage dtype(s) by name (``float32``, ``bfloat16``, ``float8_e4m3fn``; ``/``-joined if mixed)."""
        default = self.backend.activation_dtype
        return "/".join(sorted({dtype_label(layout.dtype or default) for layout in self.kv_layouts}) or ["none"])

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_ids: list[int],
        params: SamplingParams,
        images: Seq[PreparedImage] = (),
    ) -> Request:
        """Queue a request; invalid prompts or parameters raise `InvalidRequestError`. ``images`` (prepared by
        the model's `VisionModel.prepare`) pair up with the prompt's image placeholders in order
        (`atlas_core.model.vision.expand_placeholders`: a single placeholder token is expanded here)."""
        vocab = self.loaded.model.vocab_size
        if not prompt_ids:
            raise InvalidRequestError("the prompt is empty")
        request_images = None
        if images:
            prompt_ids, request_images = self.prepare_images(prompt_ids, images)
        if min(prompt_ids) < 0 or max(prompt_ids) >= vocab:
            raise InvalidRequestError(f"prompt token ids must be in [0, {vocab})")
        if params.pooling is not None and len(prompt_ids) > self.max_seq_len:
            raise InvalidRequestError(
                f"the input has {len(prompt_ids)} tokens but max_seq_len is {self.max_seq_len}; shorten it or raise "
                "max_seq_len"
            )
        if params.pooling is None and len(prompt_ids) >= self.max_seq_len:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_ids)} tokens but max_seq_len is {self.max_seq_len}; shorten the prompt "
                "(one token must remain for the answer) or raise max_seq_len"
            )
        bad = [t for t in (*params.logit_bias, *params.stop_token_ids) if not 0 <= t < vocab]
        if bad:
            raise InvalidRequestError(f"token ids {bad[:5]} in logit_bias / stop_token_ids are outside [0, {vocab})")
        if params.top_k > vocab:
            raise InvalidRequestError(
                f"top_k={params.top_k} is more than the vocabulary ({vocab} tokens); send at most {vocab}, or 0 or -1 "
                "for no top-k limit"
            )
        room = self.max_seq_len - len(prompt_ids)
        if params.min_tokens > room:
            raise InvalidRequestError(
                f"min_tokens={params.min_tokens} is more than the context leaves after the prompt (max_seq_len "
                f"{self.max_seq_len} minus {len(prompt_ids)} prompt tokens = {room}); ask for at most {room}"
            )
        if self.state_slots is not None and params.n > self.state_slots.num_slots:
            raise InvalidRequestError(
                f"n={params.n} exceeds max_num_seqs={self.state_slots.num_slots}: on a model with recurrent layers "
                "every completion needs its own state slot; lower n or raise max_num_seqs"
            )
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        request = Request(
            request_id, prompt, prompt_ids, params, self.loaded.tokenizer, self.eos_token_ids, self.max_seq_len
        )
        request.images = request_images
        self.guided.add(request)
        self.requests[request_id] = request
        self.scheduler.add(request.seqs[0])
        return request

    def prepare_images(self, prompt_ids: list[int], images: Seq[PreparedImage]) -> tuple[list[int], RequestImages]:
        """The prompt with its image placeholders expanded, and the request's images; `InvalidRequestError`
        when the model reads text only or placeholders and images do not pair up. (On a split model rank 0
        holds the vision tower: its steps carry the features to the other ranks.)"""
        vision = self.loaded.model.vision
        if vision is None:
            raise InvalidRequestError(f"the served model ({self.loaded.name}) reads text only: it has no vision tower")
        return RequestImages.prepare(vision, prompt_ids, images)

    def abort(self, request_id: str) -> None:
        """Cancel a request; everything it holds is freed. Unknown or finished ids are ignored."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.seqs:
            if not seq.finished:
                seq.finish("abort")
            self._release(seq)
        request.pending_forks = []

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self, finished_only: bool = False) -> list[RequestOutput]:
        """Run one batched forward; return the outputs of requests that produced tokens or finished (with
        ``finished_only``, of those that finished: an output holds all of a request's tokens so far, so building
        one for every request every step costs as much as its length)."""
        step = self.scheduler.schedule()
        if not step.chunks:
            if self.offload is not None and len(self.offload.loads):
                self.offload.wait(LOAD_WAIT_S)  # only sequences whose KV is on its way back are left
            return []
        self.num_steps += 1
        for chunk in step.chunks:
            self._start_forks(chunk)
        if self.speculation:
            self.speculation.propose(step.chunks)
        touched = {chunk.seq.request.request_id: chunk.seq.request for chunk in step.chunks}
        try:
            if self.offload is not None:
                self.offload.before_forward()
            sampled = self.runner.execute(step.chunks, step.block_copies, self._decodes_again(step))
            self._copy_state_to_forks(step.chunks)
        except Exception as exc:  # a failed forward fails the requests in it, never the engine
            log.exception("forward step failed")
            for request in touched.values():
                request.fail(f"{type(exc).__name__}: {exc}")
            sampled = []
        for chunk in step.chunks:
            for seq in (chunk.seq, *chunk.followers):
                if seq.request.error is None:  # finished by this step too: its prompt's blocks stay cached
                    self.blocks.register_computed(seq.table, seq.cache_ids, seq.num_computed)
                if not seq.finished:
                    self.scheduler.snapshot_state(seq)
        changed = {seq.request.request_id for seq in sampled} | {r for r, req in touched.items() if req.error}
        outputs = []
        for request_id in changed:
            request = touched[request_id]
            for seq in request.seqs:
                if seq.finished:
                    self._release(seq)
            finished = request.finished
            if finished:
                self.requests.pop(request_id, None)
            if finished or not finished_only:
                outputs.append(request.output())
        return outputs

    def _decodes_again(self, step: ScheduledStep) -> bool:
        """Whether the step after ``step`` is expected to decode its sequences again: nothing waits and every
        running sequence runs in it (each took at least one token of the budget, so the next step's budget holds
        their decodes), with no speculation or storage tier in the way. The runner may then launch that step before
        it reads this one's tokens (`atlas_core.engine.ahead`; on a split replica every rank takes the step's token
        ids from rank 0's broadcast, `atlas_core.parallel.mirror`)."""
        return (
            not self.speculation
            and self.offload is None
            and not self.scheduler.waiting
            and len(step.chunks) == len(self.scheduler.running)
        )

    def close(self) -> None:
        """Finish the storage tiers' transfers and close them (with ``kv_spill_persist``, after writing the
        device prefix cache to the NVMe tier, so a restarted engine finds it), let a decode step queued ahead
        finish, and release the decode graphs. Idempotent; the engine must not step afterwards."""
        if self.offload is not None:
            self.offload.close()
        if self.runner.ahead is not None:
            self.runner.ahead.drop()
        if self.runner.decode_graphs is not None:
            self.runner.decode_graphs.close()

    def _release(self, seq: Sequence) -> None:
        self.scheduler.release(seq)
        self.guided.release(seq)
        if self.speculation:
            self.speculation.release(seq)

    def _copy_state_to_forks(self, chunks: list[ScheduledChunk]) -> None:
        """Forks (n > 1) start from their parent's recurrent state after the prompt's last chunk."""
        if self.state_slots is None:
            return
        for chunk in chunks:
            if chunk.followers:
                followers = [seq.held_state_slot() for seq in chunk.followers]
                self.loaded.model.copy_state([chunk.seq.held_state_slot()] * len(followers), followers)

    def _start_forks(self, chunk: ScheduledChunk) -> None:
        """When a request's first sequence finishes its prompt, its n - 1 siblings fork from it."""
        request = chunk.seq.request
        if request.pending_forks and chunk.samples and len(chunk.seq.token_ids) == chunk.seq.num_prompt_tokens:
            for child in request.pending_forks:
                self.scheduler.start_fork(chunk.seq, child)
                chunk.followers.append(child)
            request.pending_forks = []
