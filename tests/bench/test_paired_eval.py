"""bench.experiments.paired_eval: the paired interval's arithmetic, the model folders it accepts, and a real evaluation
of two
checkpoints of a tiny run through the embedded engine's validation."""

from __future__ import annotations

import json
import math

import pytest

from bench.experiments import paired_eval
from recipe import cli


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_per_problem_accuracy_and_the_paired_interval(tmp_path):
    # two problems, k = 2: accuracies 1/2 and 0 under the baseline, 1 and 1/2 under the other model
    base = _write(
        tmp_path / "a.jsonl",
        [
            {"input": "p1", "gts": "3", "acc": True},
            {"input": "p1", "gts": "3", "acc": False},
            {"input": "p2", "gts": 4, "acc": False},
            {"input": "p2", "gts": 4, "acc": False},
        ],
    )
    other = _write(
        tmp_path / "b.jsonl",
        [
            {"input": "p2", "gts": 4, "acc": True},
            {"input": "p2", "gts": 4, "acc": False},
            {"input": "p1", "gts": "3", "acc": True},
            {"input": "p1", "gts": "3", "acc": True},
        ],
    )
    a, b = paired_eval.per_problem(base), paired_eval.per_problem(other)
    assert a == {("p1", "3"): 0.5, ("p2", "4"): 0.0} and b == {("p1", "3"): 1.0, ("p2", "4"): 0.5}
    # differences 0.5 and 0.5: mean 0.5, sd 0, so the interval is the point
    assert paired_eval.paired_change(a, b) == (0.5, 0.5, 0.5)
    mean, low, high = paired_eval.mean_interval([0.0, 1.0, 1.0, 0.0], paired_eval.z_quantile_975)
    half = 1.959964 * math.sqrt(1 / 3) / 2  # sd of 0, 1, 1, 0 (n - 1) is sqrt(1/3); over sqrt(4)
    assert (mean, low, high) == pytest.approx((0.5, 0.5 - half, 0.5 + half), rel=0, abs=1e-6)
    assert paired_eval.mean_interval([0.25], paired_eval.z_quantile_975) == (0.25, None, None)  # one problem
    with pytest.raises(SystemExit, match="answered different problems"):
        paired_eval.paired_change(a, {("p1", "3"): 1.0})


def test_model_folders_it_accepts_and_refuses(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"")
    assert paired_eval.resolve_model(hf, "x", tmp_path) == hf
    step = tmp_path / "global_step_3"
    (step / "actor").mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (step / "actor" / name).write_bytes(b"{}")
    assert paired_eval.resolve_model(step, "x", tmp_path) == step / "actor"  # an embedded checkpoint
    with pytest.raises(SystemExit, match="neither a Hugging Face folder"):
        paired_eval.resolve_model(tmp_path / "empty", "x", tmp_path)


@pytest.mark.slow
def test_two_checkpoints_of_a_tiny_run_evaluated_and_compared(tiny_run, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert cli.main(tiny_run(run_dir, {"trainer.save_freq": 1, "trainer.test_freq": -1})) == 0
    evaluation = [o for o in tiny_run() if not o.startswith(("trainer.default_local_dir=", "actor_rollout_ref.rol"))]
    out = tmp_path / "eval"
    args = ["--k", "3", "--out", str(out), "--config-name", "embedded"]
    args += ["--model", f"step2={run_dir / 'global_step_2'}", "--model", f"step1={run_dir / 'global_step_1'}"]
    args += ["--model", f"step2-again={run_dir / 'global_step_2' / 'actor'}", "--", *evaluation]
    assert paired_eval.main(args) == 0

    summary = json.loads((out / "summary.json").read_text())
    assert [summary[m]["problems"] for m in summary] == [16, 16, 16] and summary["step2"]["k"] == 3
    # the same weights sampled with the same seed answer every problem the same way: no change, no spread
    assert (summary["step2-again"]["change_low"], summary["step2-again"]["change_high"]) == (0.0, 0.0)
    step2, step1 = (paired_eval.per_problem(out / m / "0.jsonl") for m in ("step2", "step1"))
    assert all(len(json.loads(line)) == 6 for line in (out / "step1" / "0.jsonl").read_text().splitlines())
    by_hand = sum(step1[p] - step2[p] for p in step2) / len(step2)
    assert summary["step1"]["change"] == pytest.approx(by_hand, rel=0, abs=1e-12)
    assert summary["step1"]["acc"] == pytest.approx(sum(step1.values()) / 16, rel=0, abs=1e-12)

    capsys.readouterr()
    assert paired_eval.main(args) == 0  # a second call reuses every evaluation
    assert capsys.readouterr().out.count("reusing") == 3
