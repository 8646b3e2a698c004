"""Tests of ``recipe/embedded``, the embedded engine."""
