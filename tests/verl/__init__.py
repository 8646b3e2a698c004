"""Tests of ``recipe/dapo``, the verl engine."""
