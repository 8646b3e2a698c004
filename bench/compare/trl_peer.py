"""TRL 1.16's ``GRPOTrainer`` configured as the embedded engine's DAPO peer, for ``bench.compare.trl_grpo``.

Everything TRL is told is derived from the engine's own config (:class:`recipe.embedded.config.EngineConfig`),
so the two train the same model on the same task with the same hyper-parameters. The mapping:

==========================================  =========================================================
ours (verl's keys)                          TRL ``GRPOConfig``
==========================================  =========================================================
rollout.n = G                               num_generations = G
data.train_batch_size = B prompts           generation_batch_size = B*G (via steps_per_generation)
actor.ppo_micro_batch_size_per_gpu = m      per_device_train_batch_size = m (responses)
actor.ppo_mini_batch_size = b prompts       gradient_accumulation_steps = b*G / m
(B / b mini-batches)                        steps_per_generation = B*G / m  (so B/b optimizer steps per rollout)
actor.ppo_epochs = E                        num_iterations = E
one rollout step = E*B/b AdamW updates      max_steps = rollout steps * E*B/b (TRL counts optimizer steps)
clip_ratio_low / clip_ratio_high            epsilon / epsilon_high (0.2 / 0.28)
loss_agg_mode = token-mean                  loss_type = "dapo"
use_kl_loss = false                         beta = 0 (no reference model)
dapo.overlong_filter = true                 mask_truncated_completions = True
norm_adv_by_std_in_grpo = true              scale_rewards = "group"
reward: dapo.reward.compute_score           reward_funcs[0]: the same function, score (+1 / -1)
  + overlong_buffer_cfg (len, factor)         + trl.rewards.get_soft_overlong_punishment(max_resp_len, len),
                                              weight penalty_factor (checked equal to dapo.shaping.overlong_penalty;
                                              both count the EOS token in a response's length)
optim: AdamW(lr, betas, weight_decay)       optimizers=(the same torch AdamW, ...)
lr_warmup_steps = W rollout steps, then     ... a LambdaLR whose factor is (u // (E*B/b)) / W for update u: the
  constant (stepped once per rollout)         engine's staircase exactly (HF's constant_with_warmup ramps per update)
grad_clip                                   max_grad_norm
rollout.temperature / top_p / top_k         temperature / top_p / top_k (-1 -> 0), repetition_penalty 1.0
data.max_response_length                    max_completion_length
embedded.dtype (fp32 on a CPU by default)   bf16 = embedded.dtype is bfloat16 and it runs here (TRL's CPU
  no gradient checkpointing                   default bf16=True made the tiny model 10-40x slower), and
                                              gradient_checkpointing=False (TRL's default is on)
dropout off                                 disable_dropout=True
==========================================  =========================================================

What cannot be matched (TRL has no knob for it), none of which favours the engine's speed:

1. Dynamic sampling (filter_groups): TRL has none; every generated group is trained on, including constant
   ones (zero advantage, still in the token-mean denominator). So the engine generates more responses per step.
2. The token-mean normaliser: TRL divides by the token count of the whole generation batch / number of
   mini-batches (the mean mini-batch count), the engine by the exact token count of each mini-batch.
3. Mini-batch composition: TRL shuffles the responses of a rollout before splitting it; the engine's mini-batches
   are whole groups in rollout order.
4. Dual clip (clip_ratio_c) for negative advantages: the engine has it, TRL does not (inactive unless the ratio
   exceeds clip_ratio_c = 10).
5. Advantage epsilon: TRL (r - mean) / (std + 1e-4), the engine 1e-6.
6. Data order: both shuffle the train set with the same seed, by different permutations.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from dapo.reward import compute_score
from dapo.shaping import overlong_penalty
from recipe.embedded.policy import bf16_compute


def trl_grpo_kwargs(c, output_dir: str, rollout_steps: int) -> dict:
    """``GRPOConfig`` keyword arguments equivalent to the engine settings ``c`` (an ``EngineConfig``)."""
    g, micro = c.rollout.n, c.actor.ppo_micro_batch_size
    mini_responses, rollout_responses = c.actor.ppo_mini_batch_size * g, c.data.train_batch_size * g
    if rollout_responses % micro or mini_responses % micro:
        raise ValueError(
            f"TRL needs the rollout ({rollout_responses}) and mini-batch ({mini_responses}) response counts to be "
            f"multiples of actor.ppo_micro_batch_size_per_gpu={micro}; choose a micro-batch size that divides both"
        )
    return dict(
        output_dir=output_dir,
        report_to="none",
        seed=c.embedded.seed,
        use_cpu=not torch.cuda.is_available(),
        bf16=bf16_compute(c),  # mixed precision as the engine computes (fp32 for the tiny model)
        fp16=False,
        gradient_checkpointing=False,
        disable_dropout=True,
        # batch geometry: one generation of B*G responses, B/b optimizer steps over it, E passes
        num_generations=g,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=mini_responses // micro,
        steps_per_generation=rollout_responses // micro,
        num_iterations=c.actor.ppo_epochs,
        max_steps=rollout_steps * updates_per_rollout(c),
        shuffle_dataset=c.data.shuffle,
        # DAPO
        loss_type="dapo",
        epsilon=c.dapo.loss.clip_ratio_low,
        epsilon_high=c.dapo.loss.clip_ratio_high,
        beta=0.0,
        mask_truncated_completions=c.dapo.overlong.filter,
        scale_rewards="group" if c.algorithm.norm_adv_by_std_in_grpo else "none",
        # optimisation (the optimizer and schedule themselves are passed in, see run_worker)
        learning_rate=c.actor.lr,
        weight_decay=c.actor.weight_decay,
        max_grad_norm=c.actor.grad_clip,
        # sampling
        max_completion_length=c.data.max_response_length,
        temperature=c.rollout.temperature,
        top_p=c.rollout.top_p,
        top_k=c.rollout.top_k,
        repetition_penalty=1.0,
        # no extra work
        logging_steps=updates_per_rollout(c),
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )


def updates_per_rollout(c) -> int:
    """Optimizer updates per rollout step, the same for both: ppo_epochs x mini-batches."""
    return c.actor.ppo_epochs * (c.data.train_batch_size // c.actor.ppo_mini_batch_size)


class DapoScore:
    """TRL reward function: the engine's scorer (``dapo.reward.compute_score``, or verl's
    ``reward.custom_reward_function`` when set, with its ``reward_kwargs``) on each decoded completion; its
    ``score`` (+1 / -1 for the DAPO scorer), as the engine's reward before shaping."""

    __name__ = "dapo_score"

    def __init__(self, c):
        self.kwargs = c.reward.kwargs
        self.score_fn = compute_score
        if c.reward.path:
            from verl.utils.import_utils import load_extern_object

            self.score_fn = load_extern_object(c.reward.path, c.reward.name)

    def __call__(self, prompts, completions, ground_truth, data_source, **kwargs) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = []
        for source, text, truth in zip(data_source, texts, ground_truth):
            result = self.score_fn(source, text, truth, None, **self.kwargs)
            scores.append(float(result["score"]) if isinstance(result, dict) else float(result))
        return scores


def reward_funcs(c) -> tuple[list, list[float]]:
    """(reward functions, weights): the DAPO score plus, when on, TRL's soft overlong punishment, checked equal
    to ours (``dapo.shaping.overlong_penalty``) for every length up to max_resp_len + 2."""
    funcs, weights = [DapoScore(c)], [1.0]
    o = c.dapo.overlong
    if o.buffer_enable:
        from trl.rewards import get_soft_overlong_punishment

        punish = get_soft_overlong_punishment(o.max_resp_len, o.buffer_len)
        lengths = list(range(o.max_resp_len + 3))
        theirs = torch.tensor(punish([[0] * n for n in lengths])) * o.penalty_factor
        ours = overlong_penalty(
            torch.tensor(lengths),
            max_resp_len=o.max_resp_len,
            overlong_buffer_len=o.buffer_len,
            penalty_factor=o.penalty_factor,
        )
        torch.testing.assert_close(theirs, ours)  # same shaping for every length
        funcs.append(punish)
        weights.append(o.penalty_factor)
    return funcs, weights


def staircase_warmup(optimizer, c):
    """The engine's schedule in optimizer updates: factor r / W during the first W rollout steps r, then 1."""
    per_rollout, warmup = updates_per_rollout(c), c.actor.lr_warmup_steps

    def factor(update: int) -> float:
        rollout = update // per_rollout
        return rollout / warmup if rollout < warmup else 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train_dataset(train_file: str):
    """The engine's train parquet as a TRL conversational dataset (prompt messages, ground_truth, data_source)."""
    import pandas as pd
    from datasets import Dataset

    frame = pd.read_parquet(train_file)
    return Dataset.from_dict(
        {
            "prompt": [[{"role": m["role"], "content": m["content"]} for m in p] for p in frame["prompt"]],
            "ground_truth": [str(rm["ground_truth"]) for rm in frame["reward_model"]],
            "data_source": [str(s) for s in frame["data_source"]],
        }
    )


def load_tokenizer(path: str):
    """The tokenizer saved in ``path``, loaded as the engine loads it, left-padded for TRL's generation."""
    from recipe.embedded.policy import load_tokenizer as engine_load_tokenizer

    tokenizer = engine_load_tokenizer(path)
    tokenizer.padding_side = "left"
    return tokenizer


def run_worker(
    c, model_dir: str, train_file: str, out_dir: Path, rollout_steps: int, snapshot_every: int, turns
) -> dict:
    """Train with TRL for ``rollout_steps`` rollouts; return per-rollout training seconds and snapshot files.

    A rollout step is timed from the start of its first optimizer step (``on_step_begin``, where generation
    happens) to the end of its last (``on_step_end``), so it holds generation, scoring, old log-probs and the
    updates; snapshots are saved after the clock stops. ``turns.take("trl")`` is called before each rollout step
    (the bench's alternation with the engine).
    """
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    funcs, weights = reward_funcs(c)
    args = GRPOConfig(**trl_grpo_kwargs(c, str(out_dir / "trl_output"), rollout_steps), reward_weights=weights)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=c.actor.lr,
        betas=c.actor.betas,
        weight_decay=c.actor.weight_decay,
    )
    per_rollout = updates_per_rollout(c)
    snapshots: dict[int, str] = {}
    rollout_s: list[float] = []
    update_s: list[float] = []  # every optimizer step; the first of a rollout step also generates

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step % per_rollout == 0:  # a rollout step begins: generation happens in this update
                turns.take("trl")
                self.start = time.perf_counter()
            self.update_start = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kwargs):
            update_s.append(time.perf_counter() - self.update_start)
            if state.global_step % per_rollout == 0:  # its last update is done
                rollout_s.append(time.perf_counter() - self.start)
                step = state.global_step // per_rollout
                if step % snapshot_every == 0:  # after the clock: not timed
                    path = out_dir / f"trl_step_{step}.pt"
                    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, path)
                    snapshots[step] = str(path)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=train_dataset(train_file),
        processing_class=tokenizer,
        optimizers=(optimizer, staircase_warmup(optimizer, c)),
        callbacks=[Clock()],
    )
    trainer.train()
    # generation phase of a rollout step (generate, score, old log-probs): its first optimizer step less a plain one
    blocks = [update_s[i : i + per_rollout] for i in range(0, len(update_s), per_rollout)]
    gen_s = [b[0] - statistics.median(b[1:]) if len(b) > 1 else float("nan") for b in blocks]
    return {
        "rollout_s": rollout_s,
        "gen_s": gen_s,
        "update_s": [r - g for r, g in zip(rollout_s, gen_s)],
        "generated": [c.data.train_batch_size * c.rollout.n] * len(rollout_s),
        "updates_per_rollout": per_rollout,
        "snapshots": {str(k): v for k, v in snapshots.items()},
        "lr_last": optimizer.param_groups[0]["lr"],
        "torch_threads": torch.get_num_threads(),
    }
