"""Start against end on the same problems: held-out accuracy of several models, ``k`` samples a problem, and each
model's change from the first with a paired 95% interval over the problems.

A training run validates with one sample a problem and compares the first and last validation as two independent samples
(``bench.experiments.real_model``): the interval of the rise is then as wide as the spread between problems. Here every
model answers every problem ``k`` times, and the change is taken per problem (its accuracy under the model minus under
the first model), so that what varies between problems cancels and what is left is the model's doing and the sampling's
``k``-fold-averaged noise.

Each model is one validation run of the embedded engine (``trainer.val_only=true``, ``rollout.val_kwargs.n=k``,
``trainer.validation_data_dir``), so every model is sampled by the same code at the same ``val_kwargs``
(temperature, top-p) and scored by the same scorer, whichever engine trained it. A model is any of:

- a Hugging Face folder (``config.json`` and safetensors): the start model, ``make model``'s ``run/model``;
- an embedded checkpoint (``global_step_N``: its ``actor/`` is such a folder);
- a verl checkpoint (``global_step_N`` or its ``actor/``: FSDP shards): merged first with verl's own
  ``python -m verl.model_merger merge --backend fsdp`` into ``<out>/<label>-hf``.

Run: python -m bench.experiments.paired_eval --model LABEL=DIR [--model LABEL=DIR ...] [--k 8] [--out DIR]
     [--config-name embedded_smollm2] [-- key=value ...]
The first ``--model`` is the baseline. Each model's responses are kept under ``<out>/<label>/0.jsonl`` and reused
by a later call with the same model, ``k`` and overrides. Cost: ``k`` times one validation (on 2 CPU cores, about
2 minutes for the 256 word problems at k = 1).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.common import mean_interval, print_table, write_json, z_quantile_975


def resolve_model(directory: Path, label: str, out: Path) -> Path:
    """A Hugging Face folder for ``directory`` (see the module docstring), merging a verl checkpoint once."""
    directory = Path(directory)
    if (directory / "actor").is_dir():
        directory = directory / "actor"
    if any(directory.glob("model_world_size_*_rank_0.pt")):
        target = out / f"{label}-hf"
        if not (target / "config.json").is_file():
            command = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp"]
            command += ["--local_dir", str(directory), "--target_dir", str(target)]
            print(f"merging the verl checkpoint: {' '.join(command)}", flush=True)
            subprocess.run(command, check=True)
        return target
    if (directory / "config.json").is_file() and any(directory.glob("*.safetensors")):
        return directory
    raise SystemExit(
        f"{directory} is neither a Hugging Face folder (config.json and *.safetensors), nor an embedded or verl "
        "checkpoint (global_step_N/actor); pass a model folder or a run's global_step_N"
    )


def model_name(model: Path, out: Path) -> str:
    """The model as an answer file's identity names it: its path relative to ``out`` when it lies inside (a run's
    checkpoint, so that answers kept with the run are reused from another checkout of it), else its resolved path."""
    model, out = Path(model).resolve(), Path(out).resolve()
    return str(model.relative_to(out)) if model.is_relative_to(out) else str(model)


def answers_file(out: Path, label: str) -> Path:
    """Where :func:`evaluate` keeps a model's answers: ``<out>/<label>/0.jsonl``."""
    return Path(out) / label / "0.jsonl"


def evaluate(model: Path, label: str, out: Path, k: int, config_name: str, overrides: list[str]) -> Path:
    """``<out>/<label>/0.jsonl``: every validation problem answered ``k`` times by ``model`` (reused when the
    model, ``k`` and the overrides are those of the call that wrote it, :func:`model_name`; the model need not be
    there any more)."""
    responses = answers_file(out, label)
    identity = {"model": model_name(model, out), "k": k, "config_name": config_name, "overrides": overrides}
    stamp = out / label / "identity.json"
    if responses.is_file() and stamp.is_file() and json.loads(stamp.read_text()) == identity:
        print(f"{label}: reusing {responses}", flush=True)
        return responses
    command = [sys.executable, "-m", "recipe.cli", "--config-name", config_name]
    command += [
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.rollout.val_kwargs.n={k}",
        "trainer.val_only=true",
        "trainer.resume_mode=disable",
        "trainer.logger=[console]",
        "embedded.progress_bar=false",
        f"trainer.default_local_dir={out / label / 'run'}",
        f"trainer.validation_data_dir={out / label}",
        *overrides,
    ]
    print(f"{label}: {' '.join(command)}", flush=True)
    subprocess.run(command, check=True)
    stamp.write_text(json.dumps(identity, indent=1))
    return responses


def per_problem(responses: Path) -> dict[tuple[str, str], float]:
    """``{(prompt, ground truth): accuracy over its responses}`` from a ``validation_data_dir`` file."""
    answers: dict[tuple[str, str], list[bool]] = {}
    for line in Path(responses).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            answers.setdefault((record["input"], str(record["gts"])), []).append(bool(record["acc"]))
    return {key: sum(accs) / len(accs) for key, accs in answers.items()}


def paired_change(base: dict, other: dict) -> tuple[float, float, float]:
    """``other`` minus ``base``, problem by problem, and its 95% interval over the problems."""
    if base.keys() != other.keys():
        raise SystemExit(
            f"the two evaluations answered different problems ({len(base.keys() ^ other.keys())} differ): "
            "evaluate both with the same data.val_files and data.val_max_samples"
        )
    return mean_interval([other[key] - base[key] for key in base], z_quantile_975)


def _with_interval(value: float, low: float | None, high: float | None, spec: str) -> str:
    """``value [low, high]``, or the value alone where one problem leaves the interval undefined."""
    return format(value, spec) + ("" if low is None else f" [{low:{spec}}, {high:{spec}}]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", required=True, metavar="LABEL=DIR", help="the first: baseline")
    parser.add_argument("--k", type=int, default=8, help="responses a problem (rollout.val_kwargs.n)")
    parser.add_argument("--out", type=Path, default=Path("runs/paired-eval"))
    parser.add_argument("--config-name", default="embedded_smollm2")
    parser.add_argument("--json", type=Path, default=None, help="the table as JSON (default <out>/summary.json)")
    parser.add_argument("overrides", nargs="*", help="key=value for every evaluation (after --)")
    args = parser.parse_args(argv)
    models = [spec.split("=", 1) for spec in args.model]
    if any(len(m) != 2 for m in models):
        parser.error("--model takes LABEL=DIR")
    args.out.mkdir(parents=True, exist_ok=True)

    accuracy = {}
    for label, directory in models:
        model = resolve_model(Path(directory), label, args.out)
        accuracy[label] = per_problem(evaluate(model, label, args.out, args.k, args.config_name, args.overrides))

    base_label = models[0][0]
    rows, summary = [], {}
    for label, directory in models:
        acc, low, high = mean_interval(list(accuracy[label].values()), z_quantile_975)
        entry = {"model": directory, "problems": len(accuracy[label]), "k": args.k, "acc": acc}
        entry.update(acc_low=low, acc_high=high)
        change = ""
        if label != base_label:
            diff, dlow, dhigh = paired_change(accuracy[base_label], accuracy[label])
            entry.update(change=diff, change_low=dlow, change_high=dhigh)
            change = _with_interval(diff, dlow, dhigh, "+.3f")
        summary[label] = entry
        rows.append([label, _with_interval(acc, low, high, ".3f"), change])
    print_table(["model", f"avg@{args.k} [95%]", f"change from {base_label}, paired [95%]"], rows)
    write_json(args.json or args.out / "summary.json", summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
