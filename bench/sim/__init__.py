"""Simulations that need no model: dynamic sampling's round-sizing policies (``sampling``) and verl's three
training loops for the 32B job (``async_loops``)."""
