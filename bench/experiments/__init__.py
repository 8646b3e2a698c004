"""Reports over training runs: the paper's Table 1 at small scale (``ablation``, its start model:
``ablation_start``), a paired evaluation of checkpoints (``paired_eval``) and the real-model run's report
(``real_model``)."""
