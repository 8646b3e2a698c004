"""Run plumbing that both engines use and neither owns: ``checks`` (data files, reward functions, checked before
any expensive work), ``identity`` (which run a checkpoint belongs to), ``rundir`` (one run per directory, errors
that stop a run), ``tracking`` (W&B with a bounded wait), ``integrity`` (is a checkpoint's file whole)."""
