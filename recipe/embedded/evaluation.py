"""Scoring responses and validating the policy: mean@k accuracy and score per data source at
``rollout.val_kwargs``, logged under verl's names (``val-core/<source>/acc/mean@k``, ``val-aux/...``), and each
validation response written to ``trainer.validation_data_dir`` as verl writes them."""

from __future__ import annotations

import json
import os

import numpy as np
import torch

from recipe.embedded.config import EngineConfig
from recipe.embedded.data import PromptSet
from recipe.embedded.decode import sample
from recipe.embedded.policy import Policy
from recipe.embedded.rollout import SamplingParams


def score_responses(score_fn, tokenizer, response_ids, response_mask, sources, truths, extras, kwargs) -> dict:
    """``score`` (+1/-1) and ``acc`` (bool) per response, from the decoded response text."""
    scores, accs, texts = [], [], []
    for i in range(response_ids.shape[0]):
        text = tokenizer.decode(response_ids[i][response_mask[i].bool()], skip_special_tokens=True)
        texts.append(text)
        result = score_fn(sources[i], text, truths[i], extras[i], **kwargs)
        if isinstance(result, dict):
            score = float(result["score"])
            acc = bool(result.get("acc", score > 0))
        else:  # a plain float from a custom scorer
            score, acc = float(result), float(result) > 0
        scores.append(score)
        accs.append(acc)
    return {
        "score": torch.tensor(scores, dtype=torch.float32),
        "acc": torch.tensor(accs, dtype=torch.bool),
        "text": texts,
    }


@torch.no_grad()
def validate(c: EngineConfig, policy: Policy, val_set: PromptSet, score_fn, step: int) -> dict[str, float]:
    """mean@k accuracy and score per data source at ``rollout.val_kwargs`` (verl's ``val-core`` / ``val-aux``)."""
    params = SamplingParams(
        c.rollout.val_do_sample, c.rollout.val_temperature, c.rollout.val_top_p, c.rollout.val_top_k
    )
    chunk = c.data.val_batch_size or len(val_set)
    devices = [policy.device] if policy.device.type == "cuda" else []
    scores, accs, lengths, records = [], [], [], []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(c.embedded.seed * 1_000_003 + step)
        for start in range(0, len(val_set), chunk):
            rows = range(start, min(start + chunk, len(val_set)))
            response_ids, response_mask, _ = sample(
                policy.sampler(),
                [val_set.prompt_ids[i] for i in rows],
                n=c.rollout.val_n,
                params=params,
                max_new_tokens=c.data.max_response_length,
                eos_ids=policy.eos_ids,
                pad_id=policy.pad_id,
                max_num_seqs=c.rollout.max_num_seqs,
            )
            scored = score_responses(
                score_fn,
                policy.tokenizer,
                response_ids,
                response_mask,
                [val_set.data_sources[i] for i in rows for _ in range(c.rollout.val_n)],
                [val_set.ground_truths[i] for i in rows for _ in range(c.rollout.val_n)],
                [val_set.extra_infos[i] for i in rows for _ in range(c.rollout.val_n)],
                c.reward.kwargs,
            )
            scores.append(scored["score"])
            accs.append(scored["acc"].float())
            lengths.append(response_mask.sum(-1).float())
            if c.trainer.validation_data_dir:
                records += _records(policy.tokenizer, val_set, rows, c.rollout.val_n, scored, step)
    if c.trainer.validation_data_dir:
        write_generations(c.trainer.validation_data_dir, step, records)
    scores, accs = torch.cat(scores), torch.cat(accs)  # [V*k]
    sources = np.array([s for s in val_set.data_sources for _ in range(c.rollout.val_n)])
    metrics = {"val-aux/response_length/mean": torch.cat(lengths).mean().item()}
    for source in sorted(set(val_set.data_sources)):
        rows = torch.from_numpy(sources == source)
        metrics[f"val-core/{source}/acc/mean@{c.rollout.val_n}"] = accs[rows].mean().item()
        metrics[f"val-aux/{source}/score/mean@{c.rollout.val_n}"] = scores[rows].mean().item()
    return metrics


def _records(tokenizer, val_set: PromptSet, rows: range, n: int, scored: dict, step: int) -> list[dict]:
    """One record per response of ``rows`` (``n`` each, in order), in the fields verl 0.9.1's
    ``RayPPOTrainer._write_generations`` writes, with the DAPO scorer's ``acc`` as its reward extra info."""
    out = []
    for g, i in enumerate(rows):
        prompt = tokenizer.decode(val_set.prompt_ids[i], skip_special_tokens=False)  # once for its n responses
        for j in range(g * n, (g + 1) * n):
            out.append(
                {
                    "input": prompt,
                    "output": scored["text"][j],
                    "gts": val_set.ground_truths[i],
                    "score": scored["score"][j].item(),
                    "step": step,
                    "acc": bool(scored["acc"][j]),
                }
            )
    return out


def write_generations(directory: str, step: int, records: list[dict]) -> str:
    """``<directory>/<step>.jsonl``, one validation response a line (verl's ``trainer.validation_data_dir``
    layout: the same prompt's ``val_kwargs.n`` responses on consecutive lines, prompts in data-file order)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{step}.jsonl")
    with open(path + ".tmp", "w") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(path + ".tmp", path)
    return path


def val_summary(step: int, metrics: dict[str, float]) -> str:
    core = [f"{k.removeprefix('val-core/')} = {v:.3f}" for k, v in metrics.items() if k.startswith("val-core/")]
    return f"step {step}: validation {', '.join(core)}"
