"""Tests of what both engines share (``recipe/common``, ``recipe/smollm2.py``), run on both entry points."""
