"""The guard that stops an embedded run which has stopped learning: a step whose every optimizer update was
skipped for a non-finite loss or gradient stops the run, and so does a run that ends having applied no update;
neither exits 0 after training nothing. Each is a :class:`~dapo.settings.ConfigError` naming the learning rate."""

from __future__ import annotations

from dapo.settings import ConfigError


class UpdateGuard:
    """Counts optimizer updates applied and skipped (non-finite gradient norm); :meth:`end_step` stops a run whose
    step skipped every update, :meth:`end_run` one that ends having applied none."""

    def __init__(self) -> None:
        self.applied = self.skipped = 0
        self._step_applied = self._step_skipped = 0

    def record(self, applied: bool) -> None:
        if applied:
            self.applied, self._step_applied = self.applied + 1, self._step_applied + 1
        else:
            self.skipped, self._step_skipped = self.skipped + 1, self._step_skipped + 1

    def end_step(self, step: int, lr_key: str = "actor_rollout_ref.actor.optim.lr") -> None:
        applied, skipped = self._step_applied, self._step_skipped
        self._step_applied = self._step_skipped = 0
        if skipped and not applied:
            raise ConfigError(
                f"step {step}: all {skipped} policy updates were skipped for a non-finite loss or gradient norm, so "
                f"the policy no longer trains. Rewards were finite (they are checked), so the model diverged: lower "
                f"{lr_key}, or resume from the last checkpoint with embedded.dtype=float32"
            )

    @staticmethod
    def diverged(err: RuntimeError, step: int, lr_key: str = "actor_rollout_ref.actor.optim.lr") -> Exception:
        """The error to raise for ``err`` from inside a step: sampling from a policy whose weights have diverged
        fails in ``torch.multinomial`` with a message about ``inf``/``nan``; that becomes a one-line error naming
        the learning rate, any other error is returned unchanged."""
        if "inf" in str(err) and "nan" in str(err):
            return ConfigError(
                f"step {step}: the policy's probabilities are no longer finite ({err}), so its weights diverged in "
                f"an earlier update; lower {lr_key} (or actor_rollout_ref.actor.optim.clip_grad) and start over, or "
                "resume from an earlier checkpoint"
            )
        return err

    def end_run(self, steps: int) -> None:
        if steps > 0 and self.applied == 0:
            raise ConfigError(f"{steps} steps ran but no policy update was applied; the run trained nothing")
