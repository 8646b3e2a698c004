"""Where a step of the embedded engine spends its time: each part, the Hugging Face path against the engine's.

On the engine's default run (configs/embedded.yaml: the warmed-up tiny Qwen2, a generation round of 24 prompts x 8
responses of at most 8 tokens, 16 prompts trained in 8 mini-batches of 16 responses), one round's parts, timed
in alternation (bench/common.py), one torch thread:

  generate      Hugging Face ``generate`` on the 192 left-padded rows   vs  ``decode.sample`` (each prompt
                prefilled once, its KV cache expanded 8 ways, sampling log-probs kept)
  score         ``dapo.reward.compute_score`` on the 192 decoded responses (the same code in both)
  old_log_prob  a forward over [prompt | response] of the 128 trained rows  vs  the shared-prompt forward
                (``algorithm.rollout_correction.bypass_mode=false``); with bypass_mode=true (the default) it is 0
  update        one optimizer update: forward + backward of a 16-response micro-batch padded to the batch's
                width, clip, AdamW (for-loop)  vs  shared-prompt forward at the micro-batch's own width, fused AdamW

A step = generate + score + old_log_prob + 8 updates (one round; dynamic sampling may add rounds).

Run: python -m bench.bench_step [--repeats N] [--json PATH]
"""

from __future__ import annotations

import torch

from bench.common import parser, print_table, time_interleaved, write_json


def setup():
    from recipe.cli import compose
    from recipe.embedded.config import read_config
    from recipe.embedded.data import load_prompts
    from recipe.embedded.trainer import load_tokenizer
    from recipe.embedded.warmup import task_files, warm_model

    c = read_config(compose(["embedded.progress_bar=false"]))
    torch.set_num_threads(c.num_threads or 1)
    model_dir = warm_model(c.cache_dir, c.task, c.tiny_model, c.warmup, device=torch.device("cpu"))
    tok = load_tokenizer(model_dir)
    train = load_prompts([str(task_files(c.cache_dir, c.task) / "train.parquet")], tok, files_key="data.train_files",
                         prompt_key=c.prompt_key, reward_fn_key=c.reward_fn_key,
                         max_prompt_length=c.max_prompt_length, filter_overlong_prompts=False,
                         truncation=c.truncation, max_samples=c.gen_batch_size, seed=c.data_seed)
    return c, model_dir, tok, train


def main() -> None:
    args = parser(__doc__).parse_args()
    from transformers import AutoModelForCausalLM

    from dapo.reward import compute_score
    from recipe.embedded.decode import batched_shared_log_probs, sample, shared_prompt_log_probs
    from recipe.embedded.rollout import SamplingParams, batched_log_probs, generate, sequence_log_probs

    c, model_dir, tok, train = setup()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    eos, pad = torch.tensor([tok.eos_token_id]), tok.pad_token_id
    params = SamplingParams(True, c.temperature, c.top_p, c.top_k)
    prompts = train.prompt_ids[: c.gen_batch_size]
    gen_kwargs = dict(n=c.n, params=params, max_new_tokens=c.max_response_length, eos_ids=eos, pad_id=pad,
                      max_num_seqs=c.max_num_seqs)
    torch.manual_seed(0)
    ids, mask, _ = sample(model, prompts, **gen_kwargs)  # [192, T]
    trained = c.train_batch_size * c.n
    rows = [p for p in prompts for _ in range(c.n)][:trained]
    ids_t, mask_t = ids[:trained], mask[:trained]
    texts = [tok.decode(ids[i][mask[i].bool()], skip_special_tokens=True) for i in range(ids.shape[0])]
    truths = [t for t in train.ground_truths[: c.gen_batch_size] for _ in range(c.n)]
    micro = c.ppo_micro_batch_size
    pad_width = c.max_response_length  # a collated batch is as wide as its longest response

    def padded(t, value):
        return torch.nn.functional.pad(t[:micro], (0, pad_width - t.shape[1]), value=value)

    optimizers = {
        "hf": torch.optim.AdamW(model.parameters(), lr=0.0),  # lr 0: the model stays the same for every repeat
        "ours": torch.optim.AdamW(model.parameters(), lr=0.0, fused=True),
    }

    def update(fn, optimizer, ids_m, mask_m):
        model.train()
        optimizer.zero_grad(set_to_none=True)
        log_prob, entropy = fn(model, rows[:micro], ids_m, mask_m, temperature=c.temperature, pad_id=pad,
                               with_entropy=True)
        (-(log_prob * mask_m).sum() / mask_m.sum()).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), c.grad_clip)
        optimizer.step()
        model.eval()

    own_width = int(mask_t[:micro].sum(-1).max())
    lp_kwargs = dict(temperature=c.temperature, pad_id=pad, micro_batch_size=c.log_prob_micro_batch_size)
    contenders = {
        "generate/hf": lambda: generate(model, prompts, **gen_kwargs),
        "generate/ours": lambda: sample(model, prompts, **gen_kwargs),
        "score": lambda: [compute_score(None, t, g) for t, g in zip(texts, truths)],
        "old_log_prob/hf": lambda: batched_log_probs(model, rows, ids_t, mask_t, **lp_kwargs),
        "old_log_prob/ours": lambda: batched_shared_log_probs(model, rows, ids_t, mask_t, **lp_kwargs),
        "update/hf": lambda: update(sequence_log_probs, optimizers["hf"], padded(ids_t, pad), padded(mask_t, 0)),
        "update/ours": lambda: update(shared_prompt_log_probs, optimizers["ours"], ids_t[:micro, :own_width],
                                      mask_t[:micro, :own_width]),
    }
    t = time_interleaved(contenders, args.repeats)
    updates = c.train_batch_size // c.ppo_mini_batch_size * c.ppo_epochs
    steps = {
        "hf": t["generate/hf"] + t["score"] + t["old_log_prob/hf"] + updates * t["update/hf"],
        "ours": t["generate/ours"] + t["score"] + updates * t["update/ours"],  # bypass_mode: no old_log_prob pass
    }
    rows_out = []
    for part, n_times in (("generate", 1), ("score", 1), ("old_log_prob", 1), ("update", updates)):
        hf = t.get(f"{part}/hf", t.get(part))
        ours = 0.0 if part == "old_log_prob" else t.get(f"{part}/ours", t.get(part))
        rows_out.append([f"{part} x{n_times}", hf * n_times * 1e3, ours * n_times * 1e3,
                         hf / ours if ours else float("inf")])
    rows_out.append(["one round step", steps["hf"] * 1e3, steps["ours"] * 1e3, steps["hf"] / steps["ours"]])
    print(f"\none round of {c.gen_batch_size} prompts x {c.n}, {updates} updates of {micro} responses; "
          f"medians of {args.repeats} alternating repeats, ms; old_log_prob 'ours' = bypass_mode (the shared-prompt "
          f"recomputation takes {t['old_log_prob/ours'] * 1e3:.1f} ms)")
    print_table(["part", "HF path (before)", "engine (after)", "ratio"], rows_out)
    write_json(args.json, {"ms": {k: v * 1e3 for k, v in t.items()}, "step_ms": {k: v * 1e3 for k, v in steps.items()},
                           "updates": updates})


if __name__ == "__main__":
    main()
