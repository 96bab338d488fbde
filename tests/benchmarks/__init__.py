"""Tests of the benchmarks' own logic (benchmarks/), on the CPU."""
