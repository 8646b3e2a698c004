"""DAPO on verl 0.9.1: ``python -m recipe.dapo.main_dapo [+experiment=NAME] [key=value ...]``.

The run, top to bottom:

1. setup: Hydra composes ``configs/dapo_trainer.yaml`` (DAPO's deltas over verl's ``ppo_trainer``) with an
   experiment (``configs/experiment/*.yaml``) and the command line; :func:`check_dapo_config` checks what is
   DAPO's (errors name the key to set), then verl's own ``validate_config`` checks the rest; :func:`check_inputs`
   checks the local data files, the custom reward function and the run directory's latest checkpoint (it must be
   one of this run: ``run.json``) before Ray starts;
2. training: verl's ``run_ppo`` with verl's V1 ``TaskRunnerV1`` under the watchdog (``recipe/dapo/watchdog.py``,
   through ``run_ppo``'s ``task_runner_class``). It starts Ray (or joins the cluster of a ``ray job submit``), the
   TransferQueue and ``get_trainer_cls(trainer.v1.trainer_mode)``, which is :class:`recipe.dapo.trainer.DAPOTrainer`
   (``trainer_mode=dapo``), and calls its ``fit()``, which is verl's;
3. cleanup: verl's (tracking finished, TransferQueue closed). How the run ended becomes one line and an exit code
   (``recipe.config.finish``: 0, 1 stopped, 2 refused, 75 watchdog, 130 interrupted); with
   ``dapo.watchdog.max_restarts`` the command reruns itself after a watchdog stop.

DAPO enters through verl's registries, loaded in every Ray worker by ``recipe.dapo.plugin``: the ``dapo`` policy
loss (Clip-Higher, token-level loss), the ``dapo_paper`` reward manager (the paper's scorer, soft overlong
punishment), the ``dapo`` trainer (overlong filtering) and its sampler (dynamic sampling, through
``trainer.v1.sampler.custom_sampler``).

Why the V1 trainer: it is verl 0.9.1's default (``trainer.use_v1=true``); the V0 ``RayPPOTrainer`` path
(``main_ppo_v0.py``) is deprecated and announced for removal. V1 exposes the seams DAPO needs (a trainer
registry, a sampler hook); V0 would need ``fit()`` copied, as the upstream recipe did.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

import recipe.dapo.plugin  # noqa: F401  registers DAPO in this (driver) process; workers load it through verl
from dapo.settings import ConfigError, DapoSettings, EntrySettings, select
from recipe.config import compose, compose_error, config_dir, finish, quiet_verl_import

PLUGIN_MODULE = "recipe.dapo.plugin"


def plugin_delivery() -> str | None:
    """How ``recipe.dapo.plugin`` reaches verl's worker processes: an env var, the entry point, or ``None``."""
    modules = [m.strip() for m in os.getenv("VERL_USE_EXTERNAL_MODULES", "").split(",")]
    if PLUGIN_MODULE in modules:
        return "VERL_USE_EXTERNAL_MODULES"
    policy = os.getenv("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    if policy == "none":
        return None
    allowed = None if policy == "auto" else {name.strip() for name in policy.split(",")}
    for ep in entry_points(group="verl.plugins"):
        if ep.value == PLUGIN_MODULE and (allowed is None or ep.name in allowed):
            return "verl.plugins entry point"
    return None


def check_dapo_config(config: DictConfig) -> DapoSettings:
    """The DAPO settings of ``config`` (:class:`dapo.settings.DapoSettings`, built as the embedded engine builds them);
    raise :class:`ConfigError` naming the key to set when the config cannot train DAPO on verl's V1 trainer."""
    from recipe.dapo.sampler import DynamicSamplingSettings
    from recipe.dapo.trainer import (
        ASYNC_MODES,
        COLOCATE_ASYNC_MODE,
        SEPARATE_ASYNC_MODE,
        TRAINER_MODE,
        require_dapo_sampler,
    )

    plain = OmegaConf.to_container(config, resolve=True)
    settings = DapoSettings.from_config(plain)
    EntrySettings.from_config(plain)  # dapo.reward_timeout_s, before Ray
    train, gen = settings.sampling.train_batch_size, settings.sampling.gen_batch_size
    if not settings.filter.enable and gen != train:  # verl's unfiltered sampler needs whole rounds of the batch
        print(
            f"main_dapo: dynamic sampling is off (algorithm.filter_groups.enable=false): a step generates its "
            f"data.train_batch_size={train} prompts once, so data.gen_batch_size={gen} is set to {train} (as the "
            "embedded engine does)",
            flush=True,
        )
        config.data.gen_batch_size = train
    if not config.trainer.use_v1:
        raise ConfigError(
            "trainer.use_v1=false selects verl's deprecated V0 RayPPOTrainer, which this recipe does not hook; "
            "set trainer.use_v1=true (verl 0.9.1's default)"
        )
    mode = config.trainer.v1.trainer_mode
    overlong_filter = settings.overlong.filter
    if mode in (TRAINER_MODE, *ASYNC_MODES):
        require_dapo_sampler(config)
        if mode == SEPARATE_ASYNC_MODE:
            check_separate_async(config)
    elif mode == "sync":
        if overlong_filter:
            raise ConfigError(
                "dapo.overlong_filter=true needs the DAPO trainer, which masks truncated responses out of the loss; "
                f"set trainer.v1.trainer_mode={TRAINER_MODE} (or dapo.overlong_filter=false for verl's sync trainer)"
            )
    elif mode in ("colocate_async", "separate_async"):
        raise ConfigError(
            f"trainer.v1.trainer_mode={mode} is verl's own asynchronous trainer, without DAPO's overlong filter and "
            f"accuracy filter; set trainer.v1.trainer_mode=dapo_{mode}"
        )
    else:
        raise ConfigError(
            f"trainer.v1.trainer_mode={mode!r} is not a DAPO trainer; set trainer.v1.trainer_mode={TRAINER_MODE} "
            f"(verl's synchronous loop), {COLOCATE_ASYNC_MODE} (its colocated asynchronous loop) or "
            f"{SEPARATE_ASYNC_MODE} (the rollout on its own devices)"
        )
    sampler_kwargs = OmegaConf.to_container(config.trainer.v1.sampler.sampler_kwargs, resolve=True)
    if select(config, "trainer.v1.sampler.custom_sampler.path"):
        if mode in ASYNC_MODES:
            DynamicSamplingSettings.for_async(sampler_kwargs, f"trainer.v1.trainer_mode={mode}")
        else:
            DynamicSamplingSettings.from_kwargs(sampler_kwargs)
    if plugin_delivery() is None:
        raise RuntimeError(
            f"verl's worker processes would not load {PLUGIN_MODULE} (no 'verl.plugins' entry point in this "
            "environment, VERL_USE_EXTERNAL_MODULES unset), so they would not know the 'dapo' loss, the "
            "'dapo_paper' reward manager or the 'dapo' trainer. Install the project on every node "
            f"(pip install -e <repo>) or export VERL_USE_EXTERNAL_MODULES={PLUGIN_MODULE} for a local run; "
            "scripts/train_dapo_qwen32b.sh sets it in the Ray job's runtime environment"
        )
    return settings


def check_separate_async(config: DictConfig) -> None:
    """What verl 0.9.1's ``separate_async`` trainer asserts in its ``__init__`` (``trainer_separate_async.py``), checked
    before Ray starts, each error naming the keys to set."""
    sync_step = int(config.trainer.v1.separate_async.parameter_sync_step)
    train, mini = int(config.data.train_batch_size), int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
    if train != sync_step * mini:
        raise ConfigError(
            f"dapo_separate_async makes trainer.v1.separate_async.parameter_sync_step={sync_step} updates of "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={mini} prompts a step, which must be "
            f"data.train_batch_size={train}; set trainer.v1.separate_async.parameter_sync_step={max(1, train // mini)}"
            " (or the batch sizes)"
        )
    rollout = config.actor_rollout_ref.rollout
    if int(rollout.nnodes) <= 0 or int(rollout.n_gpus_per_node) <= 0:
        raise ConfigError(
            "dapo_separate_async runs the rollout on its own devices: set actor_rollout_ref.rollout.nnodes and "
            f"actor_rollout_ref.rollout.n_gpus_per_node (now {rollout.nnodes} and {rollout.n_gpus_per_node})"
        )
    if rollout.checkpoint_engine.backend == "naive":
        raise ConfigError(
            "dapo_separate_async sends the weights to the rollout's own processes, which checkpoint_engine.backend="
            "naive cannot (it works inside one process): set actor_rollout_ref.rollout.checkpoint_engine.backend to "
            "nccl (GPUs), or to shm with actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module="
            "recipe.dapo.cpu.checkpoint_engine (one machine, host memory)"
        )


def check_inputs(config: DictConfig) -> Path | None:
    """The checks the embedded engine makes before its warm-up, made here before Ray starts (``ConfigError``
    naming the key or file): data files, the custom reward function, the identity of the checkpoint to resume,
    which is returned (``None``: the run starts at step 0)."""
    from recipe.common import checks
    from recipe.common.identity import check_same_run, run_identity
    from recipe.dapo.resume import choose_checkpoint

    plain = OmegaConf.to_container(config, resolve=True, throw_on_missing=False)
    prompt_key, reward_fn_key = (
        select(plain, "data.prompt_key", required=True),
        select(plain, "data.reward_fn_key", required=True),
    )
    for key in ("data.train_files", "data.val_files"):
        files = select(plain, key)
        if files in (None, "", []):
            raise ConfigError(
                f"{key} is not set: the verl engine reads prompts from parquet files in verl's schema (the synthetic "
                "task of configs/embedded.yaml exists on the embedded engine only); write them with "
                f"scripts/prepare_data.py and set {key}=<file>"
            )
        checks.check_data_files(files, key, prompt_key=prompt_key, reward_fn_key=reward_fn_key)
    path = select(plain, "reward.custom_reward_function.path")
    if path:
        checks.load_reward_function(
            path,
            select(plain, "reward.custom_reward_function.name", "compute_score"),
            select(plain, "reward.custom_reward_function.reward_kwargs", {}),
            select(plain, "data.train_files"),
            select(plain, "dapo.reward_timeout_s"),
        )
    latest = choose_checkpoint(config)  # the newest intact checkpoint (a damaged one is named and skipped)
    if latest is not None and latest.is_dir():
        check_same_run(latest, run_identity(config))
    check_rollout_fits(plain)
    for key in ("actor_rollout_ref.model.path", "actor_rollout_ref.model.tokenizer_path"):
        checks.check_model_path(key, select(plain, key))
    return latest


CHECKPOINT_BYTES_PER_PARAMETER = 12  # fp32 weights and AdamW's two moments, what verl's FSDP checkpoint holds


def model_parameters(model_path) -> float | None:
    """About how many parameters the model at ``model_path`` has: from a local ``config.json`` (a Llama-family
    estimate), else from a size in its name (``Qwen/Qwen2.5-32B``: 32e9); ``None`` if neither tells."""
    import json
    import re

    config_file = Path(os.path.expanduser(str(model_path))) / "config.json"
    if config_file.is_file():
        c = json.loads(config_file.read_text())
        try:
            d, layers, inter, vocab = c["hidden_size"], c["num_hidden_layers"], c["intermediate_size"], c["vocab_size"]
        except KeyError:
            return None
        heads = c.get("num_attention_heads", 1)
        head_dim = c.get("head_dim") or d // heads
        kv = c.get("num_key_value_heads", heads)
        per_layer = d * head_dim * (2 * heads + 2 * kv) + 3 * d * inter
        return layers * per_layer + vocab * d * (1 if c.get("tie_word_embeddings") else 2)
    match = re.search(r"(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])", str(model_path))
    return float(match.group(1)) * 1e9 if match else None


def retention_warning(plain: dict) -> str | None:
    """A run that keeps every checkpoint (``trainer.max_actor_ckpt_to_keep=null``, verl's default) of a model of a
    billion parameters or more fills its disk: the warning to print at start, or ``None``."""
    if select(plain, "trainer.max_actor_ckpt_to_keep") is not None or int(select(plain, "trainer.save_freq", -1)) <= 0:
        return None
    params = model_parameters(select(plain, "actor_rollout_ref.model.path"))
    if params is None or params < 1e9:
        return None
    size_gb = params * CHECKPOINT_BYTES_PER_PARAMETER / 1e9
    return (
        f"trainer.max_actor_ckpt_to_keep=null keeps every checkpoint; at about {params / 1e9:.0f}B parameters each one "
        f"is about {size_gb:.0f} GB with its optimizer state (one every trainer.save_freq="
        f"{select(plain, 'trainer.save_freq')} steps): set trainer.max_actor_ckpt_to_keep=3 (the launcher's KEEP_CKPTS)"
    )


TOKENIZER_KEYS = ("actor_rollout_ref.model.tokenizer_path", "actor_rollout_ref.rollout.engine_kwargs.vllm.tokenizer")


def check_rollout_fits(plain: dict) -> None:
    """What verl would refuse only once Ray and vLLM are up, checked before (each error naming the keys): the rollout's
    context (``rollout.max_model_len``) must hold a prompt and a response, and a tokenizer given apart from the model
    (``model.tokenizer_path``, vLLM's ``tokenizer``) must be of that model: a vocabulary larger than the model's, or
    under half of it, is another model's (the model's own is a little smaller where its embedding is padded)."""
    prompt = int(select(plain, "data.max_prompt_length", required=True))
    response = int(select(plain, "data.max_response_length", required=True))
    max_model_len = select(plain, "actor_rollout_ref.rollout.max_model_len")
    if max_model_len is not None and int(max_model_len) < prompt + response:
        raise ConfigError(
            f"actor_rollout_ref.rollout.max_model_len={max_model_len} cannot hold a prompt and a response "
            f"(data.max_prompt_length={prompt} + data.max_response_length={response} = {prompt + response}); set "
            f"actor_rollout_ref.rollout.max_model_len={prompt + response} (or null: the model's own context)"
        )
    model = select(plain, "actor_rollout_ref.model.path")
    config_file = Path(os.path.expanduser(str(model))) / "config.json" if model else None
    if config_file is None or not config_file.is_file():
        return  # a hub id: verl's loader reports it
    import json

    vocab = json.loads(config_file.read_text()).get("vocab_size")
    for key in TOKENIZER_KEYS:
        path = select(plain, key)
        if not vocab or not path or not os.path.isdir(os.path.expanduser(str(path))):
            continue
        from recipe.common.checks import tokenizer_size

        size = tokenizer_size(os.path.expanduser(str(path)))
        if size > vocab or size < vocab / 2:
            raise ConfigError(
                f"{key}={str(path)!r} has {size} tokens, but actor_rollout_ref.model.path={str(model)!r} a vocabulary "
                f"of {vocab}: they belong to different models (another experiment's tokenizer?); set {key}=null "
                "to use the model's own, or point it at the tokenizer saved with that model"
            )


def run_dapo(config: DictConfig) -> None:
    """Train with a composed config (the entry point of ``dapo-train dapo.engine=verl`` too)."""
    # ---- setup: the DAPO settings first, as the embedded engine reads them first (the same message for a bad value)
    try:
        check_dapo_config(config)
    except ValueError as err:  # ConfigError already, or a check naming the key (require_dapo_sampler)
        raise ConfigError(str(err).strip()) from None
    run_dir = select(config, "trainer.default_local_dir")
    local = run_dir and "://" not in str(run_dir)
    if local:  # one run per directory, held by this driver until it ends; taken first, so that a second run is
        # told the directory is busy, not what it makes of the first run's half-written checkpoints
        from recipe.common.rundir import clear_stop, lock_run_dir, unlock_run_dir

        lock_run_dir(Path(os.path.expanduser(str(run_dir))))
    try:
        resumed = check_inputs(config)  # a refused start unlocks, which leaves the directory as it found it
        warning = retention_warning(OmegaConf.to_container(config, resolve=True, throw_on_missing=False))
        if warning:
            print(f"main_dapo: warning: {warning}", flush=True)
        if local:
            clear_stop(run_dir)  # a reason left by a worker of an earlier run of this directory
        _train(config, resumed, run_dir)
    finally:
        if local:
            unlock_run_dir(Path(os.path.expanduser(str(run_dir))))


def _train(config: DictConfig, resumed, run_dir) -> None:
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from recipe.common.tracking import fall_back_to_offline
    from recipe.common.watchdog import WatchdogSettings
    from recipe.dapo import watchdog
    from recipe.dapo.resume import prepare_metrics

    auto_set_device(config)
    try:
        validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    except (ValueError, AssertionError) as err:  # verl's checks name the key; say it in one line
        raise ConfigError(
            f"{err}".strip() or f"verl's validate_config rejected the config ({type(err).__name__})"
        ) from None
    prepare_metrics(config, resumed)  # metrics.jsonl: the records up to the resumed step, each once
    # W&B: verl's Tracking calls wandb.init online in a Ray worker, which waits up to 90 s and then fails the run
    # when the server does not answer; decided here instead, with a bounded probe (offline if it fails)
    fall_back_to_offline(select(config, "trainer.logger", []), run_dir or ".")
    # ---- training and cleanup: verl's V1 task runner under the watchdog; the trainer class comes from
    # trainer.v1.trainer_mode. The driver watches the trainer's heartbeat from a thread of its own.
    watched = watchdog.watch_from_driver(WatchdogSettings.from_config(OmegaConf.to_container(config, resolve=True)))
    from ray.exceptions import RayActorError, RayTaskError

    from recipe.common.rundir import WatchdogStopped

    try:
        run_ppo(config, task_runner_class=watchdog.task_runner_class())
    except RayActorError as err:  # the TaskRunner itself is gone (a worker's death reaches here as RayTaskError)
        if isinstance(err, RayTaskError):  # an error the TaskRunner raised (Ray's RayTaskError(X) is also an X)
            raise
        raise WatchdogStopped(watchdog.trainer_died_line(err, run_dir or ".")) from None
    finally:
        watched.set()  # training returned (or raised): the driver's watch ends with it


PROG = "main_dapo"


@hydra.main(config_path=str(config_dir()), config_name="dapo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    from recipe.common.watchdog import WatchdogSettings
    from recipe.dapo.watchdog import supervise

    run_dir = select(config, "trainer.default_local_dir")
    settings = WatchdogSettings.from_config(OmegaConf.to_container(config, resolve=True))
    code = supervise(settings, run_dir, prog=PROG)  # dapo.watchdog.max_restarts > 0: this process reruns children
    if code is None:
        code = finish(PROG, lambda: run_dapo(config), run_dir, before_line=_stop_ray)
    if code != 0:  # the line is out and Ray is down: no exit hook may print after it (Ray's logs at exit would)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _stop_ray(bound_s: float = 20.0) -> None:
    """``ray.shutdown()`` before the stop line, so that the workers' last output Ray forwards is printed before it
    and not after; bounded (a thread the exit does not wait for): a shutdown that hangs must not hang the exit."""
    import threading

    import ray

    if ray.is_initialized():
        thread = threading.Thread(target=ray.shutdown, name="dapo-ray-shutdown", daemon=True)
        thread.start()
        thread.join(bound_s)


def _precompose(argv: list[str]) -> None:
    """Compose the command line as Hydra is about to, and exit 2 with one line when it cannot (a misspelt key, a
    bad override): Hydra's own report exits 1 with a stack hint. ``hydra.*`` overrides and flags are Hydra's."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    quiet_verl_import()
    config_name, overrides = "dapo_trainer", []
    for arg in argv:
        if arg.startswith(("--config-name=", "-cn=")):
            config_name = arg.split("=", 1)[1].removesuffix(".yaml")
        elif not arg.startswith(("-", "hydra.", "+hydra.", "hydra/")):
            overrides.append(arg)
    if any(a.startswith("-") and not a.startswith(("--config-name=", "-cn=")) for a in argv):
        return  # --multirun, --config-path and the like: leave the whole command line to Hydra
    try:
        compose(overrides, config_name)
    except (HydraException, OmegaConfBaseException, FileNotFoundError) as err:
        print(f"{PROG}: error: {compose_error(err)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    _precompose(sys.argv[1:])
    main()
