"""The DAPO trainer: verl 0.9.1's synchronous V1 trainer plus overlong filtering, ``trainer.v1.trainer_mode=dapo``.

It subclasses ``verl.trainer.ppo.v1.trainer_sync.PPOTrainerSync`` and overrides one method, ``_update_actor``:
before verl sends the batch to the actor workers, the loss mask of every truncated response is zeroed in the
TransferQueue (paper §3.4, "overlong filtering", Table 1 row 2). Both masks the update reads are rewritten:
``response_mask`` (the loss mask of ``ppo_loss``) and ``loss_mask`` (from which the engine counts the mini-batch's
tokens, the token-mean denominator, before splitting it into micro-batches), so truncated tokens are neither in
the numerator nor in the denominator, whatever the micro-batching.

Why here: verl's policy loss sees only one micro-batch and a token count fixed before it, so it cannot drop a
response from the denominator; the actor update is the last point where the batch is whole. Advantages are
computed before, over every response of the group (truncated ones included, with their shaped reward), as in
the paper; ``actor/entropy`` (computed with the old log-probs) also covers every trained response.

A response is truncated when it reached ``actor_rollout_ref.rollout.response_length`` tokens without an
end-of-sequence token (:func:`dapo.loss.truncated_responses`), the end-of-sequence set being the tokenizer's EOS
plus the model's generation config's (:func:`dapo.settings.eos_token_ids`, the embedded engine's rule too).
Metric: ``dapo/overlong_frac``, the fraction of the step's trained responses that were truncated (masked out when
``dapo.overlong_filter=true``).

Also: ``response/repeat_ngram_frac`` (:func:`dapo.metrics.repeat_ngram_frac`, the embedded engine's metric) over
the same responses, read before the filter rewrites their masks; ``dapo/weight_sync/*`` after verl's old-log-prob
pass (``recipe/dapo/weight_sync.py``); and the sampler's state saved in and restored from verl's checkpoints
(``recipe/dapo/sampler_state.py``).

Dynamic sampling is the sampler's job (``recipe/dapo/sampler.py``, ``trainer.v1.sampler.custom_sampler``).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import ray
import torch
import transfer_queue as tq
from omegaconf import OmegaConf
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.trainer.ppo.v1 import register_trainer
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.padding import response_to_nested

from dapo.loss import overlong_filter_mask, truncated_responses
from dapo.metrics import EntropyWatch, constant_accuracy_share, logprob_advantage_covariance, repeat_ngram_frac
from dapo.settings import EntropyWatchSettings, OverlongSettings, eos_token_ids, select
from recipe.dapo import watchdog
from recipe.dapo.policy_loss import LossWithClipEntropy, clip_entropy_metrics
from recipe.dapo.sampler import reward_extra_info
from recipe.dapo.sampler_state import load_sampler_state, save_sampler_state
from recipe.dapo.verl_patches import accept_flush_in_separate_async_log
from recipe.dapo.weight_sync import weight_sync_metrics

TRAINER_MODE = "dapo"  # verl's sync loop
COLOCATE_ASYNC_MODE = "dapo_colocate_async"  # verl's colocate_async loop: partial rollouts, staleness bound
SEPARATE_ASYNC_MODE = "dapo_separate_async"  # verl's separate_async loop: the rollout on its own devices
ASYNC_MODES = (COLOCATE_ASYNC_MODE, SEPARATE_ASYNC_MODE)
SAMPLER = ("pkg://recipe.dapo.sampler", "DAPOReplayBuffer")


def apply_overlong_filter(
    batch: KVBatchMeta, *, eos_token_id: int | list[int], max_response_length: int, enable: bool
) -> dict[str, float]:
    """Zero ``response_mask`` and ``loss_mask`` of the truncated responses of ``batch`` in the TransferQueue.

    Returns ``dapo/overlong_frac`` over the batch's real (non-padding) responses and ``dapo/loss_tokens``, the
    response tokens the loss counts after the filter (the responses below the limit by their length, the ones at
    the limit by their ``loss_mask`` as written back); with ``enable=False`` only measures. Only responses at the
    length limit are read back from the TransferQueue (their lengths are in
    the tags verl's agent loop writes), so the cost follows the truncated fraction, not the batch.
    """
    real = [not tag.get("is_padding", False) for tag in batch.tags]
    lengths = [tag.get("response_len") for tag in batch.tags]
    if None in lengths:  # trajectories written by something other than verl's agent loop
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["response_mask"])
        lengths = data["response_mask"].offsets().diff().tolist()
    at_limit = [i for i, n in enumerate(lengths) if real[i] and n >= max_response_length]

    num_truncated = 0
    loss_tokens = sum(n for i, n in enumerate(lengths) if real[i] and n < max_response_length)
    if at_limit:
        keys = [batch.keys[i] for i in at_limit]
        fields = ["responses", "response_mask", "loss_mask"]
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=fields)
        nested_mask = data["response_mask"]  # nested [K, j]
        limit_lengths = nested_mask.offsets().diff()  # [K]
        responses = data["responses"].to_padded_tensor(padding=0)  # [K, T]
        positions = torch.arange(responses.shape[-1]).unsqueeze(0) < limit_lengths.unsqueeze(1)  # [K, T]
        truncated = truncated_responses(responses, positions, eos_token_id)  # [K]: at the limit, no EOS
        num_truncated = int(truncated.sum())
        if enable and num_truncated:
            masks = {
                name: response_to_nested(
                    overlong_filter_mask(data[name].to_padded_tensor(padding=0), truncated), nested_mask
                )
                for name in ("response_mask", "loss_mask")
            }
            tq.kv_batch_put(keys=keys, partition_id=batch.partition_id, fields=TensorDict(masks, batch_size=len(keys)))
            loss_tokens += int(masks["loss_mask"].values().sum())
        else:
            loss_tokens += int(data["loss_mask"].values().sum())
    num_real = sum(real)
    return {"dapo/overlong_frac": num_truncated / num_real if num_real else 0.0, "dapo/loss_tokens": loss_tokens}


def advantage_metrics(batch: KVBatchMeta) -> dict[str, float]:
    """The embedded engine's diagnostics of the advantages over the trained tokens, from the batch's real responses in
    the TransferQueue: ``dapo/entropy/logp_adv_cov`` (the covariance of the old log-probs and the advantages,
    ``dapo.metrics.logprob_advantage_covariance``) and, where the reward manager returns ``acc``,
    ``dapo/adv/constant_acc_share`` (``dapo.metrics.constant_accuracy_share``, a group being a prompt ``uid``: the
    first part of a trajectory key ``{uid}_{session}_{index}``)."""
    keys = [key for key, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
    if not keys:
        return {}
    fields = ["old_log_probs", "advantages", "response_mask"]
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=[*fields, "extra_fields"])
    old, adv, mask = (  # [N, T] each
        data[name].to_padded_tensor(padding=0) if data[name].is_nested else data[name] for name in fields
    )
    metrics = {"dapo/entropy/logp_adv_cov": logprob_advantage_covariance(old, adv, mask)}
    acc = [reward_extra_info(value).get("acc") for value in data["extra_fields"]]
    if all(a is not None for a in acc):
        uids = {uid: i for i, uid in enumerate(dict.fromkeys(key.split("_")[0] for key in keys))}
        groups = torch.tensor([uids[key.split("_")[0]] for key in keys])
        metrics["dapo/adv/constant_acc_share"] = constant_accuracy_share(
            adv, mask, torch.tensor([float(a) for a in acc]), groups
        )
    return metrics


def repeat_metrics(batch: KVBatchMeta) -> dict[str, float]:
    """``response/repeat_ngram_frac`` of the batch's real (non-padding) responses, read from the TransferQueue: the
    share of trained responses repeating an n-gram of token ids (the same function and the same responses as the
    embedded engine's metric). Read before :func:`apply_overlong_filter`, which zeroes the truncated ones' masks."""
    keys = [key for key, tag in zip(batch.keys, batch.tags) if not tag.get("is_padding", False)]
    if not keys:
        return {"response/repeat_ngram_frac": 0.0}
    data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["responses", "response_mask"])
    ids = data["responses"].to_padded_tensor(padding=0)  # [N, T]
    mask = data["response_mask"].to_padded_tensor(padding=0)  # [N, T], 1 on the response's tokens
    return {"response/repeat_ngram_frac": repeat_ngram_frac(ids, mask)}


class DAPOStages:
    """What DAPO changes in a verl V1 trainer, whichever its mode: the overlong filter before the actor update, the
    truncated fraction and repetition metrics, the weight-sync check, the sampler's state in checkpoints, and a run
    ending on an error closing its loggers. Mixed into verl's trainer of the mode :attr:`VERL_MODE`."""

    VERL_MODE = "sync"  # the name verl 0.9.1 keys this mode's code paths on

    def __init__(self, config):
        require_dapo_sampler(config)
        self.overlong = OverlongSettings.from_config(OmegaConf.to_container(config, resolve=True))
        from recipe.common.identity import run_identity

        # before verl's __init__, which rewrites data.gen_batch_size to 1 (its dataloader's fetch size) when group
        # filtering is on: the identity must be the run's settings, as main_dapo.check_inputs computes them
        self._run_identity = run_identity(config)
        watch = EntropyWatchSettings.from_config(OmegaConf.to_container(config, resolve=True))
        self.entropy_watch = EntropyWatch(watch.fraction, watch.window)
        super().__init__(config)
        # verl 0.9.1 selects each mode's code paths (TransferQueue checkpoints, prompt persistence, re-issue of
        # in-flight prompts on resume) by trainer_mode == "sync" and its other registry names; this trainer is that
        # mode's trainer registered under another name
        self.trainer_mode = self.VERL_MODE
        # verl's __init__ read it under the configured name (trainer.v1.<dapo name>.parameter_sync_step); init()
        # uses it later (the optimizer's schedule counts parameter_sync_step updates a step)
        self.parameter_sync_step = self._mode_config().get("parameter_sync_step", 1)

    def _mode_config(self):
        """``trainer.v1.<verl's mode name>``: the mode's settings, under verl's name whatever this trainer's."""
        return self.config.trainer.v1.get(self.VERL_MODE, {})

    def fit(self, agent_loop_manager):
        """verl's ``fit``, unchanged, except that the watchdog probes the workers from here on
        (``recipe/dapo/watchdog.py``) and that a run ending on an error (a failing reward function, a starved
        sampler, a dead worker) still closes its loggers before the error leaves this Ray worker: W&B's service would
        otherwise be torn down with a traceback when Ray ends the worker, after the driver's one-line message."""
        watchdog.add_worker_probes(self, agent_loop_manager)
        # the actor's loss logs the entropy of the clipped tokens too (recipe/dapo/policy_loss.py)
        self.actor_rollout_wg.set_loss_fn(LossWithClipEntropy(self.config.actor_rollout_ref.actor))
        exit_code = 1
        try:
            result = super().fit(agent_loop_manager)
            exit_code = 0
            return result
        finally:  # on success too: W&B's atexit teardown in a Ray worker otherwise prints "Connection lost"
            tracking = getattr(self, "logger", None)
            try:
                if tracking is not None and hasattr(tracking, "finish"):
                    tracking.finish(exit_code=exit_code)
                if "wandb" in sys.modules:  # its service process, while this worker can still reach it
                    sys.modules["wandb"].teardown(exit_code=exit_code)
            except Exception:  # noqa: BLE001 - closing is best effort; an error that ended the run is raised
                pass

    # ---- progress, for the watchdog: a step's stages and its validation (the sampler beats for each finished group)
    def on_step_begin(self):
        dog = watchdog.current()
        if dog is not None:
            if dog.step:
                dog.end_step(dog.step)  # the previous step, its checkpoint and validation included
            dog.begin_step(self.global_steps)
        super().on_step_begin()

    def on_validate_end(self):
        watchdog.beat("after validation")
        super().on_validate_end()

    def _init_tokenizer(self):
        # verl 0.9.1's PPOTrainerBase._init_tokenizer (verl/trainer/ppo/v1/trainer_base.py), keeping the model config
        model_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.model)
        self.tokenizer, self.processor = model_config.tokenizer, model_config.processor
        # what ends a response: the tokenizer's EOS and the generation config's (the rule both engines share)
        self.eos_token_ids = response_eos_ids(model_config)

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        metrics.update(repeat_metrics(batch))  # before the filter rewrites the truncated responses' masks
        # ---- DAPO: overlong filtering, truncated responses carry no loss and no token count ----
        metrics.update(
            apply_overlong_filter(
                batch,
                eos_token_id=list(self.eos_token_ids),
                max_response_length=self.config.actor_rollout_ref.rollout.response_length,
                enable=self.overlong.filter,
            )
        )
        metrics.update(advantage_metrics(batch))  # of the tokens this update trains (truncated ones masked out)
        watchdog.beat("actor update")
        batch = super()._update_actor(batch, metrics)
        watchdog.beat("after the actor update")
        return batch

    def _compute_metrics(self, batch: KVBatchMeta, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps, epoch)
        # verl 0.9.1 (trainer/ppo/v1/trainer_base.py, _compute_metrics -> trainer/ppo/metric_utils.py,
        # compute_data_metrics) takes the budget as the batch's padded width, and V1 pads the batch to its longest
        # response: its response_length/clip_ratio counts the responses as long as the longest, truncated or not
        # (0.125 in real-model steps with none truncated: a group of 4 equal responses at the batch's longest).
        # The metric's meaning (dapo.metrics.METRIC_DOCS, the embedded engine's) is the truncated fraction, which
        # the overlong filter counted over the same responses.
        if "dapo/overlong_frac" in metrics:
            metrics["response_length/clip_ratio"] = metrics["dapo/overlong_frac"]
        metrics.update(clip_entropy_metrics(metrics))
        # the sampler names the learning rate if the next step starves after a collapse (dapo.sampling.starved_message)
        lr = float(self.config.actor_rollout_ref.actor.optim.lr)
        self.replay_buffer.last_step_metrics = dict(metrics)
        self.replay_buffer.actor_lr = lr
        clip_high = float(self.config.actor_rollout_ref.actor.clip_ratio_high)
        warning = self.entropy_watch.update(
            global_steps, metrics.get("actor/entropy"), lr=lr, clip_ratio_high=clip_high
        )
        if warning:
            logging.getLogger(__name__).warning(warning)
            print(f"warning: {warning}", flush=True)

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        watchdog.beat("old log-probs")
        batch = super()._compute_old_log_prob(batch, metrics)
        if self.config.actor_rollout_ref.rollout.calculate_log_probs:  # recipe/dapo/weight_sync.py
            # asynchronous modes train responses sampled by earlier weights too: only those sampled entirely by the
            # weights of the last update measure the sync
            version = None if self.VERL_MODE == "sync" else self.global_steps - 1
            metrics.update(weight_sync_metrics(batch, version=version))
        return batch

    def _save_checkpoint(self):
        """verl's checkpoint, plus the sampler's state (``dapo_sampler.pt``, written before verl's
        ``latest_checkpointed_iteration.txt``: recipe/dapo/sampler_state.py) and ``run.json``: what run it belongs
        to, checked by ``main_dapo.check_inputs`` before a later start resumes it."""
        step_dir = Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}"
        save_sampler_state(self.replay_buffer, str(step_dir))
        watchdog.beat("checkpoint")
        super()._save_checkpoint()
        watchdog.beat("after the checkpoint")
        from recipe.common.identity import write_identity

        if step_dir.is_dir():
            write_identity(step_dir, self._run_identity)

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps > 0:  # verl resumed from global_step_{global_steps}
            mode = self.config.trainer.resume_mode
            root = self.config.trainer.resume_from_path if mode == "resume_path" else None
            step_dir = os.path.abspath(
                root or os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
            )
            state = load_sampler_state(self.replay_buffer, step_dir)
            if state is not None:
                print(
                    f"DAPO sampler state restored from {step_dir} (kept-fraction estimate "
                    f"{state['kept_frac_num']:.3g}/{state['kept_frac_den']:.3g}, totals {state['totals']})"
                )


@register_trainer(TRAINER_MODE)
class DAPOTrainer(DAPOStages, PPOTrainerSync):
    """verl's synchronous trainer (``PPOTrainerSync``) with DAPO's stages and sampler
    (``trainer.v1.trainer_mode=dapo``): each step generates rounds until the batch is full of groups with signal,
    then trains on it."""


class _DAPOAsyncBuffer:
    """The asynchronous trainers' replay buffer: verl's, with DAPO's filter and metrics."""

    def _build_replay_buffer(self):
        # verl's asynchronous buffer with DAPO's filter, built from the DAPO sampler's kwargs (the same config key as
        # in sync mode, so one config serves every mode)
        from recipe.dapo.sampler import DAPOAsyncReplayBuffer

        sampler = self.config.trainer.v1.sampler
        mode_config = self._mode_config()  # built inside verl's __init__, before parameter_sync_step is set
        return DAPOAsyncReplayBuffer(
            trainer_mode=self.VERL_MODE,
            trainer_config=mode_config,
            samples_per_step=mode_config.get("parameter_sync_step", 1),
            max_off_policy_threshold=sampler.max_off_policy_threshold,
            max_off_policy_strategy=sampler.max_off_policy_strategy,
            sampler_kwargs=sampler.sampler_kwargs,
            refill_fn=self._add_prompts_to_generate,
        )


@register_trainer(COLOCATE_ASYNC_MODE)
class DAPOColocateAsyncTrainer(_DAPOAsyncBuffer, DAPOStages, PPOTrainerColocateAsync):
    """verl's ``colocate_async`` trainer with DAPO's stages (``trainer.v1.trainer_mode=dapo_colocate_async``).

    The rollout and the actor share the devices and alternate, but the rollout is not drained between steps: a
    step samples the oldest finished groups with signal (:class:`recipe.dapo.sampler.DAPOAsyncReplayBuffer`), the
    unfinished requests are aborted keeping their tokens, the actor trains, and after the weight update they resume
    on the new weights (partial rollouts), beside ``trainer.v1.colocate_async.num_warmup_batches`` extra batches of
    prompts in flight. A group's age is bounded by ``trainer.v1.sampler.max_off_policy_threshold`` steps since its
    prompt was submitted (verl's ``training/off_policy/*`` metrics). Each token keeps the log-prob of the weights that
    sampled it (``rollout_log_probs``), which verl's rollout correction reads (``algorithm.rollout_correction``).
    """

    VERL_MODE = "colocate_async"


@register_trainer(SEPARATE_ASYNC_MODE)
class DAPOSeparateAsyncTrainer(_DAPOAsyncBuffer, DAPOStages, PPOTrainerSeparateAsync):
    """verl's ``separate_async`` trainer with DAPO's stages (``trainer.v1.trainer_mode=dapo_separate_async``).

    The rollout runs on its own devices (``actor_rollout_ref.rollout.nnodes`` x ``n_gpus_per_node`` standalone
    servers) and never waits for the actor: a step makes ``trainer.v1.separate_async.parameter_sync_step`` updates
    of ``actor.ppo_mini_batch_size`` prompts each, sampled as in ``dapo_colocate_async``, then sends the weights
    through ``actor_rollout_ref.rollout.checkpoint_engine`` (which aborts the requests in flight; they resume on
    the new weights). With ``actor_rollout_ref.hybrid_engine=true`` verl also lends the actor's devices to the
    rollout while the actor waits for data.
    """

    VERL_MODE = "separate_async"

    def __init__(self, config):
        accept_flush_in_separate_async_log()
        super().__init__(config)

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        # verl maps the actor to its DetachActorWorker (π_old saved between the local updates of a step); on a
        # CPU its save aliases the live weights, so the actor runs the copying subclass below
        for role, worker in list(self.role_worker_mapping.items()):
            if getattr(worker, "__ray_actor_class__", None) is DetachActorWorker:
                self.role_worker_mapping[role] = ray.remote(CopyingDetachActorWorker)


class CopyingDetachActorWorker(DetachActorWorker):
    """verl 0.9.1's ``DetachActorWorker`` (``verl/experimental/separation/engine_workers.py``) whose saved π_old is a
    copy. Its FSDP2 save (``verl/utils/fsdp_utils.py``, ``fsdp2_sharded_save_to_cpu``) keeps
    ``param._local_tensor.detach().cpu()``, which on a GPU is a copy and on a CPU the live tensor itself: the
    optimizer would update "π_old" in place and every local update after the first would take its old log-probs
    from the newest weights. Tensors that share memory with a parameter are cloned; on a GPU none does."""

    @property
    def copy_handler(self):
        save = super().copy_handler

        def save_copy(module):
            live = {p.data_ptr() for p in _local_tensors(module)}
            return _clone_aliases(save(module), live)

        return save_copy


def _local_tensors(module) -> list[torch.Tensor]:
    return [getattr(p, "_local_tensor", p) for p in module.parameters()]


def _clone_aliases(state, live: set[int]):
    """``state`` (nested dicts, tuples and lists of tensors) with the tensors whose memory is in ``live`` cloned."""
    if isinstance(state, torch.Tensor):
        return state.clone() if state.data_ptr() in live else state
    if isinstance(state, dict):
        return {key: _clone_aliases(value, live) for key, value in state.items()}
    if isinstance(state, (tuple, list)):
        return type(state)(_clone_aliases(value, live) for value in state)
    return state


def response_eos_ids(model_config) -> tuple[int, ...]:
    """:func:`dapo.settings.eos_token_ids` of verl's ``HFModelConfig`` (``actor_rollout_ref.model``, instantiated):
    its tokenizer's EOS and its generation config's (the rollout stops on the latter too)."""
    generation = model_config.generation_config
    return eos_token_ids(model_config.tokenizer.eos_token_id, None if generation is None else generation.eos_token_id)


def require_dapo_sampler(config) -> None:
    """The DAPO trainers take the DAPO sampler's config (the asynchronous one builds its asynchronous buffer from the
    same kwargs); raise naming the keys if it is not set."""
    custom = select(config, "trainer.v1.sampler.custom_sampler") or {}
    path, name = custom.get("path", None), custom.get("name", None)
    if (path, name) != SAMPLER:
        from verl.utils.import_utils import load_extern_object

        from recipe.dapo.sampler import DAPOReplayBuffer

        cls = load_extern_object(path, name) if path and name else None
        if not (isinstance(cls, type) and issubclass(cls, DAPOReplayBuffer)):
            raise ValueError(
                f"trainer.v1.trainer_mode={select(config, 'trainer.v1.trainer_mode')} needs the DAPO sampler, got "
                "trainer.v1.sampler.custom_sampler="
                f"{{path: {path}, name: {name}}}; set trainer.v1.sampler.custom_sampler.path={SAMPLER[0]} and "
                f"trainer.v1.sampler.custom_sampler.name={SAMPLER[1]} (configs/dapo_trainer.yaml does)"
            )
