"""DAPO (arXiv 2503.14476) as pure functions on tensors: torch and numpy only, no verl or ray import."""
