"""Benchmarks of sandbox_rt vs the raw engine and tools: ``python -m benchmarks`` (docs/benchmarks.md)."""
