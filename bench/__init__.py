"""Nodus benchmarks: each one is a ratio against a baseline run in the same process and the same run."""
