"""Tests of ``bench/``: the benchmarks and the ablation (what they compose, their arithmetic, the quick paths);
nothing here is timed."""
