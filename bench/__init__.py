"""Benchmarks of the furcate launcher; run each script directly, see BENCHMARKS.md."""
