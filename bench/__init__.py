"""Benchmarks (python -m bench.<name>) and the device kit for the lent GPU machine; their results go to
docs/results/."""
