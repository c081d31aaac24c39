"""`EngineConfig` (and `ModelChoice`): the engine's settings, each field declared once with its
flag, help and default (`atlas_core.options`); and how the memory settings become a KV-cache budget."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from atlas_core.backends.base import Backend
from atlas_core.backends.kv_dtypes import KVCacheDtype
from atlas_core.engine.spec.config import SpeculativeConfig, speculative_config
from atlas_core.errors import ConfigError
from atlas_core.model.load import LoadFormat
from atlas_core.options.declare import check_choices, option, options_of
from atlas_core.parallel.settings import Launcher, ReplicaSettings

DEFAULT_MAX_SEQ_LEN = 8192
HOST_KV_CACHE_GIB = 1.0
"""The KV cache of host (CPU) backends when ``kv_cache_memory_gib`` is not set."""

SchedulingPolicy = Literal["fifo", "slo"]
GGUFWeights = Literal["auto", "quantized", "float"]
PreemptionMode = Literal["swap", "recompute"]


@dataclass(frozen=True)
class ModelChoice:
    """Which model to run, and on which backend (`LLM`'s ``model`` and ``backend`` arguments)."""

    model: str | None = option(
        None,
        positional=True,
        help="model folder, .gguf file or Hugging Face repo id",
        default_help="the built-in SmolLM2-135M-Instruct",
    )
    backend: str | None = option(None, help="backend name", default_help="the best available; see `atlas plugins`")


@dataclass
class EngineConfig:
    """Engine limits and policies; fields declared with `option` are also flags and ``ATLAS_*``
    variables of the commands that load a model.

    ``max_seq_len`` None means the model's context length, capped at ``default_max_seq_len``.
    The KV cache gets ``kv_cache_memory_gib`` when it is set; otherwise ``gpu_memory_utilization`` of
    the device's memory on device backends (what the weights and other allocations already use is
    subtracted), or `HOST_KV_CACHE_GIB` on host backends. ``max_prefill_tokens`` None means
    ``max_num_batched_tokens``, whose None means the backend's `Backend.default_token_budget` (the engine's copy of
    the config holds it). ``max_state_snapshots`` (hybrid recurrent models with prefix caching:
    how many saved recurrent states back cached prefixes) None means ``max_num_seqs``. ``kv_cache_dtype``
    names the KV storage (`atlas_core.backends.kv_dtypes`); the engine refuses one its backend does not hold.
    Construction checks every value (`ConfigError`).
    """

    max_seq_len: int | None = option(
        None,
        help="longest prompt + completion",
        default_help=f"the model's context, at most {DEFAULT_MAX_SEQ_LEN}",
        aliases=("max-model-len",),
    )
    default_max_seq_len: int = DEFAULT_MAX_SEQ_LEN
    max_num_seqs: int = option(64, help="most sequences in one batch")
    max_num_batched_tokens: int | None = option(
        None,
        help="token budget of one forward step (an image that attends to itself, as Gemma 3 / 4's do, is never cut: "
        "a step that starts one takes all of it)",
        default_help="the backend's: 8192 on Hopper GPUs of at least 70 GiB, else 2048",
    )
    max_prefill_tokens: int | None = option(
        None, help="largest prefill chunk of one sequence per step", default_help="--max-num-batched-tokens"
    )
    block_size: int = 16
    batch_invariant: bool = option(
        False,
        help="keep every sequence's arithmetic independent of the batch (greedy tokens identical alone or batched, "
        "chunked or not) at some cost in prefill speed on GPUs",
    )
    enable_prefix_caching: bool = option(True, help="reuse the KV of shared prompt prefixes")
    scheduling_policy: SchedulingPolicy = option(
        "fifo", help="fifo: arrival order; slo: shortest prompt first, decode-only steps near the TBT deadline"
    )
    tbt_slo_ms: float = 100.0
    gpu_memory_utilization: float = option(0.9, help="fraction of GPU memory the engine may use, KV cache included")
    kv_cache_memory_gib: float | None = option(
        None,
        help="KV cache size in GiB, on any backend (on a GPU it replaces the --gpu-memory-utilization sizing)",
        default_help=f"{HOST_KV_CACHE_GIB:g} on CPU backends; on GPUs what --gpu-memory-utilization leaves",
    )
    kv_cache_dtype: KVCacheDtype = option(
        "auto",
        help="KV cache storage: auto (the backend's activation dtype), bf16, or fp8 (E4M3 with a scale per layer "
        "for K and for V: the checkpoint's, else 1.0)",
    )
    kv_high_precision_layers: list[str] = option(
        default_factory=list,
        metavar="N,...",
        help="with --kv-cache-dtype fp8: KV layers kept in the activation dtype, by index (the model's attention "
        "layers that keep their own K and V, in order from 0; MTP layers after them), e.g. the first and last "
        "layers, where fp8 costs the most accuracy",
        default_help="none",
    )
    kv_cache_scales: str | None = option(
        None,
        metavar="PATH",
        help="with --kv-cache-dtype fp8: a JSON file of per-layer K and V scales written by `atlas calibrate-kv`, "
        "used instead of the checkpoint's (or 1.0)",
        default_help="the checkpoint's scales, else 1.0",
    )
    gguf_weights: GGUFWeights = option(
        "auto",
        help="GGUF block-quantized weights: quantized (kept in their blocks, about the file's size; the NumPy "
        "backend dequantizes them on use, slower), float (dequantized at load: faster, several times the file), "
        "auto (quantized when the float copy would take more than half of the free memory)",
    )
    load_format: LoadFormat = option(
        "auto",
        help="how weights are read: auto (from the checkpoint) or dummy (random values in the shapes of MODEL's "
        "config.json, no weight file read: for benchmarks and for trying a shape before downloading it)",
    )
    max_state_snapshots: int | None = option(
        None,
        help="hybrid recurrent models: saved recurrent states backing the prefix cache",
        default_help="--max-num-seqs; 0 turns prefix reuse off for them",
    )

    speculative_config: dict[str, Any] | None = option(
        None,
        metavar="JSON",
        help='speculative decoding, vLLM\'s names: {"method": "ngram", "num_speculative_tokens": 4} (prompt lookup; '
        '"prompt_lookup_min"/"prompt_lookup_max" set the n-gram sizes, default 2 and 4), {"method": "mtp", '
        '"num_speculative_tokens": 2} (the checkpoint\'s multi-token-prediction layers: Qwen3-Next, Qwen3.5/3.6) or '
        '{"method": "draft_model", "model": "PATH_OR_REPO", "num_speculative_tokens": 4}',
        default_help="off",
    )
    num_speculative_tokens: int | None = option(
        None,
        help="draft tokens verified per step: alone, n-gram speculation with that many tokens; with "
        "--speculative-config, its num_speculative_tokens",
        default_help="off",
    )

    preemption_mode: PreemptionMode | None = option(
        None,
        help="swap: a preempted sequence's KV (and recurrent state) moves to the storage tiers and comes back; "
        "recompute: it is recomputed from its tokens",
        default_help="swap where a storage tier has room, else recompute",
    )
    swap_space_gb: float = option(
        0.0, help="host-memory KV tier for swapped sequences and spilled prefix-cache blocks, GiB (0: none)"
    )
    kv_spill_dir: str | None = option(
        None,
        help="directory of the NVMe KV tier below host memory (the atlas-storage-nvme plugin); owned by this "
        "engine alone",
        default_help="none",
    )
    kv_spill_gb: float = option(16.0, help="size of the NVMe KV tier in --kv-spill-dir, GiB")
    kv_spill_persist: bool = option(
        False, help="keep the NVMe tier's prefix-cache blocks across restarts of the same model"
    )

    tensor_parallel_size: int = option(
        1,
        help="ranks (one process each, one GPU each on device backends) that split attention heads, dense layers "
        "and the vocabulary; on one host Atlas starts the other ranks itself",
    )
    expert_parallel_size: int = option(
        1,
        help="groups of ranks that split a MoE model's routed experts: divides --tensor-parallel-size, or alone "
        "(with a tensor-parallel size of 1) runs that many ranks, each holding the whole attention",
    )
    comm_backend: str | None = option(
        None, help="collectives between ranks (see `atlas plugins`)", default_help="cpu on the numpy backend, else nccl"
    )
    comm_timeout: float = option(
        300.0, help="seconds a rank may wait for another (to start, or inside a collective) before the replica fails"
    )
    rank: int | None = option(
        None,
        help="ranks started by hand, one command per rank on one or several hosts: this process's rank (0 serves, "
        "the others work for it); with --world-size, --master-addr and --master-port",
        default_help="one host: Atlas starts ranks 1.. itself",
    )
    world_size: int | None = option(
        None,
        help="with --rank: the number of ranks",
        default_help="max(--tensor-parallel-size, --expert-parallel-size)",
    )
    master_addr: str = option("127.0.0.1", help="address rank 0 listens on for the other ranks")
    master_port: int | None = option(
        None, help="port rank 0 listens on for the other ranks", default_help="29500 with --rank, else a free port"
    )
    distributed_executor_backend: Launcher = option(
        "mp",
        help="how rank 0 starts ranks 1..: mp, processes of this host; ray, actors of a Ray cluster, one GPU each "
        "(the atlas-core[ray] extra)",
    )
    ray_address: str = option(
        "auto",
        help="with --distributed-executor-backend ray: the cluster to use; auto: the running one (RAY_ADDRESS, or "
        "the one `ray start` runs on this host), else a new local one; local: a new local one; else a cluster "
        "address (host:port or ray://host:port)",
    )

    def __post_init__(self) -> None:
        check_choices(self)
        self.speculation: SpeculativeConfig | None = speculative_config(
            self.speculative_config, self.num_speculative_tokens
        )
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_prefill_tokens is not None and self.max_prefill_tokens < 1:
            raise ConfigError(f"max_prefill_tokens must be at least 1, got {self.max_prefill_tokens}")
        if self.max_state_snapshots is not None and self.max_state_snapshots < 0:
            raise ConfigError(f"max_state_snapshots must be at least 0, got {self.max_state_snapshots}")
        if self.max_seq_len is not None and self.max_seq_len < 2:
            raise ConfigError(f"max_seq_len must be at least 2, got {self.max_seq_len}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory_gib is not None and self.kv_cache_memory_gib <= 0:
            raise ConfigError(f"kv_cache_memory_gib must be positive, got {self.kv_cache_memory_gib}")
        if self.swap_space_gb < 0:
            raise ConfigError(f"swap_space_gb must be at least 0, got {self.swap_space_gb}")
        if self.kv_spill_gb <= 0:
            raise ConfigError(f"kv_spill_gb must be positive, got {self.kv_spill_gb}")
        self.replica_settings()  # parallel settings that do not compose are refused now
        if self.preemption_mode == "swap" and not self.swap_space_gb and self.kv_spill_dir is None:
            raise ConfigError(
                "preemption_mode=swap needs a storage tier: set swap_space_gb (host memory) or kv_spill_dir (NVMe)"
            )

    def replica_settings(self) -> ReplicaSettings:
        """The parallel settings, and the load settings every rank of a split model must share."""
        return ReplicaSettings(
            tensor_parallel_size=self.tensor_parallel_size,
            expert_parallel_size=self.expert_parallel_size,
            comm_backend=self.comm_backend,
            comm_timeout=self.comm_timeout,
            rank=self.rank,
            world_size=self.world_size,
            master_addr=self.master_addr,
            master_port=self.master_port,
            distributed_executor_backend=self.distributed_executor_backend,
            ray_address=self.ray_address,
            max_seq_len=self.max_seq_len,
            default_max_seq_len=self.default_max_seq_len,
            gguf_weights=self.gguf_weights,
            load_format=self.load_format,
            batch_invariant=self.batch_invariant,
        )


ENGINE_OPTIONS = options_of(ModelChoice, EngineConfig)
"""The settings of every command that loads a model; their values by name are `LLM`'s arguments."""


class KVBudget(NamedTuple):
    """The bytes the KV cache may take (negative when the memory in use exceeds the share it comes from), a phrase
    naming where that number comes from, and ``more(extra)``: the setting that gives ``extra`` bytes more, as
    ``name=value`` (None when no value of it can)."""

    bytes: int
    source: str
    more: Callable[[int], str | None]


def setting_value(least: float, most: float | None = None) -> str | None:
    """The decimal, in hundredths where one fits (else in finer steps), of at least ``least`` and at most ``most``,
    as a setting's value; None when none is."""
    for digits in (2, 4, 6):
        scale = 10**digits
        value = math.ceil(least * scale * (1 - 1e-15)) / scale  # 0.31 stays 0.31 despite 0.31 * 100's rounding
        if most is None or value <= most:
            return f"{value:.{digits}f}".rstrip("0").rstrip(".")
    return None


def kv_budget(backend: Backend, config: EngineConfig) -> KVBudget:
    """The KV cache's budget under ``config`` on ``backend``: ``kv_cache_memory_gib`` when set, else
    ``gpu_memory_utilization`` of a device's memory less what is in use, else the host backends' default."""
    memory = backend.device_memory()
    if config.kv_cache_memory_gib is not None or memory is None:
        gib = HOST_KV_CACHE_GIB if config.kv_cache_memory_gib is None else config.kv_cache_memory_gib
        budget = int(gib * 2**30)
        if memory is not None and budget > memory[0]:
            raise ConfigError(
                f"kv_cache_memory_gib={gib:g} is more than the {memory[0] / 2**30:.2f} GiB "
                "free on the device after loading the model: lower it, or leave it unset to size the KV cache by "
                "gpu_memory_utilization"
            )

        def more_gib(extra: int) -> str | None:
            value = setting_value((budget + extra) / 2**30, None if memory is None else memory[0] / 2**30)
            return None if value is None else f"kv_cache_memory_gib={value}"

        default = config.kv_cache_memory_gib is None
        source = f"the host backends' default KV cache of {gib:g} GiB" if default else f"kv_cache_memory_gib={gib:g}"
        return KVBudget(budget, source, more_gib)
    free, total = memory
    share = config.gpu_memory_utilization

    def more_share(extra: int) -> str | None:
        value = setting_value(share + (extra + 1) / total, 1.0)  # a byte more: the budget's int() floors
        return None if value is None else f"gpu_memory_utilization={value}"

    source = (
        f"gpu_memory_utilization={share:g} of {total / 2**30:.1f} GiB minus {(total - free) / 2**30:.1f} GiB in use"
    )
    return KVBudget(int(total * share) - (total - free), source, more_share)
