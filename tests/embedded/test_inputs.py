"""Bad input fails before any expensive work, naming the key or file and the fix; a run never trains the wrong thing.

Each bad input: exit status 2, one ``dapo-train: error: ...`` line (no traceback, printed once), and a refused run
writes nothing to its run directory."""

from __future__ import annotations

import os

import pandas as pd
import pytest
import torch

from recipe import cli
from recipe.common.rundir import LOCK_FILE
from recipe.common.task import AdditionTask
from recipe.config import compose
from recipe.embedded.checkpoint import STATE_FILE, TRACKER
from recipe.embedded.config import ConfigError
from recipe.embedded.guard import UpdateGuard
from tests.conftest import run_process


def _rows(digits: int = 1) -> list[dict]:
    return AdditionTask(digits=digits, val_size=16).rows("train")


def _error(capsys, overrides) -> str:
    assert cli.main(overrides) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("dapo-train: error: ") and "Traceback" not in err + captured.out
    assert err.count("dapo-train: error: ") == 1
    return err


def _snapshot(run_dir) -> dict:
    """Every file under ``run_dir`` with its size and modification time (what a refused run must not change), but
    the run directory's lock, which every start takes before its checks (``recipe.common.rundir``)."""
    if not run_dir.exists():
        return {}
    return {
        str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in run_dir.rglob("*")
        if p.name != LOCK_FILE
    }


# ---------------------------------------------------------------------------------------------------- data files


def _zero_bytes(tmp_path):
    (tmp_path / "zero.parquet").write_bytes(b"")
    return tmp_path / "zero.parquet", "is an empty file (0 bytes)"


def _text_named_parquet(tmp_path):
    (tmp_path / "text.parquet").write_text("question,answer\n1+1,2\n")
    return tmp_path / "text.parquet", "is not a readable parquet file"


def _no_rows(tmp_path):
    pd.DataFrame(_rows()).iloc[:0].to_parquet(tmp_path / "empty.parquet", index=False)
    return tmp_path / "empty.parquet", "has no rows"


def _missing(tmp_path):
    return tmp_path / "nowhere.parquet", "no such file"


def _no_reward_model(tmp_path):
    pd.DataFrame([{k: v for k, v in r.items() if k != "reward_model"} for r in _rows()]).to_parquet(
        tmp_path / "cols.parquet", index=False
    )
    return tmp_path / "cols.parquet", "lacks column(s) ['reward_model']"


@pytest.mark.parametrize("make", [_zero_bytes, _text_named_parquet, _no_rows, _missing, _no_reward_model])
@pytest.mark.parametrize("key", ["data.train_files", "data.val_files"])
def test_bad_data_file_is_named_before_the_warm_up(tiny_run, tmp_path, capsys, make, key):
    path, fragment = make(tmp_path)
    # a cache of its own: had the warm-up started, it would have written there
    cache = tmp_path / "cache"
    err = _error(capsys, tiny_run(extra={key: str(path), "cache_dir": str(cache)}))
    assert f"{key}: {str(path)!r} {fragment}" in err or f"{key}: no such file {str(path)!r}" in err
    assert not (tmp_path / "run").exists() and not cache.exists()


# ---------------------------------------------------------------------------------------------------- reward


def _scorer(tmp_path, body: str):
    path = tmp_path / "scorer.py"
    path.write_text(body)
    return str(path)


@pytest.mark.parametrize(
    "body, name, fragment",
    [
        (None, "compute_score", "reward.custom_reward_function.path='{path}': no such file"),
        (
            "def score(*a, **k):\n    return 1.0\n",
            "compute_score",
            "reward.custom_reward_function.name='compute_score': {path} defines no such function",
        ),
        ("import no_such_module_here\n", "compute_score", "fails to import (ModuleNotFoundError"),
        ("compute_score = 3\n", "compute_score", "is a int, not a function"),
        ("def compute_score(*a, **k):\n    return float('nan')\n", "compute_score", "returned nan on a probe"),
        ("def compute_score(*a, **k):\n    return {'acc': True}\n", "compute_score", "returned {'acc': True} on a"),
        ("def compute_score(*a, **k):\n    raise KeyError('x')\n", "compute_score", "raised KeyError: 'x' on a probe"),
    ],
)
def test_bad_reward_function_is_named_before_the_warm_up(tiny_run, tmp_path, capsys, body, name, fragment):
    path = str(tmp_path / "missing.py") if body is None else _scorer(tmp_path, body)
    cache = tmp_path / "cache"
    extra = {
        "reward.custom_reward_function.path": path,
        "reward.custom_reward_function.name": name,
        "cache_dir": str(cache),
    }
    err = _error(capsys, tiny_run(extra=extra))
    assert fragment.replace("{path}", path) in err
    assert not (tmp_path / "run").exists() and not cache.exists()


@pytest.mark.slow
def test_non_finite_reward_in_training_stops_naming_the_function(tiny_run, tmp_path, capsys):
    # finite on the probe (the first row's own answer, and an empty response), NaN on what the model writes
    path = _scorer(
        tmp_path,
        "import math\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if solution_str in ('', 'Answer: ' + str(ground_truth)):\n"
        "        return 1.0\n"
        "    return math.nan\n",
    )
    extra = {"reward.custom_reward_function.path": path, "trainer.val_before_train": False}
    assert cli.main(tiny_run(extra=extra)) == 1  # stopped by the function, not by the config
    err = capsys.readouterr().err
    assert err.startswith("dapo-train: stopped: ") and "Traceback" not in err
    assert f"reward.custom_reward_function ({path}:compute_score) returned nan on the row data_source=" in err
    assert "max_num_gen_batches" not in err  # not a sampling diagnosis
    assert not (tmp_path / "run" / TRACKER).exists()


def test_update_guard_stops_a_step_with_no_update_and_a_run_with_none():
    guard = UpdateGuard()
    guard.record(applied=True)
    guard.record(applied=False)
    guard.end_step(1)  # one of two applied: the step trained, the run goes on
    guard.record(applied=False)
    guard.record(applied=False)
    with pytest.raises(ConfigError, match="step 2: all 2 policy updates were skipped .*actor.optim.lr"):
        guard.end_step(2)
    UpdateGuard().end_run(0)  # nothing to train (val_only, or a finished run): fine
    with pytest.raises(ConfigError, match="3 steps ran but no policy update was applied"):
        UpdateGuard().end_run(3)


@pytest.mark.slow
def test_a_diverged_policy_stops_naming_the_learning_rate(tiny_run, tmp_path, capsys):
    # lr 1e30: the first AdamW step (clipped gradient, step size ~ lr) sends the weights to ~1e30; the next update
    # of step 1 is skipped for a non-finite gradient (one of two applied: the run goes on), and step 2 stops: its
    # sampling meets non-finite probabilities (torch.multinomial refuses them), or, with a sampler that does not
    # refuse them, all its updates are skipped
    extra = {
        "actor_rollout_ref.actor.optim.lr": 1e30,
        "algorithm.filter_groups.enable": False,
        "trainer.val_before_train": False,
        "trainer.total_training_steps": 3,
        "trainer.test_freq": -1,
    }
    err = _error(capsys, tiny_run(extra=extra))
    assert (
        "step 2: the policy's probabilities are no longer finite" in err
        or "step 2: all 2 policy updates were skipped" in err
    ), err
    assert "lower actor_rollout_ref.actor.optim.lr" in err


# ---------------------------------------------------------------------------------------------------- run identity


@pytest.mark.slow
def test_resuming_a_different_run_is_refused_and_a_finished_run_says_so(tiny_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    extra = {"trainer.total_training_steps": 1, "trainer.save_freq": 1, "trainer.val_before_train": False}
    assert cli.main(tiny_run(run_dir, extra)) == 0
    capsys.readouterr()
    before = _snapshot(run_dir)

    # another learning rate, another data file: a different run, refused before anything is loaded or written
    rows = tmp_path / "other.parquet"
    pd.DataFrame(_rows()[:20]).to_parquet(rows, index=False)
    changed = {**extra, "actor_rollout_ref.actor.optim.lr": 3e-4, "data.train_files": str(rows)}
    err = _error(capsys, tiny_run(run_dir, changed))
    assert f"{run_dir / 'global_step_1'} is a checkpoint of a different run" in err
    assert "actor_rollout_ref.actor.optim.lr: 0.0001 there, 0.0003 now" in err
    assert f'data.train_files: null there, ["{rows}"] now' in err
    for fix in ("trainer.experiment_name=", "trainer.default_local_dir=", "trainer.resume_mode=disable"):
        assert fix in err
    assert _snapshot(run_dir) == before
    # the same data path rewritten with other rows is other data too
    pd.DataFrame(_rows()[:30]).to_parquet(rows, index=False)
    assert cli.main(tiny_run(run_dir, {**changed, "trainer.resume_mode": "disable"})) == 0
    capsys.readouterr()
    pd.DataFrame(_rows()[:20]).to_parquet(rows, index=False)
    err = _error(capsys, tiny_run(run_dir, changed))
    assert "data.train_files (rows): [30] there, [20] now" in err
    assert cli.main(tiny_run(run_dir, {**extra, "trainer.resume_mode": "disable"})) == 0  # the first run again
    capsys.readouterr()
    before = _snapshot(run_dir)

    # the same command again: the run is complete, exit 0, nothing trained, no progress bar, nothing written
    assert cli.main(tiny_run(run_dir, {**extra, "embedded.progress_bar": True})) == 0
    captured = capsys.readouterr()
    assert "this run is complete" in captured.out and "step 1 of trainer.total_training_steps=1" in captured.out
    assert "warm-up" not in captured.out and "step/s" not in captured.err and "1/1" not in captured.err
    assert _snapshot(run_dir) == before

    # a longer run of the same identity resumes it; so does resume_mode=disable with the changed settings start over
    assert cli.main(tiny_run(run_dir, {**extra, "trainer.total_training_steps": 2})) == 0
    assert f"resumed from {run_dir / 'global_step_1'} (step 1)" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------------- checkpoints


@pytest.mark.slow
@pytest.mark.parametrize("damaged", [STATE_FILE, "actor/model.safetensors"])
def test_a_damaged_latest_checkpoint_is_named_and_the_previous_one_resumed(tiny_run, tmp_path, capsys, damaged):
    run_dir = tmp_path / "run"
    extra = {
        "trainer.total_training_steps": 2,
        "trainer.save_freq": 1,
        "trainer.val_before_train": False,
        "trainer.max_actor_ckpt_to_keep": 3,
    }
    assert cli.main(tiny_run(run_dir, extra)) == 0
    capsys.readouterr()
    target = run_dir / "global_step_2" / damaged
    size = target.stat().st_size
    with target.open("r+b") as f:  # cut short, as a full disk or an interrupted copy leaves it
        f.truncate(size // 2)

    assert cli.main(tiny_run(run_dir, {**extra, "trainer.total_training_steps": 3})) == 0
    out = capsys.readouterr().out
    assert f"checkpoint {run_dir / 'global_step_2'} is damaged and skipped: {target}" in out
    assert f"resuming from {run_dir / 'global_step_1'}, the newest intact checkpoint" in out
    assert f"resumed from {run_dir / 'global_step_1'} (step 1)" in out
    assert (run_dir / TRACKER).read_text() == "3"
    assert (run_dir / "global_step_2" / damaged).stat().st_size == os.path.getsize(target) != size // 2


# ---------------------------------------------------------------------------------------------------- verl engine


def _verl(tmp_path, parquet, extra=()) -> list[str]:
    """The verl engine's config with local files; the checks run before verl's device set-up and Ray."""
    return [
        "--config-name",
        "dapo_trainer",
        f"data.train_files={parquet}",
        f"data.val_files={parquet}",
        f"trainer.default_local_dir={tmp_path / 'verl-run'}",
        *extra,
    ]


def test_verl_engine_checks_data_and_reward_before_ray(tmp_path, capsys):
    parquet = tmp_path / "train.parquet"
    pd.DataFrame(_rows()).to_parquet(parquet, index=False)
    (tmp_path / "text.parquet").write_text("not parquet")
    err = _error(capsys, _verl(tmp_path, parquet, [f"data.val_files={tmp_path / 'text.parquet'}"]))
    assert f"data.val_files: {str(tmp_path / 'text.parquet')!r} is not a readable parquet file" in err
    scorer = _scorer(tmp_path, "def compute_score(*a, **k):\n    return float('inf')\n")
    err = _error(capsys, _verl(tmp_path, parquet, [f"reward.custom_reward_function.path={scorer}"]))
    assert f"reward.custom_reward_function ({scorer}:compute_score) returned inf on a probe" in err
    # the embedded config has no data files: said in one line, not verl's traceback
    err = _error(capsys, ["dapo.engine=verl"])
    assert "data.train_files is not set: the verl engine reads prompts from parquet files" in err


def test_verl_engine_refuses_a_checkpoint_of_another_run(tmp_path, capsys):
    from omegaconf import OmegaConf

    from recipe.common.identity import run_identity, write_identity

    parquet = tmp_path / "train.parquet"
    pd.DataFrame(_rows()).to_parquet(parquet, index=False)
    # a checkpoint as verl 0.9.1 lays it out, with the run.json DAPOTrainer._save_checkpoint adds (lr 1e-6)
    earlier = compose(_verl(tmp_path, parquet, ["actor_rollout_ref.actor.optim.lr=1e-6"])[2:], "dapo_trainer")
    step = tmp_path / "verl-run" / "global_step_5"
    (step / "actor").mkdir(parents=True)
    torch.save({}, step / "data.pt")  # intact, as far as recipe.dapo.resume.checkpoint_damage can tell
    write_identity(step, run_identity(earlier))
    (tmp_path / "verl-run" / "latest_checkpointed_iteration.txt").write_text("5")
    before = _snapshot(tmp_path / "verl-run")

    now = _verl(tmp_path, parquet, ["actor_rollout_ref.actor.optim.lr=2e-6"])
    err = _error(capsys, now)
    assert f"{step} is a checkpoint of a different run" in err
    assert "actor_rollout_ref.actor.optim.lr: 1e-06 there, 2e-06 now" in err
    assert _snapshot(tmp_path / "verl-run") == before
    assert OmegaConf.select(earlier, "trainer.resume_mode") == "auto"


@pytest.mark.slow
def test_main_dapo_says_a_bad_input_in_one_line(tmp_path):
    import sys

    missing = tmp_path / "nowhere.parquet"
    result = run_process(
        [sys.executable, "-m", "recipe.dapo.main_dapo", f"data.train_files={missing}"], cwd=tmp_path, timeout=300
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"main_dapo: error: data.train_files: no such file {str(missing)!r}; set data.train_files to an existing "
        "parquet file in verl's schema: data_source, prompt[{role, content}], ability, reward_model{ground_truth, "
        "style}, extra_info (scripts/prepare_data.py writes it)"
    )
    assert "Traceback" not in result.stderr and result.stderr.count("error:") == 1


def test_identity_differences_name_each_changed_key(tmp_path, capsys):
    from recipe.common.identity import check_same_run, differences, write_identity

    recorded = {"data.train_files": ["/d/a.parquet"], "data.train_files (rows)": [100], "optim.lr": 1e-4}
    assert differences(recorded, dict(recorded)) == []
    assert differences(recorded, {**recorded, "optim.lr": 2e-4}) == ["optim.lr: 0.0001 there, 0.0002 now"]
    # a row count one side could not read (the file is local to another node) is not a difference; a path is
    assert differences(recorded, {**recorded, "data.train_files (rows)": [None]}) == []
    moved = {**recorded, "data.train_files": ["/d/b.parquet"], "data.train_files (rows)": [None]}
    assert differences(recorded, moved) == ['data.train_files: ["/d/a.parquet"] there, ["/d/b.parquet"] now']
    # a checkpoint from before identities were recorded is resumed, with a warning
    check_same_run(tmp_path, recorded)
    assert "records no run identity" in capsys.readouterr().out
    write_identity(tmp_path, recorded)
    with pytest.raises(ConfigError, match="is a checkpoint of a different run \\(optim.lr: 0.0001 there, 0.001 now\\)"):
        check_same_run(tmp_path, {**recorded, "optim.lr": 1e-3})


def test_a_checkpoint_recorded_under_the_former_embedded_labels_is_the_same_run(tmp_path):
    # checkpoints written while the tiny model's settings lived under embedded.* recorded those labels; the same
    # settings under tiny.* (configs/tiny.yaml) are the same run, and a changed value is still named
    import json

    from recipe.common.identity import check_same_run, run_identity

    current = run_identity(compose(["tiny.warmup.steps=50"], "embedded"))
    assert {"tiny.task", "tiny.model", "tiny.warmup"} <= set(current)
    former = {
        {"tiny.task": "embedded.task", "tiny.model": "embedded.model", "tiny.warmup": "embedded.warmup"}.get(k, k): v
        for k, v in current.items()
    }
    (tmp_path / "run.json").write_text(json.dumps(former))
    check_same_run(tmp_path, current)
    with pytest.raises(ConfigError, match=r"tiny.warmup: \{.*\"steps\": 50.*\} there, \{.*\"steps\": 60.*\} now"):
        check_same_run(tmp_path, run_identity(compose(["tiny.warmup.steps=60"], "embedded")))


def test_a_model_link_repointed_at_another_model_is_another_run(tmp_path):
    # the verl CPU run reads its model through <cache_dir>/verl-cpu/model, a link that recipe.dapo.cpu.prepare
    # repoints when tiny.* changes: the same link to another model is another run, named by the folder it reaches
    import os

    from recipe.common.identity import MODEL_TARGET, check_same_run, run_identity, write_identity

    for name in ("warmup-a", "warmup-b"):
        (tmp_path / name).mkdir()
    link = tmp_path / "model"
    link.symlink_to(tmp_path / "warmup-a")
    config = compose([f"actor_rollout_ref.model.path={link}"], "dapo_trainer")
    recorded = run_identity(config)
    assert recorded[MODEL_TARGET] == os.path.realpath(tmp_path / "warmup-a")
    write_identity(tmp_path, recorded)
    check_same_run(tmp_path, run_identity(config))
    link.unlink()
    link.symlink_to(tmp_path / "warmup-b")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.model.path \(target\): .*warmup-a.* there, .*warmup-b"):
        check_same_run(tmp_path, run_identity(config))
    # a checkpoint recorded before the target was kept is compared by the path alone; a plain folder records none
    write_identity(tmp_path, {k: v for k, v in recorded.items() if k != MODEL_TARGET})
    check_same_run(tmp_path, run_identity(config))
    plain = compose([f"actor_rollout_ref.model.path={tmp_path / 'warmup-a'}"], "dapo_trainer")
    assert MODEL_TARGET not in run_identity(plain)
