"""A run's start model at the rollout's sampling: can each technique act on it?

Loads the start model of an embedded config: the warmed-up tiny model every row of
``bench/experiments/ablation/`` begins from
(``configs/ablation_long.yaml``, the default; built and cached first if missing), or the model at
``actor_rollout_ref.model.path`` with the config's ``data.val_files`` (``--config-name embedded_smollm2``: the real
model, sampled in bf16 where the config computes in it, as the engine does), plus any ``key=value`` overrides.
It samples ``rollout.n`` responses for each held-out validation problem at the rollout's temperature and top_p
(1.0 and 1.0 by default: the training rollout, not validation's top_p 0.7) with the ``data.max_response_length``
budget, and reports what the techniques need to find there:

  accuracy           the share of correct responses (``dapo.reward``), overall and by number of operations
  mixed groups       the share of groups with some right and some wrong responses (dynamic sampling keeps these)
  length             quantiles of the response length in tokens (EOS included)
  in format          the share of responses with an ``Answer:`` line (what the scorer reads)
  truncated          the share of responses cut at the budget (overlong filtering masks these)
  in buffer          the share of responses ending in the overlong buffer (the soft punishment acts on these)
  repeated line      the share of responses that write one line twice (a low-quality long pattern)

Run: python -m bench.experiments.ablation_start [--config-name NAME] [--problems N] [--json PATH] [key=value ...]
"""

from __future__ import annotations

import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from bench.common import parser, print_table, write_json

ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")  # the line dapo.reward reads
# bench.experiments.ablation's default; ablation: 3-digit operands; ablation_chain: the chain task
CONFIG_NAME = "ablation_long"


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, repeats=False)
    p.add_argument("--problems", type=int, default=128, help="held-out problems to sample (of tiny.task.val_size)")
    p.add_argument("--config-name", default=CONFIG_NAME, help="the config under configs/ (default: ablation_long)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (verl's names)")
    args = p.parse_args(argv)

    import pandas as pd
    from transformers import AutoModelForCausalLM

    from dapo.loss import truncated_responses
    from dapo.reward import compute_score
    from dapo.settings import eos_token_ids
    from recipe.config import compose
    from recipe.embedded.config import read_config
    from recipe.embedded.decode import sample
    from recipe.embedded.policy import bf16_compute, load_tokenizer, low_precision_copy
    from recipe.embedded.rollout import SamplingParams

    c = read_config(compose(args.overrides, args.config_name))
    torch.set_num_threads(c.embedded.num_threads or torch.get_num_threads())
    torch.manual_seed(c.embedded.seed)
    if c.model.path is not None:  # a real model and its own data files
        model_dir, val_file = Path(c.model.path), (c.data.val_files or [None])[0]
    else:
        model_dir = c.tiny.model_dir(torch.device("cpu"))
        val_file = c.data.val_files[0] if c.data.val_files else c.tiny.task_dir() / "val.parquet"
    tokenizer = load_tokenizer(model_dir)  # as the engine loads it (AutoTokenizer would change the pre-tokenizer)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    eos = torch.tensor(eos_token_ids(tokenizer.eos_token_id, model.generation_config.eos_token_id))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else int(eos[0])
    if bf16_compute(c):  # as the engine samples with bf16 compute
        model = low_precision_copy(model, torch.bfloat16)
    rows = pd.read_parquet(val_file).head(args.problems).to_dict("records")
    prompts = [
        torch.tensor(
            tokenizer(
                tokenizer.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False),
                add_special_tokens=False,
            )["input_ids"]
        )
        for r in rows
    ]
    start = time.perf_counter()
    with torch.no_grad():
        ids, mask, _ = sample(
            model,
            prompts,
            n=c.rollout.n,
            params=SamplingParams(True, c.rollout.temperature, c.rollout.top_p, c.rollout.top_k),
            max_new_tokens=c.data.max_response_length,
            eos_ids=eos,
            pad_id=pad_id,
            max_num_seqs=c.rollout.max_num_seqs,
        )  # [B*n, T]
    seconds = time.perf_counter() - start
    lengths = mask.sum(-1).tolist()  # [B*n] tokens, EOS included
    ended = (~truncated_responses(ids, mask, eos)).tolist()  # the engines' rule: an end token among the tokens
    texts = tokenizer.batch_decode([row[:n] for row, n in zip(ids, lengths)], skip_special_tokens=True)
    budget, buffer = c.data.max_response_length, c.dapo.overlong.buffer_len
    correct, by_steps, repeated, in_format = [], defaultdict(list), [], []
    for i, text in enumerate(texts):
        row = rows[i // c.rollout.n]
        ok = bool(compute_score(row["data_source"], text, row["reward_model"]["ground_truth"])["acc"])
        correct.append(ok)
        by_steps[_operations(row["extra_info"])].append(ok)
        in_format.append(ANSWER_LINE.search(text) is not None)
        lines = [line for line in text.split("\n") if line.strip()]
        repeated.append(len(set(lines)) < len(lines))
    groups = [correct[g * c.rollout.n : (g + 1) * c.rollout.n] for g in range(len(rows))]
    q = statistics.quantiles(lengths, n=20)
    figures = {
        "problems": len(rows),
        "n": c.rollout.n,
        "temperature": c.rollout.temperature,
        "top_p": c.rollout.top_p,
        "budget": budget,
        "buffer": buffer,
        "accuracy": statistics.fmean(correct),
        "mixed_groups": statistics.fmean(0 < sum(g) < len(g) for g in groups),
        "all_wrong_groups": statistics.fmean(not any(g) for g in groups),
        "all_right_groups": statistics.fmean(all(g) for g in groups),
        "length_mean": statistics.fmean(lengths),
        "length_p5": q[0],
        "length_median": statistics.median(lengths),
        "length_p95": q[-1],
        "length_max": max(lengths),
        "in_format": statistics.fmean(in_format),
        "truncated": statistics.fmean(not e for e in ended),
        "in_buffer": statistics.fmean(e and budget - buffer < n for e, n in zip(ended, lengths)),
        "correct_in_buffer": statistics.fmean(ok and budget - buffer < n for ok, n in zip(correct, lengths)),
        "repeated_line": statistics.fmean(repeated),
        "accuracy_by_steps": {k: statistics.fmean(v) for k, v in sorted(by_steps.items())},
        "sampling_seconds": seconds,
        # every response's, the n of a problem consecutive (bench.sim.async_loops --lengths reads them)
        "lengths": lengths,
    }
    print(
        f"start model {model_dir}: {len(rows)} held-out problems x {c.rollout.n} responses at temperature "
        f"{c.rollout.temperature}, top_p {c.rollout.top_p}, budget {budget} (buffer {buffer}), "
        f"sampled in {seconds:.0f} s"
    )
    print_table(["figure", "value"], [[k, v] for k, v in figures.items() if k not in ("accuracy_by_steps", "lengths")])
    print_table(
        ["operations", "accuracy", "responses"], [[k, statistics.fmean(v), len(v)] for k, v in sorted(by_steps.items())]
    )
    if args.json:
        write_json(args.json, figures)
    return 0


def _operations(extra_info: dict) -> int:
    """A problem's number of operations: ``num_ops`` (word problems), else its solution's line count (chains)."""
    return int(extra_info["num_ops"]) if "num_ops" in extra_info else extra_info["solution"].count("\n")


if __name__ == "__main__":
    sys.exit(main())
