"""Benchmarks: each script states its method and prints its figures beside a same-run
reference. Run one from the repository root as ``python -m bench.NAME``; what they share is in
:mod:`bench.common`."""
