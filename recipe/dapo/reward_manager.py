"""DAPO's reward manager for verl's reward loop: ``reward.reward_manager.name=dapo_paper``.

Per response (``run_single``, called by verl's reward-loop workers while rollouts stream in):

1. decode the valid response tokens and score them with :func:`dapo.reward.compute_score`, the paper's scorer
   (``Answer:`` extraction + Minerva normalisation), or with ``reward.custom_reward_function`` when one is set;
2. ``reward = score + R_length`` with :func:`dapo.shaping.overlong_penalty` (paper Eq. 13) when
   ``reward.reward_kwargs.overlong_buffer_cfg.enable``;
3. ``reward_extra_info``: everything the scorer returned, always with ``score`` and ``acc`` (the metric dynamic
   sampling filters on), and with ``overlong_buffer_cfg.log``: ``overlong_reward`` (R_length) and ``overlong``
   (R_length < 0).

Keys are those of verl's own ``dapo`` reward manager (``verl/experimental/reward_loop/reward_manager/dapo.py``):
``reward.reward_kwargs.max_resp_len`` and ``reward.reward_kwargs.overlong_buffer_cfg.{enable,len,penalty_factor,log}``.
Where it differs from verl's, deliberately:

1. the default scorer is the paper's, without verl's ``\\boxed{}`` fallback (``dapo.reward`` documents its modes;
   pass them with ``reward.custom_reward_function.path=pkg://dapo.reward`` and
   ``+reward.custom_reward_function.reward_kwargs.<mode>=...``);
2. ``max_resp_len`` defaults to ``data.max_response_length`` when unset (verl asserts instead);
3. the penalty holds at ``-penalty_factor`` beyond ``max_resp_len`` (Eq. 13) where verl extrapolates; a response
   is never longer than ``data.max_response_length`` in training, so this only matters for a smaller max_resp_len;
4. ``acc`` is always present: a scorer returning a bare number gets ``acc = score > 0``, ``score = number``
   (verl writes the number into ``acc``);
5. invalid overlong settings raise ``ValueError`` naming the key to fix (verl asserts); they are read by
   :class:`dapo.settings.OverlongSettings`, as in the embedded engine.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.utils.reward_score import default_compute_score

from dapo.reward import compute_score as dapo_compute_score
from dapo.settings import OverlongSettings, select
from dapo.shaping import overlong_penalty

REWARD_MANAGER_NAME = "dapo_paper"


@register(REWARD_MANAGER_NAME)
class DAPOPaperRewardManager(RewardManagerBase):
    """The paper's scorer plus soft overlong punishment, for verl's reward loop."""

    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        # verl hands every manager its generic default scorer when no custom_reward_function is configured
        if compute_score is None or compute_score is default_compute_score:
            compute_score = dapo_compute_score
        self.compute_score = compute_score
        custom = select(config, "reward.custom_reward_function.path")
        name = select(config, "reward.custom_reward_function.name") or "compute_score"
        self.label = (
            f"reward.custom_reward_function ({custom}:{name})"
            if custom
            else f"the reward function {getattr(compute_score, '__module__', '?')}."
            f"{getattr(compute_score, '__name__', repr(compute_score))}"
        )
        self.is_async_reward_score = inspect.iscoroutinefunction(compute_score)
        self.reward_router_address = reward_router_address
        self.reward_model_tokenizer = reward_model_tokenizer

        # the same reader as the embedded engine's (dapo.settings), on the keys it reads
        self.overlong = OverlongSettings.from_config(
            {
                "reward": {
                    "reward_kwargs": OmegaConf.to_container(
                        select(config, "reward.reward_kwargs") or OmegaConf.create({}), resolve=True
                    )
                },
                "data": {"max_response_length": select(config, "data.max_response_length")},
            }
        )
        self.overlong_enable = self.overlong.buffer_enable
        self.overlong_log = self.overlong.log
        self.overlong_buffer_len = self.overlong.buffer_len
        self.overlong_penalty_factor = self.overlong.penalty_factor
        self.max_resp_len = self.overlong.max_resp_len

    async def _score(self, call: dict):
        """One call of the scorer, stopped with :class:`RunStopped` (naming the function, the row and what went
        wrong) when it raises, returns no finite score or takes longer than ``dapo.reward_timeout_s``."""
        from recipe.common.checks import describe_row, finite_score, reward_failure
        from recipe.common.rundir import RunStopped, record_stop

        run_dir = select(self.config, "trainer.default_local_dir")
        timeout = select(self.config, "dapo.reward_timeout_s")
        try:
            if self.is_async_reward_score:
                pending = self.compute_score(**call)
            else:
                pending = self.loop.run_in_executor(None, lambda: self.compute_score(**call))
            result = await asyncio.wait_for(pending, timeout)
        except asyncio.TimeoutError:
            failure = {"timeout_s": timeout}
        except Exception as err:  # noqa: BLE001 - the user's function: named with its row, not traced back
            failure = {"error": err}
        else:
            if finite_score(result) is not None:
                return result
            failure = {"result": result}
        message = reward_failure(self.label, f"on the row {describe_row(call)}", **failure)
        record_stop(run_dir, message)  # verl's agent loop logs the error and marks the rollout failed: the
        raise RunStopped(message)  # sampler reads the reason (recipe/dapo/sampler.py) and stops the run

    async def run_single(self, data: DataProto) -> dict:
        data_item = data[-1:][0]  # an agent loop with several outputs is scored on its last one, as verl does
        response_ids = data_item.batch["responses"]  # [T]
        response_length = response_ids.shape[-1]
        valid_length = int(data_item.batch["attention_mask"][-response_length:].sum())
        valid_response_ids = response_ids[:valid_length]

        data_source = data_item.non_tensor_batch["data_source"]
        ground_truth = data_item.non_tensor_batch["reward_model"]["ground_truth"]
        extra_info = data_item.non_tensor_batch.get("extra_info", None) or {}
        response_str = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(valid_response_ids, skip_special_tokens=True)
        )
        extra_kwargs: dict[str, Any] = (
            {"reward_router_address": self.reward_router_address, "reward_model_tokenizer": self.reward_model_tokenizer}
            if self.reward_router_address is not None
            else {}
        )
        call = dict(
            data_source=data_source,
            solution_str=response_str,
            ground_truth=ground_truth,
            extra_info=extra_info,
            **extra_kwargs,
        )
        result = await self._score(call)

        reward_extra_info = dict(result) if isinstance(result, dict) else {"score": result}
        if "score" not in reward_extra_info:
            raise ValueError(
                f"the reward function returned {sorted(reward_extra_info)} without 'score'; a verl scorer returns a "
                "number or a dict with 'score' (and 'acc'), e.g. dapo.reward.compute_score"
            )
        score = float(reward_extra_info["score"])
        reward_extra_info["score"] = score
        reward_extra_info["acc"] = bool(reward_extra_info.get("acc", score > 0))

        reward = score
        if self.overlong_enable:
            overlong_reward = overlong_penalty(
                torch.tensor([valid_length]),
                max_resp_len=self.max_resp_len,
                overlong_buffer_len=self.overlong_buffer_len,
                penalty_factor=self.overlong_penalty_factor,
            ).item()
            reward += overlong_reward
            if self.overlong_log:
                reward_extra_info["overlong_reward"] = overlong_reward
                reward_extra_info["overlong"] = overlong_reward < 0
        return {"reward_score": reward, "reward_extra_info": reward_extra_info}
