"""Prometheus metrics of one server (``GET /metrics``), in their own registry.

Request and token counters and the latency histograms are updated as requests run; engine gauges
(running and waiting sequences, KV usage, prefix-cache hit rate) are read from the engine when
scraped. Names are listed in ``docs/server.md``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from atlas_core.engine.llm_engine import LLMEngine
from atlas_core.engine.outputs import RequestOutput

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

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        scheduler, blocks = self.engine.scheduler, self.engine.blocks
        yield GaugeMetricFamily(
            "atlas_num_sequences_running", "Sequences holding KV blocks", value=len(scheduler.running)
        )
        yield GaugeMetricFamily(
            "atlas_num_sequences_waiting", "Sequences queued for admission", value=len(scheduler.waiting)
        )
        used = 1.0 - blocks.num_free_blocks / blocks.num_blocks if blocks.num_blocks else 0.0
        yield GaugeMetricFamily(
            "atlas_kv_cache_usage_ratio", "Fraction of KV blocks referenced by sequences", value=used
        )
        yield GaugeMetricFamily(
            "atlas_kv_cache_capacity_tokens", "Tokens the KV cache holds", value=self.engine.kv_capacity_tokens
        )
        yield GaugeMetricFamily(
            "atlas_prefix_cache_hit_rate",
            "Prompt tokens served from the prefix cache over prompt tokens looked up",
            value=blocks.hit_rate,
        )
        yield CounterMetricFamily(
            "atlas_prefix_cache_queried_tokens",
            "Prompt tokens looked up in the prefix cache",
            value=blocks.prefix_cache_queried_tokens,
        )
        yield CounterMetricFamily(
            "atlas_prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache",
            value=blocks.prefix_cache_hit_tokens,
        )


class ServerMetrics:
    """The metrics of one server; `render` gives the Prometheus text format."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "atlas_http_requests", "HTTP requests answered", ["route", "method", "status"], registry=r
        )
        self.prompt_tokens = Counter("atlas_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter("atlas_generation_tokens", "Tokens generated", registry=r)
        self.requests_finished = Counter(
            "atlas_requests_finished", "Generation requests finished, by reason", ["finish_reason"], registry=r
        )
        self.ttft = Histogram(
            "atlas_time_to_first_token_seconds",
            "Arrival to first generated token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "atlas_inter_token_latency_seconds",
            "Time between consecutive tokens of a completion",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "atlas_e2e_request_latency_seconds", "Arrival to last token", buckets=_LATENCY_BUCKETS, registry=r
        )
        self._engine: _EngineCollector | None = None

    def watch_engine(self, engine: LLMEngine) -> None:
        if self._engine is not None:
            self.registry.unregister(self._engine)
        self._engine = _EngineCollector(engine)
        self.registry.register(self._engine)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def track(self, num_prompt_tokens: int) -> RequestTracker:
        self.prompt_tokens.inc(num_prompt_tokens)
        return RequestTracker(self)


class RequestTracker:
    """Latency and token accounting of one generation request, fed every `RequestOutput`.

    Time to first token and inter-token latency follow completion 0 (the others of ``n > 1``
    advance in the same steps); generated tokens count every completion."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.start = self.last = time.monotonic()
        self.tokens = 0
        self.lead_tokens = 0
        self.finish_reason: str | None = None

    def observe(self, output: RequestOutput) -> None:
        now = time.monotonic()
        counts = [len(c.token_ids) for c in output.outputs]
        if sum(counts) > self.tokens:
            self.metrics.generation_tokens.inc(sum(counts) - self.tokens)
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
        self.metrics.requests_finished.labels(self.finish_reason or "abort").inc()
        self.metrics.e2e.observe(time.monotonic() - self.start)


def route_label(scope: dict[str, Any]) -> str:
    """The route template of a routed request (``/v1/models/{model_id:str}``), for labels."""
    handler = scope.get("route_handler")
    paths = getattr(handler, "paths", None)
    return sorted(paths)[0] if paths else "unmatched"
