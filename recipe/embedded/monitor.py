"""Where the metrics go: ``metrics.jsonl`` in the run directory, W&B (verl's names), a tqdm bar, PNG plots.

W&B is optional and never fatal: with no credentials (``WANDB_API_KEY`` unset and no ``api.wandb.ai`` entry in
``~/.netrc``) it runs offline and says how to upload afterwards; an explicit ``WANDB_MODE`` is respected. Online,
the wait is bounded and stated: the server (``WANDB_BASE_URL``, default ``https://api.wandb.ai``) must accept a
connection within :data:`recipe.common.tracking.WANDB_CONNECT_TIMEOUT_S` seconds and ``wandb.init`` finish within
:data:`WANDB_INIT_TIMEOUT_S`; otherwise the run logs offline (``wandb sync`` uploads it later). If that fails too,
or ``wandb.log`` fails, training goes on without W&B after one warning.
"""

from __future__ import annotations

import logging
import math
import os
import uuid
from pathlib import Path

from recipe.common.metrics_file import METRICS_FILE, metrics_line, read_records
from recipe.common.tracking import WANDB_INIT_TIMEOUT_S, offline_reason
from recipe.embedded.config import VERL_LOGGERS

logger = logging.getLogger(__name__)

PLOTS = {  # file name -> (title, [(y-axis label, metric names drawn), ...]: one panel each, sharing the step axis)
    "reward_accuracy.png": (
        "reward and accuracy",
        [
            ("score, -1 wrong / +1 right (-1 to 1)", ("critic/score/mean",)),
            ("accuracy, fraction right (0 to 1)", ("train/acc/mean", "val-core/*")),
        ],
    ),
    "entropy.png": ("policy entropy", [("entropy (nats per token)", ("actor/entropy",))]),
    "response_length.png": ("response length", [("length (tokens)", ("response_length/mean", "response_length/max"))]),
    "truncation_clipping.png": (
        "overlong responses and clipped tokens",
        [
            ("fraction of responses (0 to 1)", ("dapo/overlong_frac", "response_length/clip_ratio")),
            (
                "fraction of tokens clipped (0 to 1)",
                ("dapo/clipfrac_high", "dapo/clipfrac_low", "actor/dapo/clipfrac_*"),
            ),
        ],
    ),
    "kept_group_frac.png": (
        "dynamic sampling: kept-group fraction",
        [
            ("kept groups / generated groups (0 to 1)", ("dapo/kept_group_frac",)),
        ],
    ),
}


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl``, each flat (:func:`recipe.common.metrics_file.read_records`)."""
    return read_records(run_dir / METRICS_FILE)


class Monitor:
    """Metric sinks for one run. ``start_step``: records after it (from a killed run) are dropped on resume."""

    def __init__(
        self,
        run_dir: Path,
        *,
        loggers,
        project: str,
        experiment: str,
        config: dict,
        start_step: int,
        total_steps: int,
        progress_bar: bool,
        wandb_id: str | None,
    ) -> None:
        self.run_dir = run_dir
        self.path = run_dir / METRICS_FILE
        kept = [r for r in read_metrics(run_dir) if r.get("step", 0) <= start_step] if start_step > 0 else []
        self.path.write_text(
            "".join(metrics_line(r["step"], {k: v for k, v in r.items() if k != "step"}) for r in kept)
        )
        self._wandb = None
        self.wandb_id = wandb_id
        self.wandb_dir: Path | None = None
        if "wandb" in loggers:
            self._init_wandb(project, experiment, config)
        self._verl = None  # verl's Tracking for the other backends (tensorboard, mlflow, ...)
        others = [name for name in loggers if name in VERL_LOGGERS]
        if others:
            from verl.utils.tracking import Tracking

            os.environ.setdefault("TENSORBOARD_DIR", str(run_dir / "tensorboard"))
            self._verl = Tracking(
                project_name=project, experiment_name=experiment, default_backend=others, config=config
            )
        self._bar = None
        if progress_bar and "console" in loggers:
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="dapo", unit="step", dynamic_ncols=True)

    def _init_wandb(self, project: str, experiment: str, config: dict) -> None:
        try:
            import wandb

            why_offline = offline_reason(["wandb"], start_timeout_s=WANDB_INIT_TIMEOUT_S)  # the verl driver's rule
            offline = why_offline is not None
            if self.wandb_id is None:
                self.wandb_id = uuid.uuid4().hex[:12]
            kwargs = dict(
                project=project, name=experiment, id=self.wandb_id, resume="allow", dir=str(self.run_dir), config=config
            )
            try:
                self._wandb = wandb.init(
                    **kwargs,
                    mode="offline" if offline else None,
                    settings=wandb.Settings(init_timeout=WANDB_INIT_TIMEOUT_S),
                )
            except Exception as err:  # noqa: BLE001 - an online start that failed: offline instead
                if offline:
                    raise
                offline, why_offline = True, f"wandb.init failed online: {type(err).__name__}: {err}"
                self._wandb = wandb.init(**kwargs, mode="offline")
            self.wandb_dir = Path(self._wandb.dir).parent
            if offline or os.environ.get("WANDB_MODE") == "offline":
                print(
                    f"W&B is offline ({why_offline or 'WANDB_MODE=offline'}); upload the run later with: "
                    f"wandb sync {self.wandb_dir}"
                )
        except Exception as err:  # noqa: BLE001 - an unreachable W&B must never stop training
            logger.warning("W&B disabled, training goes on without it: %s", err)
            print(f"warning: W&B disabled ({type(err).__name__}: {err}); metrics still go to {self.path}")
            self._wandb = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(metrics_line(step, {k: _plain(v) for k, v in metrics.items()}))
        if self._wandb is not None:
            try:
                self._wandb.log(metrics, step=step)
            except Exception as err:  # noqa: BLE001
                logger.warning("W&B log failed, W&B disabled for the rest of the run: %s", err)
                self._wandb = None
        if self._verl is not None:
            self._verl.log(data={k: v for k, v in metrics.items() if _plain(v) is not None}, step=step)

    def progress(self, step: int, metrics: dict[str, float]) -> None:
        if self._bar is None:
            return
        shown = {
            "acc": "train/acc/mean",
            "score": "critic/score/mean",
            "kept": "dapo/kept_group_frac",
            "len": "response_length/mean",
            "ent": "actor/entropy",
            "clip": "actor/pg_clipfrac",
        }
        self._bar.set_postfix({k: f"{metrics[m]:.3g}" for k, m in shown.items() if m in metrics}, refresh=False)
        self._bar.update(step - self._bar.n)

    def write(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text)

    def close(self, exit_code: int = 0) -> None:
        """Close the progress bar and finish the W&B run (``exit_code`` 1: marked failed); closing twice is a no-op."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._wandb is not None:
            try:
                self._wandb.finish(exit_code=exit_code)
            except Exception as err:  # noqa: BLE001
                logger.warning("W&B finish failed: %s", err)
            self._wandb = None
        if self._verl is not None:
            self._verl.finish(exit_code=exit_code)
            self._verl = None


def _plain(value):
    value = float(value)
    return None if math.isnan(value) else value


def write_plots(run_dir: Path, keep_figures: bool = False):
    """One PNG per entry of ``PLOTS`` under ``run_dir/plots`` from the full ``metrics.jsonl`` history: the paths, or
    with ``keep_figures`` ``{path: matplotlib figure}`` (left open, for inspection)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    written = {}
    for file_name, (title, panels) in PLOTS.items():
        fig, axes = plt.subplots(len(panels), 1, figsize=(6, 2.2 + 1.8 * len(panels)), sharex=True, squeeze=False)
        for ax, (ylabel, patterns) in zip(axes[:, 0], panels):
            names = sorted({k for r in records for k in r if any(_matches(k, p) for p in patterns)})
            for name in names:
                points = [(r["step"], r[name]) for r in records if r.get(name) is not None]
                if points:
                    steps, values = zip(*points)
                    ax.plot(steps, values, marker="o" if name.startswith("val") else None, markersize=3, label=name)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
            if names:
                ax.legend(fontsize=7)
        axes[0, 0].set_title(title)
        fig.tight_layout()
        path = out_dir / file_name
        fig.savefig(path, dpi=110)
        if keep_figures:
            written[path] = fig
        else:
            plt.close(fig)
            written[path] = None
    return written if keep_figures else list(written)


def _matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern
