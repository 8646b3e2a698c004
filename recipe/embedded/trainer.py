"""The embedded engine's training loop: DAPO in one process, its own decode loop over a Hugging Face model
(``recipe.embedded.decode``), the ``dapo/`` functions.

:class:`EmbeddedTrainer` has torchtune's recipe shape: :meth:`~EmbeddedTrainer.setup` (checks, run directory,
policy, data, optimizer, resume), :meth:`~EmbeddedTrainer.train` (the steps, validation, checkpoints) and
:meth:`~EmbeddedTrainer.cleanup`; :func:`run` calls the three. The policy lives in ``recipe.embedded.policy``,
validation in ``recipe.embedded.evaluation``, checkpoints and resume in ``recipe.embedded.checkpoint``.

One step (the four DAPO techniques are marked ``[DAPO n]``, numbered as in the paper's §3):

1. dynamic sampling ``[DAPO 2]``: rounds of ``data.gen_batch_size`` prompts x ``rollout.n`` responses are
   generated, scored with the DAPO scorer and length-shaped ``[DAPO 4, soft overlong punishment]``; groups whose
   accuracy is constant are dropped and rounds repeat until ``data.train_batch_size`` groups are kept
   (``dapo.sampling.BatchFiller``);
2. group-relative advantages of the shaped rewards (``dapo.advantage``);
3. the policy update: ``ppo_epochs`` passes over mini-batches of ``ppo_mini_batch_size`` prompts, each one
   AdamW step accumulated over micro-batches of ``ppo_micro_batch_size_per_gpu`` responses, with the decoupled
   clip ``[DAPO 1]`` and the token-mean loss whose normaliser is the token count of the whole mini-batch
   ``[DAPO 3]``; truncated responses are masked out of the loss ``[DAPO 4, overlong filtering]``;
4. periodic validation (mean@k at ``rollout.val_kwargs``) and atomic checkpoints.

Behaviour policy (``old_log_prob``): the log-probabilities of a group are those of the policy that generated it:
kept from the sampling pass (``algorithm.rollout_correction.bypass_mode=true``, the embedded default) or computed
once by a forward pass right after generation (``false``). For fresh groups this is verl's recomputed
``old_log_prob`` (nothing has been updated since generation): exactly when recomputed, within summation-order
rounding (measured at most 1.6e-5 in fp32) when kept from the sampling pass. With bf16 compute (``embedded.dtype``)
the sampling pass runs a bf16 copy of the policy (``Policy.sampler``, synced after every update), as verl's vLLM
serves bf16 weights to an actor that computes under mixed precision: the kept log-probs then differ from the actor's
by bf16 rounding, the rollout-training mismatch verl's bypass mode has too (``bypass_mode=false`` recomputes them
with the actor). Groups carried over from an earlier step
(``dapo.sampling.carry_over``) keep the log-probs of the older policy that sampled them, which is the correct
PPO behaviour policy: the ratio then corrects for their staleness, and the clip bounds it.

Deviations from verl, deliberate:

1. Dropout is switched off in the policy (RL practice; verl's actors run models whose dropout is already 0).
2. ``trainer.val_before_train`` is skipped when a run resumes (the validation of the checkpointed step was
   logged already). Validation draws from its own seeded RNG, so it never shifts the training RNG stream.
3. The LR schedule is verl's ``constant`` with linear warm-up stepped once per rollout step; like verl, step 0 of a
   warm-up runs at lr 0.
4. Resuming (``trainer.resume_mode=auto``) takes the newest *intact* checkpoint of *this* run: one recorded by
   another run (``run.json``, ``recipe.common.identity``) is refused, a damaged one is named and skipped, and a
   complete run says so and exits. verl resumes whatever its tracker names.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dapo.advantage import token_advantages
from dapo.loss import LOSS_MODES, aggregate_loss, masked_mean, overlong_filter_mask, truncated_responses
from dapo.metrics import (
    EntropyWatch,
    clipped_entropy_metrics,
    clipped_token_entropy,
    constant_accuracy_share,
    logprob_advantage_covariance,
    mean_metrics,
    repeat_ngram_frac,
    response_length_metrics,
)
from dapo.sampling import BatchFiller, starved_message
from dapo.shaping import overlong_penalty
from recipe.common import checks
from recipe.common.identity import run_identity
from recipe.common.rundir import lock_run_dir, unlock_run_dir
from recipe.common.watchdog import Watchdog, resume_advice
from recipe.config import EXIT_WATCHDOG, say_last
from recipe.embedded import checkpoint
from recipe.embedded.config import ConfigError, EngineConfig, ignored_verl_keys, read_config
from recipe.embedded.data import PromptSet, PromptStream, load_prompts
from recipe.embedded.decode import batched_shared_log_probs, sample, shared_prompt_log_probs
from recipe.embedded.evaluation import score_responses, val_summary, validate
from recipe.embedded.guard import UpdateGuard
from recipe.embedded.monitor import Monitor, write_plots
from recipe.embedded.policy import load_policy, policy_tokenizer
from recipe.embedded.rollout import SamplingParams, right_pad

logger = logging.getLogger(__name__)


def run(cfg: DictConfig, callbacks: Sequence[Callback] = ()) -> Path:
    """Train with DAPO as ``cfg`` says; return the run directory (metrics.jsonl, plots/, checkpoints).

    Example, the default run for two steps (what ``dapo-train trainer.total_training_steps=2`` does)::

        from recipe.config import compose
        from recipe.embedded.trainer import Callback, run

        class Print(Callback):
            def on_step_end(self, step, metrics):
                print(step, metrics["train/acc/mean"], metrics["dapo/kept_group_frac"])

        run_dir = run(compose(["trainer.total_training_steps=2"]), callbacks=[Print()])
    """
    trainer = EmbeddedTrainer(cfg, callbacks)
    try:
        if trainer.setup():
            trainer.train()
    except BaseException:
        trainer.cleanup(failed=True)  # W&B's closing lines now, before the entry point's one line
        raise
    trainer.cleanup()
    return trainer.run_dir


@dataclass
class _Round:
    """One generation round, scored and shaped: ``[B*G, ...]`` tensors, the G responses of a prompt consecutive."""

    prompts: list[torch.Tensor]  # [B] prompt token ids
    response_ids: torch.Tensor  # [B*G, T]
    response_mask: torch.Tensor  # [B*G, T]
    score: torch.Tensor  # [B*G] correctness score
    acc: torch.Tensor  # [B*G] bool accuracy
    penalty: torch.Tensor  # [B*G] soft overlong punishment (0 when off)
    truncated: torch.Tensor  # [B*G] bool: no end-of-sequence token
    rollout_log_prob: torch.Tensor  # [B*G, T] log-probs of the sampled tokens from the sampling pass
    n: int  # G

    @property
    def reward(self) -> torch.Tensor:  # [B*G] what the advantages are computed from
        return self.score + self.penalty

    def filter_values(self, metric: str) -> torch.Tensor:
        """``[B, G]`` dynamic sampling's filter metric, one of ``dapo.settings.FILTER_METRICS`` (never the shaped
        reward)."""
        return {"acc": self.acc, "score": self.score}[metric].view(-1, self.n)


@dataclass(frozen=True)
class _Responses:
    """Responses scored and shaped, with their behaviour log-probs, the G of a prompt in consecutive rows."""

    response_ids: torch.Tensor  # [rows, T]
    response_mask: torch.Tensor  # [rows, T]
    old_log_prob: torch.Tensor  # [rows, T] log-probs of the policy that sampled them
    score: torch.Tensor  # [rows] correctness score
    acc: torch.Tensor  # [rows] bool accuracy
    penalty: torch.Tensor  # [rows] soft overlong punishment (0 when off)
    reward: torch.Tensor  # [rows] score + penalty, what the advantages are computed from
    truncated: torch.Tensor  # [rows] bool: no end-of-sequence token


@dataclass(frozen=True)
class Group(_Responses):
    """One prompt's ``G`` responses: the payload dynamic sampling keeps, carries or drops
    (``dapo.sampling.BatchFiller``). Trimmed to its own longest response, in storage of its own (it may be
    checkpointed with the filler's carried groups)."""

    prompt_ids: torch.Tensor  # [P]


@dataclass(frozen=True)
class TrainBatch(_Responses):
    """The train batch, ``N`` response rows; the advantages and the loss mask are added by the step's stages
    (``dataclasses.replace``)."""

    prompt_ids: list[torch.Tensor]  # [N] the prompt of each response row
    advantages: torch.Tensor | None = None  # [N, T], stage 2
    loss_mask: torch.Tensor | None = None  # [N, T], stage 3

    @classmethod
    def collate(cls, groups: Sequence[Group], pad_id: int) -> TrainBatch:
        width = max(g.response_ids.shape[1] for g in groups)
        pad = {"response_ids": pad_id, "response_mask": 0, "old_log_prob": 0.0}  # the [rows, T] fields
        return cls(
            prompt_ids=[g.prompt_ids for g in groups for _ in range(g.response_ids.shape[0])],
            **{
                f.name: right_pad([getattr(g, f.name) for g in groups], width, pad[f.name])
                if f.name in pad
                else torch.cat([getattr(g, f.name) for g in groups])
                for f in fields(_Responses)
            },
        )


class Callback:
    """What a caller can watch without patching the loop (TRL's ``TrainerCallback``): override what you need.

    ``on_step_begin`` runs before each rollout step, outside its timing (``timing_s/step``); ``on_step_end`` after
    it, with the step's metrics, before validation and the checkpoint."""

    def on_step_begin(self, step: int) -> None:
        pass

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        pass


class EmbeddedTrainer:
    """DAPO in one process: :meth:`setup`, :meth:`train`, :meth:`cleanup`; one rollout step is :meth:`step`."""

    def __init__(self, cfg: DictConfig, callbacks: Sequence[Callback] = ()) -> None:
        self.cfg, self.callbacks = cfg, list(callbacks)
        self.plain = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)  # resolved once
        self.c = read_config(self.plain)
        self.run_dir = Path(self.c.trainer.run_dir).resolve()
        self.monitor: Monitor | None = None
        self._locked = False
        self.watchdog: Watchdog | None = None
        self._last_metrics: dict[str, float] = {}  # the last step's, read when the next one starves
        watch = self.c.dapo.entropy_watch
        self.entropy_watch = EntropyWatch(watch.fraction, watch.window)

    # ================================================================================================ setup
    def setup(self) -> bool:
        """Check the inputs, lock the run directory, load the policy and data, build the optimizer, restore a
        checkpoint; False when there is nothing to train (a finished run, which says so)."""
        c = self.c
        for setting in ignored_verl_keys(self.plain):
            logger.warning("the embedded engine ignores %s", setting)
        # the cheap checks first: nothing is loaded, built or written before the inputs and the run directory pass
        self.identity = run_identity(self.cfg)
        for files, key in ((c.data.train_files, "data.train_files"), (c.data.val_files, "data.val_files")):
            checks.check_data_files(files, key, prompt_key=c.data.prompt_key, reward_fn_key=c.data.reward_fn_key)
        for key, path in (
            ("actor_rollout_ref.model.path", c.model.path),
            ("...tokenizer_path", c.model.tokenizer_path),
        ):
            checks.check_model_path(key.replace("...", "actor_rollout_ref.model."), path)
        self.score_fn = checks.load_reward_function(  # probed once; every score is then checked to be finite
            c.reward.path, c.reward.name, c.reward.kwargs, c.data.train_files, c.reward.timeout_s
        )
        lock_run_dir(self.run_dir)  # one run per directory: a second one refuses here, naming this one
        self._locked = True

        resume_from = checkpoint.resume_checkpoint(c, self.run_dir, self.identity)
        if resume_from is not None and checkpoint.finished(c, resume_from):
            return False
        _quiet_libraries()
        if c.embedded.num_threads is not None:
            torch.set_num_threads(c.embedded.num_threads)
        _seed_everything(c.embedded.seed)
        tokenizer = policy_tokenizer(c, resume_from)
        self.data, self.val_data = _load_data(c, tokenizer)  # prompts checked before the model loads or warms up
        self.policy = load_policy(c, resume_from, tokenizer)
        self.params = [p for p in self.policy.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(  # fused: one kernel for every parameter (CPU and CUDA), not a loop
            self.params, lr=c.actor.lr, betas=c.actor.betas, weight_decay=c.actor.weight_decay, fused=True
        )
        warmup_steps = c.actor.lr_warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(  # verl's get_constant_schedule_with_warmup
            self.optimizer, lambda s: s / max(1, warmup_steps) if s < warmup_steps else 1.0
        )
        self.filler = None
        if c.dapo.filter.enable:  # [DAPO 2] dynamic sampling
            self.filler = BatchFiller.from_settings(c.dapo.sampling, c.dapo.filter)
        self.stream = PromptStream(len(self.data), shuffle=c.data.shuffle, seed=c.data.seed)
        self.total_steps = c.trainer.total_training_steps or c.trainer.total_epochs * max(
            1, len(self.data) // c.data.gen_batch_size
        )
        self.sampling = SamplingParams(True, c.rollout.temperature, c.rollout.top_p, c.rollout.top_k)
        self.guard = UpdateGuard()  # stops a run whose updates are all skipped

        self.start_step, wandb_id = 0, None
        if resume_from is not None:
            self.start_step, wandb_id = checkpoint.restore_training_state(
                checkpoint.load_state(resume_from), self.optimizer, self.scheduler, self.stream, self.filler
            )
            print(f"resumed from {resume_from} (step {self.start_step})")
            if self.start_step >= self.total_steps and not c.trainer.val_only:
                checkpoint.finished_message(c, resume_from, self.start_step, self.total_steps)
                return False

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.monitor = Monitor(
            self.run_dir,
            loggers=c.trainer.logger,
            project=c.trainer.project_name,
            experiment=c.trainer.experiment_name,
            start_step=self.start_step,
            total_steps=self.total_steps,
            config=self.plain,
            progress_bar=c.embedded.progress_bar,
            wandb_id=wandb_id,
        )
        return True

    # ================================================================================================ train
    def train(self) -> None:
        """Validate the start model, then the steps: each one, its validation and its checkpoint."""
        c, monitor = self.c, self.monitor
        self.watchdog = Watchdog(
            c.watchdog, on_stop=_watchdog_stop, advice=resume_advice(self.run_dir)
        ).start()  # a stalled run ends within dapo.watchdog's bound (recipe/common/watchdog.py)
        if self.start_step == 0 and (c.trainer.val_before_train or c.trainer.val_only):
            val_metrics = self.validate(step=0)
            monitor.log(0, val_metrics)
            monitor.write(val_summary(0, val_metrics))
        last_step = 0 if c.trainer.val_only else self.total_steps
        for step in range(self.start_step + 1, last_step + 1):
            self.watchdog.begin_step(step)
            for callback in self.callbacks:
                callback.on_step_begin(step)
            try:
                metrics = self.step(step)
            except RuntimeError as err:
                raise self.guard.diverged(err, step) from None
            self.guard.end_step(step)
            self._last_metrics = metrics
            warning = self.entropy_watch.update(
                step, metrics.get("actor/entropy"), lr=c.actor.lr, clip_ratio_high=c.dapo.loss.clip_ratio_high
            )
            if warning:
                logger.warning(warning)
                monitor.write(f"warning: {warning}")
            for callback in self.callbacks:
                callback.on_step_end(step, metrics)
            last = step == self.total_steps
            if c.trainer.test_freq > 0 and (step % c.trainer.test_freq == 0 or last):
                with _timer(metrics, "timing_s/testing"):
                    metrics.update(self.validate(step=step))
                monitor.write(val_summary(step, metrics))
            monitor.log(step, metrics)  # before the checkpoint: a resumed run drops records after its checkpoint
            monitor.progress(step, metrics)
            if c.trainer.save_freq > 0 and (step % c.trainer.save_freq == 0 or last):
                self.save(step)
            self.watchdog.end_step(step)
        monitor.close()
        self.guard.end_run(0 if c.trainer.val_only else self.total_steps - self.start_step)
        write_plots(self.run_dir)
        print(f"run directory: {self.run_dir}")

    def validate(self, step: int) -> dict[str, float]:
        self._beat("validation")
        out = validate(self.c, self.policy, self.val_data, self.score_fn, step=step)
        self._beat("after validation")
        return out

    def _beat(self, phase: str) -> None:
        if self.watchdog is not None:
            self.watchdog.beat(phase)

    def save(self, step: int) -> None:
        state = checkpoint.training_state(
            step, self.optimizer, self.scheduler, self.stream, self.filler, self.monitor.wandb_id
        )
        checkpoint.save_checkpoint(
            self.run_dir,
            step,
            self.policy.model,
            self.policy.tokenizer,
            state,
            self.c.trainer.max_ckpt_to_keep,
            identity=self.identity,
        )

    # ================================================================================================ cleanup
    def cleanup(self, failed: bool = False) -> None:
        """Stop the watchdog, close the metric sinks, release the run directory (also after an error)."""
        if self.watchdog is not None:
            self.watchdog.close()
        if self.monitor is not None:
            self.monitor.close(exit_code=1 if failed else 0)
        if self._locked:
            unlock_run_dir(self.run_dir)
            self._locked = False

    # ================================================================================================ one step
    def step(self, step: int) -> dict[str, float]:
        """One rollout step as named stages, each ``batch = self._stage(batch, metrics)`` (verl's ``_step_once``)."""
        metrics: dict[str, float] = {}
        timing = {"timing_s/reward": 0.0, "timing_s/old_log_prob": 0.0}  # summed over the step's rounds
        with _timer(metrics, "timing_s/step"):
            # 1. [DAPO 2] dynamic sampling: rounds generated, scored and shaped [DAPO 4] until the batch is full
            with _timer(metrics, "timing_s/gen"):
                batch = self._generate(step, metrics, timing)
            metrics.update(timing)
            # 2. group-relative advantages of the shaped rewards
            batch = self._compute_advantage(batch, metrics)
            # 3. [DAPO 4] overlong filtering: truncated responses carry no loss
            batch = self._compute_loss_mask(batch, metrics)
            metrics["dapo/entropy/logp_adv_cov"] = logprob_advantage_covariance(
                batch.old_log_prob, batch.advantages, batch.loss_mask
            )
            groups = torch.arange(batch.acc.shape[0], device=batch.acc.device) // self.c.rollout.n  # G rows a prompt
            metrics["dapo/adv/constant_acc_share"] = constant_accuracy_share(
                batch.advantages, batch.loss_mask, batch.acc, groups
            )
            # 4. [DAPO 1, 3] the policy update: decoupled clip, token-level loss
            metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]
            with _timer(metrics, "timing_s/update_actor"):
                batch = self._update_actor(batch, metrics)
            self.scheduler.step()
            metrics.update(_batch_metrics(batch))
        return metrics

    def _generate(self, step: int, metrics: dict, timing: dict) -> TrainBatch:
        groups, sampling_metrics, generated_acc = self.collect(step, timing)
        metrics.update(sampling_metrics)
        metrics["train/acc/mean"] = generated_acc
        return TrainBatch.collate(groups, self.policy.pad_id)

    def _compute_advantage(self, batch: TrainBatch, metrics: dict) -> TrainBatch:
        mask = batch.response_mask  # [N, T]
        last = (mask.sum(-1) - 1).clamp(min=0)  # [N] the response's last token, where verl puts the outcome reward
        rewards = torch.zeros_like(mask, dtype=batch.reward.dtype)  # [N, T] on the batch's device
        rewards.scatter_(1, last.unsqueeze(-1), batch.reward.unsqueeze(-1))
        advantages = token_advantages(
            rewards, mask, self.c.rollout.n, norm_adv_by_std_in_grpo=self.c.algorithm.norm_adv_by_std_in_grpo
        )  # [N, T]
        return replace(batch, advantages=advantages)

    def _compute_loss_mask(self, batch: TrainBatch, metrics: dict) -> TrainBatch:
        loss_mask = batch.response_mask  # [N, T]
        if self.c.dapo.overlong.filter:
            loss_mask = overlong_filter_mask(loss_mask, batch.truncated)
        return replace(batch, loss_mask=loss_mask)

    # ---------------------------------------------------------------- [DAPO 2] dynamic sampling
    def collect(self, step: int, timing: dict) -> tuple[list[Group], dict[str, float], float]:
        """Generate rounds until the train batch is full; return its groups, the sampling metrics and the
        accuracy of every response generated this step (before the group filter). ``timing``: the step's summed
        reward and old-log-prob seconds."""
        c = self.c
        acc_sum, acc_count = 0.0, 0
        if self.filler is None:  # filter_groups.enable=False: one round, every group trained
            indices = [self.stream.next() for _ in range(c.data.train_batch_size)]
            round_ = self.rollout(indices, timing)
            return (
                self.build_groups(round_, list(range(len(indices))), timing),
                {"train/num_gen_batches": 1.0, "dapo/generated_prompts": float(len(indices))},
                round_.acc.float().mean().item(),
            )

        self.filler.begin_step(step)
        while not self.filler.done:
            indices = self._draw(self.filler.next_round_size())
            round_ = self.rollout(indices, timing)
            acc_sum, acc_count = acc_sum + round_.acc.float().sum().item(), acc_count + round_.acc.numel()
            self._beat("generation")
            try:  # the filler keeps the groups with mixed accuracy; only those get built (with their log-probs)
                self.filler.add_round(
                    lambda kept, r=round_: self.build_groups(r, kept, timing),
                    round_.filter_values(c.dapo.filter.metric),
                    [self.data.keys[i] for i in indices],
                )
            except ValueError as err:
                raise ConfigError(starved_message(step, err, self._last_metrics, c.actor.lr)) from None
        groups, sampling_metrics = self.filler.end_step()
        return groups, sampling_metrics, acc_sum / max(acc_count, 1)

    def _draw(self, size: int) -> list[int]:
        """``size`` prompts that the filler admits (saturated ones are skipped), at most one epoch of offers."""
        chosen: list[int] = []
        for _ in range(len(self.data)):
            if len(chosen) == size:
                break
            index = self.stream.next()
            if self.filler.admit([self.data.keys[index]])[0]:
                chosen.append(index)
        return chosen or [self.stream.next()]

    def rollout(self, indices: list[int], timing: dict) -> _Round:
        """One generation round: generate (keeping the sampling pass's log-probs), score, detect truncation, shape the
        reward (no filter, no recomputed log-probs)."""
        c, policy = self.c, self.policy
        prompts = [self.data.prompt_ids[i] for i in indices]
        response_ids, response_mask, rollout_log_prob = sample(  # no gradients: sample is @torch.no_grad
            policy.sampler(),
            prompts,
            n=c.rollout.n,
            params=self.sampling,
            max_new_tokens=c.data.max_response_length,
            eos_ids=policy.eos_ids,
            pad_id=policy.pad_id,
            max_num_seqs=c.rollout.max_num_seqs,
        )  # [B*G, T] each
        with _timer(timing, "timing_s/reward", add=True):
            scored = score_responses(
                self.score_fn,
                policy.tokenizer,
                response_ids,
                response_mask,
                *(
                    [column[i] for i in indices for _ in range(c.rollout.n)]
                    for column in (self.data.data_sources, self.data.ground_truths, self.data.extra_infos)
                ),
                c.reward.kwargs,
            )
        truncated = truncated_responses(response_ids, response_mask, policy.eos_ids)  # [B*G]
        return _Round(
            prompts,
            response_ids,
            response_mask,
            scored["score"],
            scored["acc"],
            self.length_penalty(response_mask),
            truncated,
            rollout_log_prob,
            c.rollout.n,
        )

    def length_penalty(self, response_mask: torch.Tensor) -> torch.Tensor:
        """[DAPO 4] soft overlong punishment (paper Eq. 13) per response ``[B*G]``; zeros when off."""
        overlong = self.c.dapo.overlong
        if not overlong.buffer_enable:
            return torch.zeros(response_mask.shape[0])
        return overlong_penalty(
            response_mask.sum(-1),
            max_resp_len=overlong.max_resp_len,
            overlong_buffer_len=overlong.buffer_len,
            penalty_factor=overlong.penalty_factor,
        )

    def build_groups(self, r: _Round, groups: list[int], timing: dict) -> list[Group]:
        """Groups ``groups`` of round ``r``, with their behaviour log-probs (``old_log_prob``): the sampling pass's
        (``bypass_mode``), or recomputed now with the policy that generated them."""
        c, policy = self.c, self.policy
        rows = [g * c.rollout.n + k for g in groups for k in range(c.rollout.n)]  # responses of these groups
        old_log_prob = r.rollout_log_prob  # [B*G, T] algorithm.rollout_correction.bypass_mode: the sampling pass's
        if rows and not c.algorithm.bypass_mode:  # recomputed by a forward pass, as verl does by default
            with policy.autocast(), _timer(timing, "timing_s/old_log_prob", add=True):
                old_log_prob[rows] = batched_shared_log_probs(
                    policy.model,
                    [r.prompts[row // c.rollout.n] for row in rows],
                    r.response_ids[rows],
                    r.response_mask[rows],
                    temperature=c.rollout.temperature,
                    pad_id=policy.pad_id,
                    micro_batch_size=c.rollout.log_prob_micro_batch_size,
                    chunked_head=c.embedded.fast_path,
                )
        out = []
        for g in groups:
            span = slice(g * c.rollout.n, (g + 1) * c.rollout.n)
            width = int(r.response_mask[span].sum(-1).max())
            out.append(
                Group(  # cloned: a group must not pin the whole round's storage (it may be checkpointed)
                    prompt_ids=r.prompts[g].clone(),
                    response_ids=r.response_ids[span, :width].clone(),
                    response_mask=r.response_mask[span, :width].clone(),
                    old_log_prob=old_log_prob[span, :width].clone(),
                    score=r.score[span].clone(),
                    acc=r.acc[span].clone(),
                    penalty=r.penalty[span].clone(),
                    reward=r.reward[span].clone(),
                    truncated=r.truncated[span].clone(),
                )
            )
        return out

    # ---------------------------------------------------------------- [DAPO 1, 3] the policy update
    def _update_actor(self, batch: TrainBatch, metrics: dict) -> TrainBatch:
        """``ppo_epochs`` x mini-batches of ``ppo_mini_batch_size`` prompts, one optimizer step each."""
        c = self.c
        mini = c.actor.ppo_mini_batch_size * c.rollout.n  # responses
        num_rows = batch.response_ids.shape[0]
        self.policy.model.train()
        self._clip_entropy = {name: (0.0, 0.0) for name in ("high", "low", "all")}  # summed over micro-batches
        records = [
            self._mini_batch_step(batch, slice(start, start + mini))
            for _ in range(c.actor.ppo_epochs)
            for start in range(0, num_rows, mini)
        ]
        self.optimizer.zero_grad(set_to_none=True)
        self.policy.sync_sampler()  # the next rollout samples with the updated weights
        metrics.update(mean_metrics(records))
        metrics.update(clipped_entropy_metrics(self._clip_entropy))
        return batch

    def _mini_batch_step(self, batch: TrainBatch, rows: slice) -> dict[str, float]:
        """One AdamW step over mini-batch ``rows``, gradients accumulated over micro-batches of
        ``ppo_micro_batch_size_per_gpu`` responses; skipped (and counted) when the gradient norm is not finite."""
        loss_mask = batch.loss_mask
        # [DAPO 3] token-level loss: the normaliser is the token count of the whole mini-batch
        batch_num_tokens = loss_mask[rows].sum()
        global_batch_size = int((loss_mask[rows].sum(-1) > 0).sum())
        self.optimizer.zero_grad(set_to_none=True)
        micro = self.c.actor.ppo_micro_batch_size
        micro_records = [
            self._micro_batch_backward(batch, slice(m, m + micro), batch_num_tokens, global_batch_size)
            for m in range(rows.start, rows.stop, micro)
        ]
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.c.actor.grad_clip)
        self.guard.record(applied=bool(torch.isfinite(grad_norm)))
        if torch.isfinite(grad_norm):
            self.optimizer.step()
        else:
            logger.warning("non-finite gradient norm %s: mini-batch update skipped", grad_norm.item())
        losses = [record.pop("_loss") for record in micro_records]
        return {**mean_metrics(micro_records), "actor/pg_loss": sum(losses), "actor/grad_norm": grad_norm.item()}

    def _micro_batch_backward(
        self, batch: TrainBatch, rows: slice, batch_num_tokens: torch.Tensor, global_batch_size: int
    ) -> dict[str, float]:
        """Forward, the policy loss of micro-batch ``rows`` and its backward; return its metrics."""
        c, policy, settings = self.c, self.policy, self.c.dapo.loss
        width = int(batch.response_mask[rows].sum(-1).max())  # the micro-batch's own length
        with policy.autocast():
            log_prob, entropy = shared_prompt_log_probs(
                policy.model,
                batch.prompt_ids[rows],
                batch.response_ids[rows, :width],
                batch.response_mask[rows, :width],
                temperature=c.rollout.temperature,
                pad_id=policy.pad_id,
                with_entropy=True,
                entropy_grad=c.actor.entropy_coeff != 0,
                chunked_head=c.embedded.fast_path,
            )  # [n, T'] each
        device = log_prob.device
        mask = batch.loss_mask[rows, :width].to(device)  # [n, T']
        # [DAPO 1] decoupled clip: clip_ratio_low / clip_ratio_high
        loss, record = LOSS_MODES[settings.loss_mode](  # actor.policy_loss.loss_mode
            log_prob,
            batch.old_log_prob[rows, :width].to(device),
            batch.advantages[rows, :width].to(device),
            mask,
            batch_num_tokens=batch_num_tokens,
            global_batch_size=global_batch_size,
            **settings.loss_kwargs(),
        )
        if c.actor.entropy_coeff != 0:
            loss = loss - c.actor.entropy_coeff * aggregate_loss(
                entropy,
                mask,
                settings.loss_agg_mode,
                batch_num_tokens=batch_num_tokens,
                global_batch_size=global_batch_size,
                loss_scale_factor=settings.loss_scale_factor,
            )
        loss.backward()
        self._beat("actor update")
        sums = clipped_token_entropy(
            entropy.detach(),
            log_prob.detach(),
            batch.old_log_prob[rows, :width].to(device),
            batch.advantages[rows, :width].to(device),
            mask,
            clip_ratio_low=settings.clip_ratio_low,
            clip_ratio_high=settings.clip_ratio_high,
        )
        for name, (total, count) in sums.items():
            old_total, old_count = self._clip_entropy[name]
            self._clip_entropy[name] = (old_total + total, old_count + count)
        response_mask = batch.response_mask[rows, :width].to(device)
        return {**record, "actor/entropy": masked_mean(entropy.detach(), response_mask).item(), "_loss": loss.item()}


# ---------------------------------------------------------------------------------------------------- helpers


def _batch_metrics(batch: TrainBatch) -> dict[str, float]:
    mask = batch.response_mask.bool()
    valid_adv = batch.advantages[mask]
    prompt_length = torch.tensor([float(len(ids)) for ids in batch.prompt_ids])  # [N], one per response row
    return {
        **response_length_metrics(batch.response_mask, batch.truncated),
        "prompt_length/mean": prompt_length.mean().item(),
        "prompt_length/max": prompt_length.max().item(),
        "prompt_length/min": prompt_length.min().item(),
        "critic/score/mean": batch.score.mean().item(),
        "critic/rewards/mean": batch.reward.mean().item(),
        "critic/advantages/mean": valid_adv.mean().item(),
        "critic/advantages/max": valid_adv.max().item(),
        "critic/advantages/min": valid_adv.min().item(),
        "dapo/overlong_frac": batch.truncated.float().mean().item(),
        "dapo/overlong_penalty/mean": batch.penalty.mean().item(),
        "response/repeat_ngram_frac": repeat_ngram_frac(batch.response_ids, batch.response_mask),
    }


@contextlib.contextmanager
def _timer(metrics: dict, name: str, add: bool = False):
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics[name] = (metrics.get(name, 0.0) if add else 0.0) + time.perf_counter() - start


def _watchdog_stop(line: str) -> None:
    """The watchdog found the run stalled: its line last, then exit 75 (the same command resumes from the newest
    checkpoint, written atomically, so intact whatever the main thread was doing)."""
    import os

    say_last(f"dapo-train: stopped: {line}")
    os._exit(EXIT_WATCHDOG)


def _quiet_libraries() -> None:
    """No per-file progress bars from transformers / datasets between our own progress bar's lines."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _load_data(c: EngineConfig, tokenizer) -> tuple[PromptSet, PromptSet]:
    task_dir = None
    if c.data.train_files is None or c.data.val_files is None:
        task_dir = c.tiny.task_dir()
    common = c.data.prompt_kwargs()
    train = load_prompts(
        c.data.train_files or [str(task_dir / "train.parquet")],
        tokenizer,
        files_key="data.train_files",
        max_samples=c.data.train_max_samples,
        **common,
    )
    val = load_prompts(
        c.data.val_files or [str(task_dir / "val.parquet")],
        tokenizer,
        files_key="data.val_files",
        max_samples=c.data.val_max_samples,
        **common,
    )
    if len(train) < c.data.gen_batch_size:
        raise ConfigError(
            f"data.train_files has {len(train)} usable prompts, fewer than "
            f"data.gen_batch_size={c.data.gen_batch_size}; "
            "use more data or a smaller data.gen_batch_size"
        )
    return train, val
