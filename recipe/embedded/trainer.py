"""The embedded engine's training loop: DAPO in one process, its own decode loop over a Hugging Face model
(``recipe.embedded.decode``), the ``dapo/`` functions.

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
import copy
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from dapo.advantage import group_advantages
from dapo.loss import LOSS_MODES, aggregate_loss, masked_mean, overlong_filter_mask, truncated_responses
from dapo.metrics import mean_metrics, repeat_ngram_frac, response_length_metrics
from dapo.sampling import BatchFiller
from dapo.settings import eos_token_ids
from dapo.shaping import overlong_penalty
from recipe.common import checks
from recipe.common.cpu import cpu_has_bf16
from recipe.common.identity import check_same_run, run_identity
from recipe.common.rundir import lock_run_dir, unlock_run_dir
from recipe.embedded import checkpoint
from recipe.embedded.config import ConfigError, EngineConfig, ignored_verl_keys, read_config
from recipe.embedded.data import PromptSet, PromptStream, load_prompts
from recipe.embedded.decode import batched_shared_log_probs, sample, shared_prompt_log_probs
from recipe.embedded.guard import UpdateGuard
from recipe.embedded.monitor import Monitor, write_plots
from recipe.embedded.rollout import SamplingParams, right_pad
from recipe.embedded.warmup import task_files, warm_model

logger = logging.getLogger(__name__)


@dataclass
class Policy:
    model: torch.nn.Module
    tokenizer: object
    eos_ids: torch.Tensor  # [E] every token that ends a response
    pad_id: int
    device: torch.device
    autocast_dtype: torch.dtype | None  # bf16 compute over fp32 weights (a GPU, or a CPU with native bf16)
    _sampler: torch.nn.Module | None = field(default=None, repr=False)

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def sampler(self) -> torch.nn.Module:
        """The model that generates: the policy itself in full precision; with low-precision compute, a copy held
        in ``autocast_dtype`` (:func:`low_precision_copy`), kept in step by :meth:`sync_sampler`."""
        if self.autocast_dtype is None:
            return self.model
        if self._sampler is None:
            self._sampler = low_precision_copy(self.model, self.autocast_dtype)
        return self._sampler

    def sync_sampler(self) -> None:
        """After an optimizer step: the generating copy takes the policy's new weights, cast to its dtype."""
        if self._sampler is not None:
            with torch.no_grad():
                for low, full in zip(self._sampler.parameters(), self.model.parameters(), strict=True):
                    low.copy_(full)


def low_precision_copy(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A frozen copy of ``model`` for generation with its parameters in ``dtype`` (buffers such as the rotary
    frequencies stay as they are), as verl's rollout serves bf16 weights while the actor keeps fp32 ones.

    Autocast casts every weight at every call: in a decode loop, one forward per token, the casts cost more than
    the matrix products (SmolLM2-135M on 2 CPU cores, 12 prompts x 4 responses of 64 tokens: 23-30 s under
    autocast, 9 s with this copy)."""
    low = copy.deepcopy(model).eval()
    low.requires_grad_(False)
    for param in low.parameters():
        param.data = param.data.to(dtype)
    return low


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


class Callback:
    """What a caller can watch without patching the loop (TRL's ``TrainerCallback``): override what you need.

    ``on_step_begin`` runs before each rollout step, outside its timing (``timing_s/step``); ``on_step_end`` after
    it, with the step's metrics, before validation and the checkpoint."""

    def on_step_begin(self, step: int) -> None:
        pass

    def on_step_end(self, step: int, metrics: dict[str, float]) -> None:
        pass


def run(cfg: DictConfig, callbacks: Sequence[Callback] = ()) -> Path:
    """Train with DAPO as ``cfg`` says; return the run directory (metrics.jsonl, plots/, checkpoints)."""
    c = read_config(cfg)
    for setting in ignored_verl_keys(cfg):
        logger.warning("the embedded engine ignores %s", setting)
    # ------------------------------------------------------------------ setup
    # the cheap checks first: nothing is loaded, built or written before the inputs and the run directory pass
    run_dir = Path(c.run_dir).resolve()
    identity = run_identity(cfg)
    for files, key in ((c.train_files, "data.train_files"), (c.val_files, "data.val_files")):
        checks.check_data_files(files, key, prompt_key=c.prompt_key, reward_fn_key=c.reward_fn_key)
    score_fn = _load_score_fn(c)
    lock_run_dir(run_dir)  # one run per directory: a second one refuses here, naming this one
    try:
        return _train(c, cfg, run_dir, identity, score_fn, callbacks)
    finally:
        unlock_run_dir(run_dir)


def _train(c: EngineConfig, cfg: DictConfig, run_dir: Path, identity: dict, score_fn,
           callbacks: Sequence[Callback]) -> Path:
    """:func:`run` once its inputs are checked and its run directory is locked."""
    resume_from = _resume_checkpoint(c, run_dir, identity)
    if resume_from is not None and _finished(c, resume_from):
        return run_dir

    _quiet_libraries()
    if c.num_threads is not None:
        torch.set_num_threads(c.num_threads)
    _seed_everything(c.seed)
    policy = _load_policy(c, resume_from)
    train_set, val_set = _load_data(c, policy.tokenizer)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(  # fused: one kernel for every parameter (CPU and CUDA), not a Python loop
        params, lr=c.lr, betas=c.betas, weight_decay=c.weight_decay, fused=True
    )
    warmup_steps = c.lr_warmup_steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(  # verl's get_constant_schedule_with_warmup
        optimizer, lambda s: s / max(1, warmup_steps) if s < warmup_steps else 1.0
    )
    filler = None
    if c.dapo.filter.enable:  # [DAPO 2] dynamic sampling
        filler = BatchFiller.from_settings(c.dapo.sampling, c.dapo.filter)
    stream = PromptStream(len(train_set), shuffle=c.shuffle, seed=c.data_seed)
    total_steps = c.total_training_steps or c.total_epochs * max(1, len(train_set) // c.gen_batch_size)

    start_step, wandb_id = 0, None
    if resume_from is not None:
        start_step, wandb_id = checkpoint.restore_training_state(
            checkpoint.load_state(resume_from), optimizer, scheduler, stream, filler
        )
        print(f"resumed from {resume_from} (step {start_step})")
        if start_step >= total_steps and not c.val_only:
            _finished_message(c, resume_from, start_step, total_steps)
            return run_dir

    run_dir.mkdir(parents=True, exist_ok=True)

    monitor = Monitor(
        run_dir, loggers=c.logger, project=c.project_name, experiment=c.experiment_name,
        config=OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False), start_step=start_step,
        total_steps=total_steps, progress_bar=c.progress_bar, wandb_id=wandb_id,
    )
    trainer = _Trainer(c, policy, train_set, score_fn, optimizer, scheduler, filler, stream)

    # ------------------------------------------------------------------ loop
    if start_step == 0 and (c.val_before_train or c.val_only):
        val_metrics = _validate(c, policy, val_set, score_fn, step=0)
        monitor.log(0, val_metrics)
        monitor.write(_val_summary(0, val_metrics))
    for step in range(start_step + 1, 0 if c.val_only else total_steps + 1):
        for callback in callbacks:
            callback.on_step_begin(step)
        try:
            metrics = trainer.step(step)
        except RuntimeError as err:
            raise trainer.guard.diverged(err, step) from None
        trainer.guard.end_step(step)
        for callback in callbacks:
            callback.on_step_end(step, metrics)
        last = step == total_steps
        if c.test_freq > 0 and (step % c.test_freq == 0 or last):
            with _timer(metrics, "timing_s/testing"):
                metrics.update(_validate(c, policy, val_set, score_fn, step=step))
            monitor.write(_val_summary(step, metrics))
        monitor.log(step, metrics)  # before the checkpoint: a resumed run drops records after its checkpoint
        monitor.progress(step, metrics)
        if c.save_freq > 0 and (step % c.save_freq == 0 or last):
            state = checkpoint.training_state(step, optimizer, scheduler, stream, filler, monitor.wandb_id)
            checkpoint.save_checkpoint(run_dir, step, policy.model, policy.tokenizer, state, c.max_ckpt_to_keep,
                                       identity=identity)

    # ------------------------------------------------------------------ cleanup
    monitor.close()
    trainer.guard.end_run(0 if c.val_only else total_steps - start_step)
    write_plots(run_dir)
    print(f"run directory: {run_dir}")
    return run_dir


class _Trainer:
    """One DAPO step: :meth:`collect` (dynamic sampling), advantages, :meth:`update` (the policy loss)."""

    def __init__(self, c: EngineConfig, policy: Policy, train_set: PromptSet, score_fn, optimizer, scheduler,
                 filler: BatchFiller | None, stream: PromptStream) -> None:
        self.c, self.policy, self.data, self.score_fn = c, policy, train_set, score_fn
        self.optimizer, self.scheduler, self.filler, self.stream = optimizer, scheduler, filler, stream
        self.params = [p for p in policy.model.parameters() if p.requires_grad]
        self.sampling = SamplingParams(True, c.temperature, c.top_p, c.top_k)
        self.guard = UpdateGuard()  # stops a run whose updates are all skipped

    def step(self, step: int) -> dict[str, float]:
        c = self.c
        metrics: dict[str, float] = {}
        self.timing = {"timing_s/reward": 0.0, "timing_s/old_log_prob": 0.0}  # summed over the step's rounds
        with _timer(metrics, "timing_s/step"):
            with _timer(metrics, "timing_s/gen"):
                groups, sampling_metrics, generated_acc = self.collect(step)
            metrics.update(self.timing)
            metrics.update(sampling_metrics)
            metrics["train/acc/mean"] = generated_acc
            batch = _collate(groups, self.policy.pad_id)

            advantages = group_advantages(batch["reward"], c.n, norm_adv_by_std_in_grpo=c.norm_adv_by_std_in_grpo)
            advantages = advantages.unsqueeze(-1) * batch["response_mask"]  # [N, T]
            loss_mask = batch["response_mask"]  # [N, T]
            if c.dapo.overlong.filter:  # [DAPO 4] overlong filtering: truncated responses carry no loss
                loss_mask = overlong_filter_mask(loss_mask, batch["truncated"])

            metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]
            with _timer(metrics, "timing_s/update_actor"):
                metrics.update(self.update(batch, advantages, loss_mask))
            self.scheduler.step()
            metrics.update(_batch_metrics(batch, advantages))
        return metrics

    # ---------------------------------------------------------------- [DAPO 2] dynamic sampling
    def collect(self, step: int) -> tuple[list[dict], dict[str, float], float]:
        """Generate rounds until the train batch is full; return its groups, the sampling metrics and the
        accuracy of every response generated this step (before the group filter)."""
        c = self.c
        acc_sum, acc_count = 0.0, 0
        if self.filler is None:  # filter_groups.enable=False: one round, every group trained
            indices = [self.stream.next() for _ in range(c.train_batch_size)]
            round_ = self.rollout(indices)
            return self.payloads(round_, list(range(len(indices)))), \
                {"train/num_gen_batches": 1.0, "dapo/generated_prompts": float(len(indices))}, \
                round_.acc.float().mean().item()

        self.filler.begin_step(step)
        while not self.filler.done:
            indices = self._draw(self.filler.next_round_size())
            round_ = self.rollout(indices)
            acc_sum, acc_count = acc_sum + round_.acc.float().sum().item(), acc_count + round_.acc.numel()
            try:  # the filler keeps the groups with mixed accuracy; their payloads (log-probs) are built for those only
                self.filler.add_round(lambda kept, r=round_: self.payloads(r, kept),
                                      round_.filter_values(c.dapo.filter.metric), [self.data.keys[i] for i in indices])
            except ValueError as err:
                raise ConfigError(f"step {step}: {err}") from None
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

    def rollout(self, indices: list[int]) -> _Round:
        """One generation round: generate (keeping the sampling pass's log-probs), score, detect truncation, shape the
        reward (no filter, no recomputed log-probs)."""
        c, policy = self.c, self.policy
        prompts = [self.data.prompt_ids[i] for i in indices]
        response_ids, response_mask, rollout_log_prob = sample(  # no gradients: sample is @torch.no_grad
            policy.sampler(), prompts, n=c.n, params=self.sampling, max_new_tokens=c.max_response_length,
            eos_ids=policy.eos_ids, pad_id=policy.pad_id, max_num_seqs=c.max_num_seqs,
        )  # [B*G, T] each
        with _timer(self.timing, "timing_s/reward", add=True):
            scored = _score(
                self.score_fn, policy.tokenizer, response_ids, response_mask,
                *([column[i] for i in indices for _ in range(c.n)]
                  for column in (self.data.data_sources, self.data.ground_truths, self.data.extra_infos)),
                c.reward_kwargs,
            )
        truncated = truncated_responses(response_ids, response_mask, policy.eos_ids)  # [B*G]
        return _Round(prompts, response_ids, response_mask, scored["score"], scored["acc"],
                      self.length_penalty(response_mask), truncated, rollout_log_prob, c.n)

    def length_penalty(self, response_mask: torch.Tensor) -> torch.Tensor:
        """[DAPO 4] soft overlong punishment (paper Eq. 13) per response ``[B*G]``; zeros when off."""
        overlong = self.c.dapo.overlong
        if not overlong.buffer_enable:
            return torch.zeros(response_mask.shape[0])
        return overlong_penalty(
            response_mask.sum(-1), max_resp_len=overlong.max_resp_len, overlong_buffer_len=overlong.buffer_len,
            penalty_factor=overlong.penalty_factor,
        )

    def payloads(self, r: _Round, groups: list[int]) -> list[dict]:
        """The payloads of groups ``groups`` of round ``r``, with their behaviour log-probs (``old_log_prob``): the
        sampling pass's (``bypass_mode``), or recomputed now with the policy that generated them."""
        c, policy = self.c, self.policy
        rows = [g * c.n + k for g in groups for k in range(c.n)]  # responses of these groups
        old_log_prob = r.rollout_log_prob  # [B*G, T] algorithm.rollout_correction.bypass_mode: the sampling pass's
        if rows and not c.bypass_mode:  # recomputed by a forward pass, as verl does by default
            with policy.autocast(), _timer(self.timing, "timing_s/old_log_prob", add=True):
                old_log_prob[rows] = batched_shared_log_probs(
                    policy.model, [r.prompts[row // c.n] for row in rows], r.response_ids[rows],
                    r.response_mask[rows], temperature=c.temperature, pad_id=policy.pad_id,
                    micro_batch_size=c.log_prob_micro_batch_size,
                )
        out = []
        for g in groups:
            span = slice(g * c.n, (g + 1) * c.n)
            width = int(r.response_mask[span].sum(-1).max())
            out.append({  # cloned: a payload must not pin the whole round's storage (it may be checkpointed)
                "prompt_ids": r.prompts[g].clone(),
                "response_ids": r.response_ids[span, :width].clone(),
                "response_mask": r.response_mask[span, :width].clone(),
                "old_log_prob": old_log_prob[span, :width].clone(),
                "score": r.score[span].clone(),
                "acc": r.acc[span].clone(),
                "penalty": r.penalty[span].clone(),
                "reward": r.reward[span].clone(),
                "truncated": r.truncated[span].clone(),
            })
        return out

    # ---------------------------------------------------------------- [DAPO 1, 3] the policy update
    def update(self, batch: dict, advantages: torch.Tensor, loss_mask: torch.Tensor) -> dict[str, float]:
        """``ppo_epochs`` x mini-batches, one optimizer step each, gradients accumulated over micro-batches."""
        c, policy = self.c, self.policy
        loss_fn, loss_settings = LOSS_MODES[c.dapo.loss.loss_mode], c.dapo.loss  # policy_loss.loss_mode
        mini, micro = c.ppo_mini_batch_size * c.n, c.ppo_micro_batch_size
        num_rows = batch["response_ids"].shape[0]
        policy.model.train()
        records = []
        for _ in range(c.ppo_epochs):
            for start in range(0, num_rows, mini):
                mini_rows = slice(start, start + mini)
                # [DAPO 3] token-level loss: the normaliser is the token count of the whole mini-batch
                batch_num_tokens = loss_mask[mini_rows].sum()
                global_batch_size = int((loss_mask[mini_rows].sum(-1) > 0).sum())
                self.optimizer.zero_grad(set_to_none=True)
                micro_records, mini_loss = [], 0.0
                for m_start in range(start, start + mini, micro):
                    rows = slice(m_start, m_start + micro)
                    width = int(batch["response_mask"][rows].sum(-1).max())  # the micro-batch's own length
                    with policy.autocast():
                        log_prob, entropy = shared_prompt_log_probs(
                            policy.model, batch["prompt_ids"][rows], batch["response_ids"][rows, :width],
                            batch["response_mask"][rows, :width], temperature=c.temperature, pad_id=policy.pad_id,
                            with_entropy=True, entropy_grad=c.entropy_coeff != 0,
                        )  # [n, T'] each
                    device = log_prob.device
                    mask = loss_mask[rows, :width].to(device)  # [n, T']
                    # [DAPO 1] decoupled clip: clip_ratio_low / clip_ratio_high
                    loss, record = loss_fn(
                        log_prob, batch["old_log_prob"][rows, :width].to(device),
                        advantages[rows, :width].to(device), mask,
                        batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size,
                        **loss_settings.loss_kwargs(),
                    )
                    if c.entropy_coeff != 0:
                        loss = loss - c.entropy_coeff * aggregate_loss(
                            entropy, mask, loss_settings.loss_agg_mode, batch_num_tokens=batch_num_tokens,
                            global_batch_size=global_batch_size, loss_scale_factor=loss_settings.loss_scale_factor,
                        )
                    loss.backward()
                    mini_loss += loss.item()
                    response_mask = batch["response_mask"][rows, :width].to(device)
                    record["actor/entropy"] = masked_mean(entropy.detach(), response_mask).item()
                    micro_records.append(record)
                grad_norm = torch.nn.utils.clip_grad_norm_(self.params, c.grad_clip)
                self.guard.record(applied=bool(torch.isfinite(grad_norm)))
                if torch.isfinite(grad_norm):
                    self.optimizer.step()
                else:
                    logger.warning("non-finite gradient norm %s: mini-batch update skipped", grad_norm.item())
                records.append({**mean_metrics(micro_records), "actor/pg_loss": mini_loss,
                                "actor/grad_norm": grad_norm.item()})
        self.optimizer.zero_grad(set_to_none=True)
        policy.sync_sampler()  # the next rollout samples with the updated weights
        return mean_metrics(records)


# ---------------------------------------------------------------------------------------------------- helpers


def _collate(groups: list[dict], pad_id: int) -> dict:
    """The train batch: ``[N, T]`` tensors with the G responses of a prompt in consecutive rows."""
    width = max(g["response_ids"].shape[1] for g in groups)
    return {
        "prompt_ids": [g["prompt_ids"] for g in groups for _ in range(g["response_ids"].shape[0])],
        "response_ids": right_pad([g["response_ids"] for g in groups], width, pad_id),
        "response_mask": right_pad([g["response_mask"] for g in groups], width, 0),
        "old_log_prob": right_pad([g["old_log_prob"] for g in groups], width, 0.0),
        **{key: torch.cat([g[key] for g in groups]) for key in ("score", "acc", "penalty", "reward", "truncated")},
    }


def _batch_metrics(batch: dict, advantages: torch.Tensor) -> dict[str, float]:
    mask = batch["response_mask"].bool()
    valid_adv = advantages[mask]
    return {
        **response_length_metrics(batch["response_mask"], batch["truncated"]),
        "critic/score/mean": batch["score"].mean().item(),
        "critic/rewards/mean": batch["reward"].mean().item(),
        "critic/advantages/mean": valid_adv.mean().item(),
        "critic/advantages/max": valid_adv.max().item(),
        "critic/advantages/min": valid_adv.min().item(),
        "dapo/overlong_frac": batch["truncated"].float().mean().item(),
        "dapo/overlong_penalty/mean": batch["penalty"].mean().item(),
        "response/repeat_ngram_frac": repeat_ngram_frac(batch["response_ids"], batch["response_mask"]),
    }


def _score(score_fn, tokenizer, response_ids, response_mask, sources, truths, extras, kwargs) -> dict:
    """``score`` (+1/-1) and ``acc`` (bool) per response, from the decoded response text."""
    scores, accs = [], []
    for i in range(response_ids.shape[0]):
        text = tokenizer.decode(response_ids[i][response_mask[i].bool()], skip_special_tokens=True)
        result = score_fn(sources[i], text, truths[i], extras[i], **kwargs)
        if isinstance(result, dict):
            score = float(result["score"])
            acc = bool(result.get("acc", score > 0))
        else:  # a plain float from a custom scorer
            score, acc = float(result), float(result) > 0
        scores.append(score)
        accs.append(acc)
    return {"score": torch.tensor(scores, dtype=torch.float32), "acc": torch.tensor(accs, dtype=torch.bool)}


@torch.no_grad()
def _validate(c: EngineConfig, policy: Policy, val_set: PromptSet, score_fn, step: int) -> dict[str, float]:
    """mean@k accuracy and score per data source at ``rollout.val_kwargs`` (verl's ``val-core`` / ``val-aux``)."""
    params = SamplingParams(c.val_do_sample, c.val_temperature, c.val_top_p, c.val_top_k)
    chunk = c.val_batch_size or len(val_set)
    devices = [policy.device] if policy.device.type == "cuda" else []
    scores, accs, lengths = [], [], []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(c.seed * 1_000_003 + step)
        for start in range(0, len(val_set), chunk):
            rows = range(start, min(start + chunk, len(val_set)))
            response_ids, response_mask, _ = sample(
                policy.sampler(), [val_set.prompt_ids[i] for i in rows], n=c.val_n, params=params,
                max_new_tokens=c.max_response_length, eos_ids=policy.eos_ids, pad_id=policy.pad_id,
                max_num_seqs=c.max_num_seqs,
            )
            scored = _score(
                score_fn, policy.tokenizer, response_ids, response_mask,
                [val_set.data_sources[i] for i in rows for _ in range(c.val_n)],
                [val_set.ground_truths[i] for i in rows for _ in range(c.val_n)],
                [val_set.extra_infos[i] for i in rows for _ in range(c.val_n)], c.reward_kwargs,
            )
            scores.append(scored["score"])
            accs.append(scored["acc"].float())
            lengths.append(response_mask.sum(-1).float())
    scores, accs = torch.cat(scores), torch.cat(accs)  # [V*k]
    sources = np.array([s for s in val_set.data_sources for _ in range(c.val_n)])
    metrics = {"val-aux/response_length/mean": torch.cat(lengths).mean().item()}
    for source in sorted(set(val_set.data_sources)):
        rows = torch.from_numpy(sources == source)
        metrics[f"val-core/{source}/acc/mean@{c.val_n}"] = accs[rows].mean().item()
        metrics[f"val-aux/{source}/score/mean@{c.val_n}"] = scores[rows].mean().item()
    return metrics


def _val_summary(step: int, metrics: dict[str, float]) -> str:
    core = [f"{k.removeprefix('val-core/')} = {v:.3f}" for k, v in metrics.items() if k.startswith("val-core/")]
    return f"step {step}: validation {', '.join(core)}"


@contextlib.contextmanager
def _timer(metrics: dict, name: str, add: bool = False):
    start = time.perf_counter()
    try:
        yield
    finally:
        metrics[name] = (metrics.get(name, 0.0) if add else 0.0) + time.perf_counter() - start


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


def _resume_checkpoint(c: EngineConfig, run_dir: Path, identity: dict) -> Path | None:
    """verl's ``trainer.resume_mode``: auto = the latest intact checkpoint in the run dir if any; disable = start
    over; resume_path = ``trainer.resume_from_path``. A checkpoint of another run is refused (run.json)."""
    if c.resume_mode == "disable":
        return None
    if c.resume_mode == "resume_path":
        path = Path(c.resume_from_path).expanduser()
        if not (path / checkpoint.STATE_FILE).is_file():
            raise ConfigError(
                f"trainer.resume_from_path={c.resume_from_path!r} is not a checkpoint (a global_step_N directory)"
            )
        problem = checkpoint.damage(path)
        if problem:
            raise ConfigError(f"trainer.resume_from_path={c.resume_from_path!r}: {problem}; point it at an intact "
                              "checkpoint")
    else:
        path = checkpoint.find_intact(run_dir)
    if path is not None:
        check_same_run(path, identity)
    return path


def _finished(c: EngineConfig, resume_from: Path) -> bool:
    """True (and says so) when the checkpoint is the last step of ``trainer.total_training_steps``; a length given
    in epochs is known only once the data is read, so that case is told after loading (``run``)."""
    step = int(resume_from.name.rsplit("_", 1)[1]) if resume_from.name.startswith("global_step_") else None
    if c.val_only or step is None or c.total_training_steps is None or step < c.total_training_steps:
        return False
    _finished_message(c, resume_from, step, c.total_training_steps)
    return True


def _finished_message(c: EngineConfig, resume_from: Path, step: int, total_steps: int) -> None:
    print(
        f"this run is complete: {resume_from} is step {step} of trainer.total_training_steps={total_steps}; nothing "
        f"to train. Its metrics and plots are in {resume_from.parent}. To train further raise "
        "trainer.total_training_steps; to start a new run set trainer.experiment_name=<new name> (or "
        "trainer.resume_mode=disable to start over in this directory)"
    )


def _device_and_dtypes(c: EngineConfig) -> tuple[torch.device, torch.dtype, torch.dtype | None]:
    """(device, parameter dtype, autocast dtype) from ``embedded.device`` / ``embedded.dtype``."""
    if c.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(c.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"embedded.device={c.device!r} but no CUDA device is visible; set embedded.device=auto")
    name = c.dtype
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "float32"
    if name not in ("float32", "float64", "bfloat16", "float16"):
        raise ConfigError(f"embedded.dtype must be auto, float32, float64, bfloat16 or float16; got {c.dtype!r}")
    if name == "float64":
        return device, torch.float64, None
    if name == "float32":
        return device, torch.float32, None
    if device.type != "cuda" and (name == "float16" or not cpu_has_bf16()):
        raise ConfigError(
            f"embedded.dtype={name} needs a GPU{'' if name == 'float16' else ' or a CPU with AVX-512 BF16 or AMX'}; "
            "on this CPU use float32 (or auto)"
        )
    return device, torch.float32, getattr(torch, name)  # fp32 master weights, low-precision compute


def _load_policy(c: EngineConfig, resume_from: Path | None) -> Policy:
    """The model and tokenizer: from a checkpoint when resuming, else ``model.path``, else the warmed-up tiny model."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    device, param_dtype, autocast_dtype = _device_and_dtypes(c)
    if resume_from is not None:
        model_dir, tokenizer_dir = resume_from / "actor", resume_from / "actor"
    elif c.model_path is not None:
        model_dir, tokenizer_dir = c.model_path, c.tokenizer_path or c.model_path
    else:
        model_dir = warm_model(c.cache_dir, c.task, c.tiny_model, c.warmup, device=device, progress_bar=c.progress_bar)
        tokenizer_dir = model_dir
    try:
        tokenizer = load_tokenizer(tokenizer_dir, c.trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=param_dtype, trust_remote_code=c.trust_remote_code
        )
    except OSError as err:
        raise ConfigError(
            f"cannot load actor_rollout_ref.model.path={str(model_dir)!r} ({err}); give a local directory saved with "
            "save_pretrained, or a hub id with network access (nothing is downloaded in tests)"
        ) from None
    if c.custom_chat_template:
        tokenizer.chat_template = c.custom_chat_template
    if not tokenizer.chat_template:
        raise ConfigError(
            f"the tokenizer of {model_dir} has no chat template; set actor_rollout_ref.model.custom_chat_template"
        )
    tokenizer.padding_side = "left"
    eos = eos_token_ids(tokenizer.eos_token_id, model.generation_config.eos_token_id)  # shared with verl's engine
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    model.generation_config = GenerationConfig(eos_token_id=list(eos), pad_token_id=pad_id)  # no hub defaults
    for module in model.modules():  # dropout off: old and new log-probs must see the same network
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.0
    if c.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.to(device)
    return Policy(model, tokenizer, torch.tensor(eos), int(pad_id), device, autocast_dtype)


def load_tokenizer(path, trust_remote_code: bool = False):
    """``AutoTokenizer``, except for a directory saved from a plain ``tokenizers`` tokenizer (the embedded one):
    given a ``config.json`` of model type qwen2, transformers 5 would load it as ``Qwen2Tokenizer`` and replace its
    pre-tokenizer, changing every token id."""
    import json

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    config = Path(path) / "tokenizer_config.json"
    if config.is_file() and json.loads(config.read_text()).get("tokenizer_class") in ("TokenizersBackend",
                                                                                        "PreTrainedTokenizerFast"):
        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)


def _load_data(c: EngineConfig, tokenizer) -> tuple[PromptSet, PromptSet]:
    task_dir = None
    if c.train_files is None or c.val_files is None:
        task_dir = task_files(c.cache_dir, c.task)
    common = dict(
        prompt_key=c.prompt_key, reward_fn_key=c.reward_fn_key, max_prompt_length=c.max_prompt_length,
        filter_overlong_prompts=c.filter_overlong_prompts, truncation=c.truncation, seed=c.data_seed,
        apply_chat_template_kwargs=c.apply_chat_template_kwargs,
    )
    train = load_prompts(c.train_files or [str(task_dir / "train.parquet")], tokenizer, files_key="data.train_files",
                         max_samples=c.train_max_samples, **common)
    val = load_prompts(c.val_files or [str(task_dir / "val.parquet")], tokenizer, files_key="data.val_files",
                       max_samples=c.val_max_samples, **common)
    if len(train) < c.gen_batch_size:
        raise ConfigError(
            f"data.train_files has {len(train)} usable prompts, fewer than data.gen_batch_size={c.gen_batch_size}; "
            "use more data or a smaller data.gen_batch_size"
        )
    return train, val


def _load_score_fn(c: EngineConfig):
    """``dapo.reward.compute_score``, or verl's ``reward.custom_reward_function.{path,name}`` when set; probed once,
    then every score it returns is checked to be finite (``checks.CheckedReward``)."""
    return checks.load_reward_function(c.reward_path, c.reward_name, c.reward_kwargs, c.train_files,
                                       c.reward_timeout_s)
