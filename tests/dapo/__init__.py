"""Tests of ``dapo/``, the engine-free core: loss and loss modes, reward, sampling, settings, metrics, advantage
shaping, and their parity with verl's own functions."""
