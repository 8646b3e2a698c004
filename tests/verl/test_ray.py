"""verl's Ray side on CPU, for real: one local Ray (``ray.init(num_cpus=2)``) and verl's TransferQueue.

1. A Ray worker, given only the environment the launcher gives a job (``VERL_USE_EXTERNAL_MODULES``), sees the
   DAPO loss, reward manager and trainer in verl's registries.
2. The DAPO sampler (``trainer.v1.sampler.custom_sampler``) fills train batches from generation rounds held in
   the TransferQueue: groups kept and dropped on accuracy, rounds counted, metrics over every round, the error
   after ``max_num_gen_batches`` rounds, carry-over. The rollout is replaced by ``Rollout`` below, which writes
   trajectories exactly as verl's agent loop does (keys ``{uid}_{session}_{index}``, prompt status tags,
   ``extra_fields.reward_extra_info``); vLLM is GPU-only.
3. The DAPO trainer's overlong filter rewrites the masks in the TransferQueue before the actor update.
"""

from __future__ import annotations

import math
import os
import uuid
from types import SimpleNamespace

import pytest
import torch

ray = pytest.importorskip("ray")
tq = pytest.importorskip("transfer_queue")
from omegaconf import OmegaConf  # noqa: E402
from transfer_queue import KVBatchMeta  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402

from dapo.settings import OverlongSettings, eos_token_ids  # noqa: E402
from recipe.dapo.sampler import DAPOReplayBuffer  # noqa: E402
from recipe.dapo.trainer import DAPOTrainer, advantage_metrics, apply_overlong_filter  # noqa: E402
from tests.conftest import local_ray  # noqa: E402

pytestmark = pytest.mark.slow

G = 4  # responses per prompt
PARTITION = "train"


@pytest.fixture(scope="module")
def ray_tq():
    """A local Ray with 2 CPUs (token auth off for the test), then the TransferQueue on it."""
    with local_ray(num_cpus=2):
        try:
            yield
        finally:
            tq.close()


@pytest.fixture(scope="module")
def transfer_queue(ray_tq, plugin_seen_by_worker):
    # controller + 1 storage unit take the 2 CPUs; started after the worker test has released its CPU
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield
    clear_partition()


def clear_partition():
    keys = list((tq.kv_list(PARTITION) or {}).get(PARTITION, {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id=PARTITION)


@pytest.fixture(scope="module")
def plugin_seen_by_worker(ray_tq):
    @ray.remote(num_cpus=1)
    def registrations():
        import verl  # noqa: F401  loads the plugin named in VERL_USE_EXTERNAL_MODULES
        from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
        from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
        from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY

        return {
            "loss": POLICY_LOSS_REGISTRY.get("dapo").__module__ if "dapo" in POLICY_LOSS_REGISTRY else None,
            "reward_manager": REWARD_MANAGER.get("dapo_paper").__name__ if "dapo_paper" in REWARD_MANAGER else None,
            "trainer": TRAINER_REGISTRY.get("dapo").__name__ if "dapo" in TRAINER_REGISTRY else None,
            "pid": os.getpid(),
        }

    # the job environment the launcher sets, with entry points off: the env var alone must do it
    env = {"VERL_USE_EXTERNAL_MODULES": "recipe.dapo.plugin", "VERL_USE_EXTERNAL_PLUGINS": "none"}
    return ray.get(registrations.options(runtime_env={"env_vars": env}).remote(), timeout=300)


def test_ray_worker_sees_the_registrations(plugin_seen_by_worker):
    seen = plugin_seen_by_worker
    assert seen["pid"] != os.getpid()
    assert seen == {
        "loss": "recipe.dapo.policy_loss",
        "reward_manager": "DAPOPaperRewardManager",
        "trainer": "DAPOTrainer",
        "pid": seen["pid"],
    }


# --------------------------------------------------------------------------- the DAPO sampler


class Rollout:
    """Stands in for verl's agent loop: ``submit(n)`` is the trainer's ``refill_fn``; the next ``finish()`` writes
    the trajectories of every submitted prompt, with the accuracies given by ``plans`` (one list of G per prompt;
    ``None`` makes the group fail)."""

    def __init__(self, plans):
        self.plans = list(plans)
        self.pending: list[tuple[str, list | None]] = []
        self.submitted = 0

    def submit(self, n: int) -> int:
        uids = [str(uuid.uuid4()) for _ in range(n)]
        tags = [{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in uids]
        tq.kv_batch_put(keys=uids, partition_id=PARTITION, tags=tags)
        self.pending += [(uid, self.plans.pop(0)) for uid in uids]
        self.submitted += n
        return n

    def finish(self) -> None:
        keys, fields, tags = [], [], []
        for uid, accs in self.pending:
            for session, acc in enumerate(accs or [1.0]):  # a failed group wrote one trajectory before failing
                keys.append(f"{uid}_{session}_0")
                length = 6
                fields.append(
                    {
                        "responses": torch.full((length,), 5),
                        "response_mask": torch.ones(length, dtype=torch.long),
                        "loss_mask": torch.ones(length, dtype=torch.long),
                        "extra_fields": {
                            "reward_extra_info": {
                                "acc": bool(acc),
                                "score": 1.0 if acc else -1.0,
                                "overlong_reward": -0.5 if session == 0 else 0.0,
                            }
                        },
                    }
                )
                tags.append({"status": "success", "seq_len": 9})
        if keys:
            tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=list_of_dict_to_tensordict(fields), tags=tags)
        for uid, accs in self.pending:
            tq.kv_put(key=uid, partition_id=PARTITION, tag={"status": "finished" if accs else "failure"})
        self.pending = []


class PolledSampler(DAPOReplayBuffer):
    """The sampler, with generation finishing while it polls (verl's poll only sleeps)."""

    def _wait_for_next_poll(self, partition_id, last_debug_time):
        self.rollout.finish()
        return last_debug_time


def make_sampler(rollout, *, train=4, gen=8, max_rounds=3, carry_over=False):
    sampler_kwargs = {
        "filter_groups": {"enable": True, "metric": "acc", "max_num_gen_batches": max_rounds},
        "train_batch_size": train,
        "gen_batch_size": gen,
        "sampling": {"carry_over": carry_over, "max_carry_age": 1},
    }
    sampler = PolledSampler(
        trainer_mode="dapo",
        trainer_config={},
        max_off_policy_threshold=None,
        max_off_policy_strategy="drop",
        sampler_kwargs=sampler_kwargs,
        refill_fn=rollout.submit,
        poll_interval=0.0,
    )
    sampler.rollout = rollout
    return sampler


MIXED, RIGHT, WRONG = [1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]


def uids_of(keys):
    return {key.rsplit("_", 2)[0] for key in keys}


def stored_keys():
    return set((tq.kv_list(PARTITION) or {}).get(PARTITION, {}))


def test_rounds_fill_the_batch_with_mixed_groups(transfer_queue):
    clear_partition()
    # round 1: 8 prompts, 2 mixed; round 2: 8 prompts, 3 mixed and 1 failed -> 5 kept >= 4, done after 2 rounds
    round1 = [MIXED, RIGHT, WRONG, MIXED, WRONG, WRONG, RIGHT, WRONG]
    round2 = [MIXED, WRONG, MIXED, None, WRONG, MIXED, WRONG, WRONG]
    rollout = Rollout(round1 + round2)
    sampler = make_sampler(rollout)
    rollout.submit(4)  # what verl's trainer does at the start of a step (prepare_step: one train batch)
    batch, metrics = sampler.sample(global_steps=1, partition_id=PARTITION, batch_size=4)

    assert rollout.submitted == 16  # 4 by the trainer + 4 to complete round 1 (gen_batch_size 8) + 8 in round 2
    assert len(batch.keys) == 4 * G and len(uids_of(batch.keys)) == 4
    assert metrics["train/num_gen_batches"] == 2
    # groups: generated 8 + 7 (one failed) = 15; kept 2 + 3 = 5; all-correct 2; all-wrong 4 + 4 = 8
    assert metrics["dapo/generated_prompts"] == 15
    assert metrics["dapo/kept_group_frac"] == pytest.approx(5 / 15)
    assert (metrics["dapo/filtered_all_correct"], metrics["dapo/filtered_all_wrong"]) == (2, 8)
    assert (metrics["dapo/surplus_groups"], metrics["dapo/discarded_groups"]) == (1, 1)
    assert metrics["training/rollout_failure/evicted_samples"] == 1
    assert metrics[DAPO_FILTERED_REWARD_COUNTS_KEY] == {1.0: 2, 0.0: 8}
    # every response of both rounds: 5 mixed groups of 2/4 correct, 2 of 4/4, 8 of 0/4 -> 18 / 60
    assert metrics["train/acc/mean"] == pytest.approx(18 / 60)
    assert metrics["dapo/overlong_penalty/mean"] == pytest.approx(-0.5 / 4)  # session 0 of each group: -0.5
    # the TransferQueue holds exactly the batch: dropped, failed and surplus groups and the prompts are cleared
    assert stored_keys() == set(batch.keys)


def test_error_after_max_num_gen_batches(transfer_queue):
    clear_partition()
    rollout = Rollout([WRONG] * 16 + [MIXED] * 8)
    sampler = make_sampler(rollout, max_rounds=2)
    rollout.submit(4)
    with pytest.raises(ValueError, match=r"after 2 generation rounds.*max_num_gen_batches=2"):
        sampler.sample(global_steps=1, partition_id=PARTITION, batch_size=4)
    assert rollout.submitted == 16  # no third round


def test_carry_over_keeps_surplus_for_the_next_step(transfer_queue):
    clear_partition()
    rollout = Rollout([MIXED] * 4 + [MIXED, WRONG])
    sampler = make_sampler(rollout, train=2, gen=4, carry_over=True)
    rollout.submit(2)
    batch1, metrics1 = sampler.sample(global_steps=1, partition_id=PARTITION, batch_size=2)
    assert (metrics1["dapo/surplus_groups"], metrics1["dapo/discarded_groups"]) == (2, 0)
    carried = uids_of(stored_keys()) - uids_of(batch1.keys)
    assert len(carried) == 2  # left in the TransferQueue for step 2
    tq.kv_clear(keys=batch1.keys, partition_id=PARTITION)  # the trainer clears a trained batch

    rollout.submit(2)  # step 2 starts: the trainer submits a train batch, which must still be drained
    batch2, metrics2 = sampler.sample(global_steps=2, partition_id=PARTITION, batch_size=2)
    assert uids_of(batch2.keys) == carried  # the carried groups fill the batch, oldest first
    assert metrics2["dapo/carried_groups"] == 2
    assert metrics2["train/num_gen_batches"] == 1  # the drained round: 1 mixed (carried on), 1 all-wrong
    assert not rollout.pending and rollout.submitted == 6


def test_validation_partition_uses_verls_sampling(transfer_queue):
    clear_partition()
    uid = str(uuid.uuid4())
    tq.kv_put(key=uid, partition_id="val", tag={"is_prompt": True, "status": "finished", "global_steps": 0})
    fields = [
        {"responses": torch.ones(3, dtype=torch.long), "extra_fields": {"reward_extra_info": {"acc": True}}}
        for _ in range(G)
    ]  # constant: kept for val
    tq.kv_batch_put(
        keys=[f"{uid}_{s}_0" for s in range(G)],
        partition_id="val",
        fields=list_of_dict_to_tensordict(fields),
        tags=[{"status": "success"}] * G,
    )
    batch, metrics = make_sampler(Rollout([])).sample(global_steps=0, partition_id="val", batch_size=1)
    assert len(batch.keys) == G and metrics == {}
    tq.kv_clear(keys=batch.keys, partition_id="val")


# --------------------------------------------------------------------------- the DAPO trainer's overlong filter


def put_batch(lengths, eos_at_end, *, padding=(), length_tags=True, groups=None, acc=None, advantages=None):
    """Trajectories of the given lengths; ``eos_at_end[i]`` puts EOS (id 1) as response i's last token. Tags carry
    ``response_len`` as verl's agent loop writes them (``length_tags``); rows in ``padding`` are verl's padding.
    ``groups[i]``: response i's prompt (responses of one prompt share its uid; each its own by default); ``acc[i]``:
    its accuracy in ``extra_fields.reward_extra_info`` as the reward manager writes it (right by default);
    ``advantages[i]``: its advantage (+1 / -1 alternating by default)."""
    uids = [str(uuid.uuid4()) for _ in lengths]
    groups = list(range(len(lengths))) if groups is None else groups
    acc = [True] * len(lengths) if acc is None else acc
    keys, fields, tags = [], [], []
    for i, (length, eos) in enumerate(zip(lengths, eos_at_end)):
        response = torch.full((length,), 7)
        if eos:
            response[-1] = 1
        keys.append(f"{uids[groups[i]]}_{groups[:i].count(groups[i])}_0")
        advantage = (1.0 if i % 2 == 0 else -1.0) if advantages is None else advantages[i]
        fields.append(
            {
                "responses": response,
                "response_mask": torch.ones(length, dtype=torch.long),
                "loss_mask": torch.ones(length, dtype=torch.long),
                # what the update reads besides: response i's tokens at log-prob -0.5 (i + 1), advantage +1 / -1
                "old_log_probs": torch.full((length,), -0.5 * (i + 1)),
                "advantages": torch.full((length,), advantage),
                "extra_fields": {"reward_extra_info": {"acc": acc[i]}},
            }
        )
        tags.append(
            {
                "status": "success",
                **({"response_len": length} if length_tags else {}),
                **({"is_padding": True} if i in padding else {}),
            }
        )
    tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=list_of_dict_to_tensordict(fields), tags=tags)
    return KVBatchMeta(partition_id=PARTITION, keys=keys, tags=tags)


def masks(batch):
    fields = ["response_mask", "loss_mask"]
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    return [m.tolist() for m in data["response_mask"].unbind()], [m.tolist() for m in data["loss_mask"].unbind()]


@pytest.mark.parametrize("length_tags", [True, False])
def test_overlong_filter_zeroes_truncated_masks(transfer_queue, length_tags):
    clear_partition()
    # max length 5: response 0 hit 5 without EOS (truncated); 1 ended with EOS at 5; 2 and 3 stopped early;
    # row 4 is verl's batch padding (never counted, never touched) -> 1 truncated of 4 real responses
    batch = put_batch([5, 5, 3, 2, 5], [False, True, True, False, False], padding={4}, length_tags=length_tags)
    metrics = apply_overlong_filter(batch, eos_token_id=1, max_response_length=5, enable=True)
    # loss tokens: 3 + 2 below the limit, 0 (truncated, masked) + 5 (EOS) at the limit; padding not counted
    assert metrics == {"dapo/overlong_frac": 0.25, "dapo/loss_tokens": 0 + 5 + 3 + 2}
    response_masks, loss_masks = masks(batch)
    assert response_masks == loss_masks == [[0] * 5, [1] * 5, [1] * 3, [1] * 2, [1] * 5]
    clear_partition()


def test_the_share_of_the_advantages_in_groups_of_constant_accuracy(transfer_queue):
    """``dapo/adv/constant_acc_share`` from the update batch in the TransferQueue: a mixed group (right / wrong,
    advantages +1 / -1) and an all-wrong one whose advantages (+0.5 / -0.5) come from the soft punishment alone,
    4 trained tokens each: (0.5 + 0.5) x 4 of (1 + 1 + 0.5 + 0.5) x 4 = 1/3 of the advantage mass."""
    clear_partition()
    batch = put_batch(
        [4, 4, 4, 4],
        [True] * 4,
        groups=[0, 0, 1, 1],
        acc=[True, False, False, False],
        advantages=[1.0, -1.0, 0.5, -0.5],
    )
    metrics = advantage_metrics(batch)
    assert metrics["dapo/adv/constant_acc_share"] == pytest.approx(1 / 3)
    assert math.isfinite(metrics["dapo/entropy/logp_adv_cov"])
    clear_partition()


class RecordingActor:
    """Stands in for the actor worker group (FSDP needs GPUs): records the masks it would train on."""

    def update_actor(self, batch):
        self.seen = masks(batch)
        return {"metrics": {"pg_loss": [0.1], "mfu": [0.5]}}


@pytest.mark.parametrize("enable", [True, False])
def test_dapo_trainer_update_actor_masks_before_the_update(transfer_queue, enable):
    clear_partition()
    cfg = OmegaConf.create(
        {
            "dapo": {"overlong_filter": enable},
            "actor_rollout_ref": {
                "rollout": {"response_length": 4, "n": 1, "temperature": 1.0},
                "actor": {
                    "ppo_mini_batch_size": 2,
                    "calculate_entropy": False,
                    "entropy_coeff": 0.0,
                    "ppo_epochs": 1,
                    "data_loader_seed": 0,
                    "shuffle": False,
                },
            },
        }
    )
    trainer = DAPOTrainer.__new__(DAPOTrainer)  # the trainer's state that _update_actor reads, without Ray workers
    trainer.config, trainer.tokenizer, trainer.actor_rollout_wg = cfg, SimpleNamespace(eos_token_id=1), RecordingActor()
    # what __init__ and _init_tokenizer derive: the overlong settings and the end-of-sequence set
    trainer.overlong = OverlongSettings.from_config(OmegaConf.to_container(cfg))
    trainer.eos_token_ids = eos_token_ids(trainer.tokenizer.eos_token_id, None)
    batch = put_batch([4, 4], [False, True])
    metrics = {}
    trainer._update_actor(batch, metrics)
    assert metrics["dapo/overlong_frac"] == 0.5 and metrics["actor/pg_loss"] == pytest.approx(0.1)
    # the covariance over the trained tokens, after the filter: response 1 alone (constant: 0), or both responses'
    # 4 tokens (log-probs -0.5 / -1.0 around -0.75, advantages +1 / -1: mean(0.25 x 1) = 0.25)
    assert metrics["dapo/entropy/logp_adv_cov"] == pytest.approx(0.0 if enable else 0.25)
    first = [0] * 4 if enable else [1] * 4
    assert trainer.actor_rollout_wg.seen == ([first, [1] * 4], [first, [1] * 4])
    clear_partition()
