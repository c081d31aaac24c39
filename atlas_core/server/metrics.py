"""Prometheus metrics of one server (``GET /metrics``), in their own registry.

Request and token counters and the latency histograms are updated as requests run; engine gauges
(running and waiting sequences, KV usage, prefix-cache hit rate) are read from the engine when
scraped. Every metric carries a ``model_name`` label (the served model's reported name, "" while
it is not known yet). Names are listed in ``docs/server.md``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.engine.outputs import RequestOutput
from atlas_core.server.access_log import current_usage

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
)


class _EngineCollector(Collector):
    """Gauges read from a live `LLMEngine` at scrape time (reads only; values may be one step old)."""

    def __init__(self, engine: LLMEngine, model_name: Callable[[], str]) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        scheduler, blocks = self.engine.scheduler, self.engine.blocks
        used = 1.0 - blocks.num_free_blocks / blocks.num_blocks if blocks.num_blocks else 0.0
        gauges = [
            ("atlas_num_sequences_running", "Sequences holding KV blocks", len(scheduler.running)),
            ("atlas_num_sequences_waiting", "Sequences queued for admission", len(scheduler.waiting)),
            ("atlas_kv_cache_usage_ratio", "Fraction of KV blocks referenced by sequences", used),
            ("atlas_kv_cache_capacity_tokens", "Tokens the KV cache holds", self.engine.kv_capacity_tokens),
            (
                "atlas_prefix_cache_hit_rate",
                "Prompt tokens served from the prefix cache over prompt tokens looked up",
                blocks.hit_rate,
            ),
        ]
        counters = [
            (
                "atlas_prefix_cache_queried_tokens",
                "Prompt tokens looked up in the prefix cache",
                blocks.prefix_cache_queried_tokens,
            ),
            (
                "atlas_prefix_cache_hit_tokens",
                "Prompt tokens served from the prefix cache",
                blocks.prefix_cache_hit_tokens,
            ),
        ]
        spec = self.engine.runner.spec_stats
        counters += [
            ("atlas_spec_decode_num_draft_tokens", "Speculative draft tokens proposed", spec.proposed),
            ("atlas_spec_decode_num_accepted_tokens", "Speculative draft tokens accepted", spec.accepted),
        ]
        counters += _offload_counters(self.engine)
        labels = [self.model_name()]
        if spec.proposed_at:
            per_position = CounterMetricFamily(
                "atlas_spec_decode_num_accepted_tokens_per_pos",
                "Speculative draft tokens accepted, by position in the draft (0 = first)",
                labels=["model_name", "position"],
            )
            for position, accepted in enumerate(spec.accepted_at):
                per_position.add_metric([*labels, str(position)], accepted)
            yield per_position
        for name, documentation, value in gauges:
            gauge = GaugeMetricFamily(name, documentation, labels=["model_name"])
            gauge.add_metric(labels, value)
            yield gauge
        for name, documentation, value in counters:
            counter = CounterMetricFamily(name, documentation, labels=["model_name"])
            counter.add_metric(labels, value)
            yield counter


def _offload_counters(engine: LLMEngine) -> list[tuple[str, str, int]]:
    """Counters of the KV storage tiers (none without tiers): spilled prefix hits, swaps."""
    offload = engine.offload
    if offload is None:
        return []
    return [
        (
            "atlas_kv_spill_hit_tokens",
            "Prompt tokens loaded from the KV storage tiers (prefix-cache blocks spilled from the device)",
            offload.spill_hit_tokens,
        ),
        ("atlas_kv_swap_out_sequences", "Preempted sequences whose KV was swapped out", offload.swap_outs),
        ("atlas_kv_swap_in_sequences", "Swapped-out sequences whose KV was loaded back", offload.swap_ins),
        (
            "atlas_kv_swap_lost_sequences",
            "Swapped-out sequences recomputed because a stored block was lost",
            offload.swap_lost,
        ),
    ]


class ServerMetrics:
    """The metrics of one server; `render` gives the Prometheus text format. ``model_name`` gives
    the value of every metric's ``model_name`` label (read when a metric is updated or scraped)."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, model_name: Callable[[], str] = str) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "atlas_http_requests", "HTTP requests answered", ["route", "method", "status", "model_name"], registry=r
        )
        self._prompt_tokens = Counter(
            "atlas_prompt_tokens", "Prompt tokens of admitted requests", ["model_name"], registry=r
        )
        self._generation_tokens = Counter("atlas_generation_tokens", "Tokens generated", ["model_name"], registry=r)
        self._requests_finished = Counter(
            "atlas_requests_finished",
            "Generation requests finished, by reason",
            ["finish_reason", "model_name"],
            registry=r,
        )
        self._ttft = Histogram(
            "atlas_time_to_first_token_seconds",
            "Arrival to first generated token",
            ["model_name"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._itl = Histogram(
            "atlas_inter_token_latency_seconds",
            "Time between consecutive tokens of a completion",
            ["model_name"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._e2e = Histogram(
            "atlas_e2e_request_latency_seconds",
            "Arrival to last token",
            ["model_name"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._engine: _EngineCollector | None = None

    def count_http(self, route: str, method: str, status: int) -> None:
        """One answered HTTP request."""
        self.http_requests.labels(route, method, str(status), self.model_name()).inc()

    @property
    def prompt_tokens(self) -> Counter:
        return self._prompt_tokens.labels(self.model_name())

    @property
    def generation_tokens(self) -> Counter:
        return self._generation_tokens.labels(self.model_name())

    def requests_finished(self, finish_reason: str) -> Counter:
        return self._requests_finished.labels(finish_reason, self.model_name())

    @property
    def ttft(self) -> Histogram:
        return self._ttft.labels(self.model_name())

    @property
    def itl(self) -> Histogram:
        return self._itl.labels(self.model_name())

    @property
    def e2e(self) -> Histogram:
        return self._e2e.labels(self.model_name())

    def watch_engine(self, engine: LLMEngine) -> None:
        if self._engine is not None:
            self.registry.unregister(self._engine)
        self._engine = _EngineCollector(engine, self.model_name)
        self.registry.register(self._engine)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def track(self, num_prompt_tokens: int) -> RequestTracker:
        self.prompt_tokens.inc(num_prompt_tokens)
        return RequestTracker(self, num_prompt_tokens)


class RequestTracker:
    """Latency and token accounting of one generation request, fed every `RequestOutput`.

    Time to first token and inter-token latency follow completion 0 (the others of ``n > 1``
    advance in the same steps); generated tokens count every completion. The HTTP request's
    `RequestUsage` (the access log's) receives the same token counts."""

    def __init__(self, metrics: ServerMetrics, num_prompt_tokens: int = 0) -> None:
        self.metrics = metrics
        self.usage = current_usage()
        if self.usage is not None:
            self.usage.prompt_tokens += num_prompt_tokens
        self.start = self.last = time.monotonic()
        self.tokens = 0
        self.lead_tokens = 0
        self.finish_reason: str | None = None

    def observe(self, output: RequestOutput) -> None:
        now = time.monotonic()
        counts = [len(c.token_ids) for c in output.outputs]
        if sum(counts) > self.tokens:
            self.metrics.generation_tokens.inc(sum(counts) - self.tokens)
            if self.usage is not None:
                self.usage.completion_tokens += sum(counts) - self.tokens
            self.tokens = sum(counts)
        lead_new = counts[0] - self.lead_tokens
        if lead_new > 0:
            if self.lead_tokens == 0:
                self.metrics.ttft.observe(now - self.start)
            else:
                gap = (now - self.last) / lead_new
                for _ in range(lead_new):
                    self.metrics.itl.observe(gap)
            self.lead_tokens, self.last = counts[0], now
        if output.finished:
            self.finish_reason = "error" if output.error else output.outputs[0].finish_reason

    def done(self) -> None:
        """The request is over (finished, failed, timed out or cancelled: the latter count as ``abort``)."""
        self.metrics.requests_finished(self.finish_reason or "abort").inc()
        self.metrics.e2e.observe(time.monotonic() - self.start)


def route_label(scope: dict[str, Any]) -> str:
    """The route template of a routed request (``/v1/models/{model_id:str}``), for labels."""
    handler = scope.get("route_handler")
    paths = getattr(handler, "paths", None)
    return sorted(paths)[0] if paths else "unmatched"
