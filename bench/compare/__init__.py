"""Whole training runs against a peer, side by side in one run: TRL's ``GRPOTrainer`` (``trl_grpo``, its worker
``trl_peer``), the verl engine on a CPU against the embedded one (``engines``), our sampler against verl's V1 filter
(``sampling_verl``) and DAPO in verl's three loops (``async_modes``)."""
