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

The engine's shared-prompt forward is timed in both of its layouts (``decode.shared_prompt_log_probs``):
``cache`` (prompts prefilled once, KV cache expanded per response: two model calls) and ``packed`` (a group in one
block-causal row: one model call; what ``layout="auto"`` picks for these short rows).

A step = generate + score + old_log_prob + 8 updates (one round; dynamic sampling may add rounds).

``--config-name embedded_smollm2``: the same parts on the real model (SmolLM2-135M-Instruct, ``make model`` first;
a round of 12 prompts x 4 responses of up to 104 tokens, 2 updates of 16 responses, every core). Where the config
computes in bf16 (``embedded.dtype=bfloat16`` on a CPU with native bf16) every part runs under bf16 autocast over
fp32 weights, as the engine trains, except the engine's generation, which samples with its bf16 copy of the policy
(``Policy.sampler``); one more contender, ``generate/autocast`` (the engine's loop under autocast, what it did
before that copy), shows what the copy saves. Use ``--repeats 3``: one HF generation takes about a minute there.

Run: python -m bench.bench_step [--config-name NAME] [--repeats N] [--json PATH]
"""

from __future__ import annotations

from functools import partial

import torch

from bench.common import parser, print_table, time_interleaved, write_json


def setup(config_name: str = "embedded"):
    from recipe.cli import compose
    from recipe.common.warmup import task_files, warm_model
    from recipe.embedded.config import read_config
    from recipe.embedded.data import load_prompts
    from recipe.embedded.policy import load_tokenizer

    c = read_config(compose(["embedded.progress_bar=false"], config_name))
    if c.model.path is not None:  # a real model and its own data files; every core unless the config says
        model_dir, train_file = c.model.path, c.data.train_files[0]
        torch.set_num_threads(c.embedded.num_threads or torch.get_num_threads())
    else:
        torch.set_num_threads(c.embedded.num_threads or 1)
        model_dir = warm_model(
            c.embedded.cache_dir, c.embedded.task, c.embedded.tiny_model, c.embedded.warmup, device=torch.device("cpu")
        )
        train_file = str(task_files(c.embedded.cache_dir, c.embedded.task) / "train.parquet")
    tok = load_tokenizer(model_dir)
    train = load_prompts(
        [train_file],
        tok,
        files_key="data.train_files",
        max_samples=c.data.gen_batch_size,
        **c.data.prompt_kwargs(),
    )
    return c, model_dir, tok, train


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--config-name", default="embedded", help="the embedded config under configs/ (default: embedded)")
    args = p.parse_args()
    from transformers import AutoModelForCausalLM

    from dapo.reward import compute_score
    from dapo.settings import eos_token_ids
    from recipe.common.log_probs import sequence_log_probs
    from recipe.embedded.decode import sample, shared_prompt_log_probs
    from recipe.embedded.policy import bf16_compute, low_precision_copy
    from recipe.embedded.rollout import SamplingParams, batched_log_probs, generate

    c, model_dir, tok, train = setup(args.config_name)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    eos = torch.tensor(eos_token_ids(tok.eos_token_id, model.generation_config.eos_token_id))
    pad = tok.pad_token_id if tok.pad_token_id is not None else int(eos[0])
    bf16 = bf16_compute(c)  # the engine's rule: bf16 compute over fp32 weights
    sampler = low_precision_copy(model, torch.bfloat16) if bf16 else model  # what the engine generates with

    def autocast(fn):  # a part as the engine computes it
        def call():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                return fn()

        return call

    params = SamplingParams(True, c.rollout.temperature, c.rollout.top_p, c.rollout.top_k)
    prompts = train.prompt_ids[: c.data.gen_batch_size]
    gen_kwargs = dict(
        n=c.rollout.n,
        params=params,
        max_new_tokens=c.data.max_response_length,
        eos_ids=eos,
        pad_id=pad,
        max_num_seqs=c.rollout.max_num_seqs,
    )
    torch.manual_seed(0)
    ids, mask, _ = sample(sampler, prompts, **gen_kwargs)  # [192, T]
    trained = c.data.train_batch_size * c.rollout.n
    rows = [p for p in prompts for _ in range(c.rollout.n)][:trained]
    ids_t, mask_t = ids[:trained], mask[:trained]
    texts = [tok.decode(ids[i][mask[i].bool()], skip_special_tokens=True) for i in range(ids.shape[0])]
    truths = [t for t in train.ground_truths[: c.data.gen_batch_size] for _ in range(c.rollout.n)]
    micro = c.actor.ppo_micro_batch_size
    pad_width = c.data.max_response_length  # a collated batch is as wide as its longest response

    def padded(t, value):
        return torch.nn.functional.pad(t[:micro], (0, pad_width - t.shape[1]), value=value)

    optimizers = {
        "hf": torch.optim.AdamW(model.parameters(), lr=0.0),  # lr 0: the model stays the same for every repeat
        "ours": torch.optim.AdamW(model.parameters(), lr=0.0, fused=True),
    }

    def update(fn, optimizer, ids_m, mask_m, **layout):
        model.train()
        optimizer.zero_grad(set_to_none=True)
        log_prob, entropy = fn(
            model,
            rows[:micro],
            ids_m,
            mask_m,
            temperature=c.rollout.temperature,
            pad_id=pad,
            with_entropy=True,
            **layout,
        )
        (-(log_prob * mask_m).sum() / mask_m.sum()).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), c.actor.grad_clip)
        optimizer.step()
        model.eval()

    own_width = int(mask_t[:micro].sum(-1).max())
    lp_kwargs = dict(
        temperature=c.rollout.temperature, pad_id=pad, micro_batch_size=c.rollout.log_prob_micro_batch_size
    )
    contenders = {
        "generate/hf": lambda: generate(model, prompts, **gen_kwargs),
        "generate/ours": lambda: sample(sampler, prompts, **gen_kwargs),
        "score": lambda: [compute_score(None, t, g) for t, g in zip(texts, truths)],
        "old_log_prob/hf": lambda: batched_log_probs(model, rows, ids_t, mask_t, **lp_kwargs),
        "old_log_prob/cache": lambda: batched_log_probs(
            model, rows, ids_t, mask_t, **lp_kwargs, log_prob_fn=partial(shared_prompt_log_probs, layout="cache")
        ),
        "old_log_prob/packed": lambda: batched_log_probs(
            model, rows, ids_t, mask_t, **lp_kwargs, log_prob_fn=partial(shared_prompt_log_probs, layout="packed")
        ),
        "update/hf": lambda: update(sequence_log_probs, optimizers["hf"], padded(ids_t, pad), padded(mask_t, 0)),
        **{
            f"update/{layout}": partial(
                update,
                shared_prompt_log_probs,
                optimizers["ours"],
                ids_t[:micro, :own_width],
                mask_t[:micro, :own_width],
                layout=layout,
            )
            for layout in ("cache", "packed")
        },
    }
    if bf16:  # the engine's loop under autocast over the fp32 weights: before the bf16 copy
        contenders["generate/autocast"] = lambda: sample(model, prompts, **gen_kwargs)
    contenders = {name: fn if name == "generate/ours" else autocast(fn) for name, fn in contenders.items()}
    t = time_interleaved(contenders, args.repeats, warmup=1 if c.model.path else 2)  # a real model: minutes a call
    updates = c.data.train_batch_size // c.actor.ppo_mini_batch_size * c.actor.ppo_epochs
    layouts = ("cache", "packed")
    steps = {"hf": t["generate/hf"] + t["score"] + t["old_log_prob/hf"] + updates * t["update/hf"]}
    for layout in layouts:  # bypass_mode: no old_log_prob pass
        steps[layout] = t["generate/ours"] + t["score"] + updates * t[f"update/{layout}"]
    rows_out = []
    for part, n_times in (("generate", 1), ("score", 1), ("old_log_prob", 1), ("update", updates)):
        hf = t.get(f"{part}/hf", t.get(part))
        cache, packed = (t.get(f"{part}/{layout}", t.get(f"{part}/ours", t.get(part))) for layout in layouts)
        if part == "old_log_prob":
            cache = packed = 0.0
        rows_out.append(
            [
                f"{part} x{n_times}",
                hf * n_times * 1e3,
                cache * n_times * 1e3,
                packed * n_times * 1e3,
                hf / packed if packed else float("inf"),
                cache / packed if packed else float("inf"),
            ]
        )
    rows_out.append(
        [
            "one round step",
            *(steps[k] * 1e3 for k in ("hf", "cache", "packed")),
            steps["hf"] / steps["packed"],
            steps["cache"] / steps["packed"],
        ]
    )
    print(
        f"\none round of {c.data.gen_batch_size} prompts x {c.rollout.n}, {updates} updates of {micro} responses, "
        f"{torch.get_num_threads()} torch thread(s), {'bf16 compute' if bf16 else 'fp32'}; "
        f"medians of {args.repeats} alternating repeats, ms; the engine's old_log_prob = bypass_mode (the "
        f"shared-prompt recomputation takes {t['old_log_prob/cache'] * 1e3:.1f} ms in the cache layout, "
        f"{t['old_log_prob/packed'] * 1e3:.1f} ms packed)"
    )
    print_table(
        ["part", "HF path", "engine, cache layout", "engine, packed", "HF / packed", "cache / packed"], rows_out
    )
    if "generate/autocast" in t:
        print(
            f"generate, the engine's loop: {t['generate/autocast'] * 1e3:.0f} ms under bf16 autocast over fp32 "
            f"weights, {t['generate/ours'] * 1e3:.0f} ms with the bf16 copy "
            f"({t['generate/autocast'] / t['generate/ours']:.2f}x)"
        )
    write_json(
        args.json,
        {
            "ms": {k: v * 1e3 for k, v in t.items()},
            "step_ms": {k: v * 1e3 for k, v in steps.items()},
            "updates": updates,
            "config": args.config_name,
            "bf16": bf16,
            "threads": torch.get_num_threads(),
        },
    )


if __name__ == "__main__":
    main()
