"""The ``dapo_paper`` reward manager on real ``DataProto`` items, as verl's reward loop builds and calls it.

Tokenizer: a character-level ``PreTrainedTokenizerFast`` built here (one token per character), so a response of
L characters is L tokens and the overlong arithmetic can be worked by hand.
"""

from __future__ import annotations

import string

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("verl")
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.reward import load_reward_manager  # noqa: E402

from dapo.reward import compute_score as dapo_compute_score  # noqa: E402
from recipe.dapo.reward_manager import DAPOPaperRewardManager  # noqa: E402

PROMPT_LEN = 4


@pytest.fixture(scope="module")
def char_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def make_config(max_resp_len=20, buffer_len=8, factor=1.0, log=True, enable=True, max_response_length=20):
    shaping = {"overlong_buffer_cfg": {"enable": enable, "len": buffer_len, "penalty_factor": factor, "log": log}}
    if max_resp_len is not None:
        shaping["max_resp_len"] = max_resp_len
    return OmegaConf.create(
        {
            "data": {"max_response_length": max_response_length},
            "reward": {
                "reward_kwargs": shaping,
                "custom_reward_function": {"path": None, "name": "compute_score"},
                "reward_manager": {"source": "register", "name": "dapo_paper", "module": {"path": None, "name": "x"}},
            },
        }
    )


def item(tokenizer, response: str, ground_truth: str, width: int = 24) -> DataProto:
    """One rollout as verl's agent loop hands it to the reward loop: prompt | response, padded to ``width``."""
    ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(response) <= width
    responses = torch.zeros(1, width, dtype=torch.long)
    responses[0, : len(ids)] = torch.tensor(ids)
    attention = torch.zeros(1, PROMPT_LEN + width, dtype=torch.long)
    attention[0, : PROMPT_LEN + len(ids)] = 1
    return DataProto.from_dict(
        tensors={"prompts": torch.full((1, PROMPT_LEN), 2), "responses": responses, "attention_mask": attention},
        non_tensors={
            "data_source": np.array(["math_dapo"], dtype=object),
            "reward_model": np.array([{"ground_truth": ground_truth, "style": "rule-lighteval/MATH_v2"}], dtype=object),
            "extra_info": np.array([{"index": 0}], dtype=object),
        },
    )


def run(manager, data):
    return manager.loop.run_until_complete(manager.run_single(data))


def answer_of_length(length: int, answer: str = "7") -> str:
    text = f"Answer: {answer}"
    return "x" * (length - len(text)) + text


def test_scores_acc_and_pred(char_tokenizer):
    manager = DAPOPaperRewardManager(make_config(), char_tokenizer, None)
    assert manager.compute_score is dapo_compute_score  # the paper's scorer by default
    right = run(manager, item(char_tokenizer, "x\nAnswer: 42", "42"))
    assert right["reward_score"] == 1.0  # 12 tokens <= 20 - 8: no penalty
    assert right["reward_extra_info"] == {
        "score": 1.0,
        "acc": True,
        "pred": "42",
        "overlong_reward": 0.0,
        "overlong": False,
    }
    wrong = run(manager, item(char_tokenizer, "Answer: 41", "42"))
    assert (wrong["reward_score"], wrong["reward_extra_info"]["acc"]) == (-1.0, False)
    # the paper's scorer has no \boxed{} fallback (verl 0.9.1's has)
    boxed = run(manager, item(char_tokenizer, "\\boxed{42}", "42"))  # 10 tokens
    assert (boxed["reward_score"], boxed["reward_extra_info"]["pred"]) == (-1.0, "[INVALID]")


@pytest.mark.parametrize(
    "length, penalty",
    [
        # max_resp_len 20, buffer 8: full reward up to 20 - 8 = 12 tokens, then -(L - 12) / 8
        (10, 0.0),
        (12, 0.0),
        (14, -0.25),  # -(14 - 12) / 8
        (16, -0.5),  # -(16 - 12) / 8
        (20, -1.0),  # -(20 - 12) / 8: the whole buffer used
    ],
)
def test_overlong_penalty_worked_by_hand(char_tokenizer, length, penalty):
    manager = DAPOPaperRewardManager(make_config(), char_tokenizer, None)
    out = run(manager, item(char_tokenizer, answer_of_length(length), "7"))
    assert out["reward_score"] == pytest.approx(1.0 + penalty)  # correct answer: score +1, then the penalty
    info = out["reward_extra_info"]
    assert info["score"] == 1.0 and info["acc"] is True  # acc and score stay unshaped: the filter reads acc
    assert info["overlong_reward"] == pytest.approx(penalty)
    assert info["overlong"] == (penalty < 0)


def test_penalty_factor_scales_and_log_off_hides_the_keys(char_tokenizer):
    manager = DAPOPaperRewardManager(make_config(factor=0.5, log=False), char_tokenizer, None)
    out = run(manager, item(char_tokenizer, answer_of_length(16), "8"))  # wrong answer, half the buffer used
    assert out["reward_score"] == pytest.approx(-1.0 - 0.25)  # -1 + 0.5 * -(16 - 12) / 8
    assert "overlong_reward" not in out["reward_extra_info"]


def test_max_resp_len_defaults_to_data_max_response_length(char_tokenizer):
    manager = DAPOPaperRewardManager(make_config(max_resp_len=None, max_response_length=16), char_tokenizer, None)
    assert manager.max_resp_len == 16
    out = run(manager, item(char_tokenizer, answer_of_length(16), "7"))
    assert out["reward_extra_info"]["overlong_reward"] == pytest.approx(-1.0)  # -(16 - 8) / 8


def test_disabled_shaping_returns_the_bare_score(char_tokenizer):
    manager = DAPOPaperRewardManager(make_config(enable=False), char_tokenizer, None)
    out = run(manager, item(char_tokenizer, answer_of_length(20), "7"))
    assert out["reward_score"] == 1.0 and "overlong_reward" not in out["reward_extra_info"]


def test_numeric_custom_scorer_gets_acc(char_tokenizer):
    def half_credit(data_source, solution_str, ground_truth, extra_info=None, **_):
        return 0.5 if ground_truth in solution_str else -0.5

    manager = DAPOPaperRewardManager(make_config(enable=False), char_tokenizer, half_credit)
    out = run(manager, item(char_tokenizer, "it is 42", "42"))
    assert out["reward_extra_info"] == {"score": 0.5, "acc": True}
    out = run(manager, item(char_tokenizer, "it is 41", "42"))
    assert out["reward_extra_info"] == {"score": -0.5, "acc": False}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"buffer_len": 30}, "overlong_buffer_cfg.len"),  # longer than max_resp_len = 20
        ({"buffer_len": None}, "overlong_buffer_cfg.len"),
        ({"factor": -1.0}, "penalty_factor"),
        ({"max_resp_len": None, "max_response_length": None}, "max_resp_len"),
    ],
)
def test_invalid_shaping_settings_name_the_key(char_tokenizer, kwargs, match):
    with pytest.raises(ValueError, match=match):
        DAPOPaperRewardManager(make_config(**kwargs), char_tokenizer, None)


def test_verl_loader_builds_it_with_the_papers_scorer(char_tokenizer):
    # what verl's RewardLoopWorker does: resolve reward.reward_manager.name in the registry, pass verl's default scorer
    manager = load_reward_manager(make_config(), char_tokenizer)
    assert isinstance(manager, DAPOPaperRewardManager)
    assert manager.compute_score is dapo_compute_score
    assert run(manager, item(char_tokenizer, "Answer: 42", "42"))["reward_extra_info"]["acc"] is True


@pytest.mark.parametrize(
    "scorer, fragment",
    [
        (lambda **kw: 1 / 0, "raised ZeroDivisionError: division by zero on the row data_source='math_dapo'"),
        (lambda **kw: float("nan"), "returned nan on the row data_source='math_dapo'"),
        (lambda **kw: {"acc": True}, "returned {'acc': True} on the row"),
        (lambda **kw: __import__("time").sleep(3), "did not return within dapo.reward_timeout_s=0.5 s on the row"),
    ],
    ids=["raises", "nan", "no-score", "hangs"],
)
def test_a_failing_reward_function_stops_the_run_naming_the_row(char_tokenizer, scorer, fragment):
    """What the embedded engine's ``CheckedReward`` does, in verl's reward workers: a scorer that raises, returns no
    finite score or hangs past ``dapo.reward_timeout_s`` raises ``RunStopped`` naming itself, the row and the value
    (the entry points print it in one line)."""
    from recipe.common.rundir import RunStopped, carried_error

    config = make_config()
    config.dapo = {"reward_timeout_s": 0.5}
    manager = DAPOPaperRewardManager(config, char_tokenizer, scorer)
    with pytest.raises(RunStopped) as stopped:
        run(manager, item(char_tokenizer, "Answer: 3", "3"))
    assert fragment in str(stopped.value) and "ground truth '3', response 'Answer: 3'" in str(stopped.value)
    carried = RuntimeError(f"remote traceback\nrecipe.common.rundir.RunStopped: {stopped.value}")  # Ray's text
    assert carried_error(carried) == ("stopped", str(stopped.value))
