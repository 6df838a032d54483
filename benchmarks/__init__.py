"""Benchmark and load scripts (run each as ``python benchmarks/NAME.py``; see
docs/benchmarks.md). A package so the test suite and the docs build can import the
reusable cores (``benchmarks.soak``, ``benchmarks.fuzz``, ``benchmarks.plot``)."""
