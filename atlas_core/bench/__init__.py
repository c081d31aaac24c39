"""``atlas bench``: latency and throughput benchmarks, each figure beside its roofline."""

from atlas_core.bench.cli import add_bench_parser

__all__ = ["add_bench_parser"]
