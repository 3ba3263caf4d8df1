"""Tests of autockpt_bench: the study, the benchmarks and the demos."""
