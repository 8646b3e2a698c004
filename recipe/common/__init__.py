"""Run plumbing that both engines use and neither owns: the run directory's lock (:mod:`recipe.common.rundir`)."""
