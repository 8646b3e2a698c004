"""What ``dapo_separate_async`` adds to verl 0.9.1, piece by piece: the ``shm`` checkpoint engine
(``recipe/dapo/cpu/checkpoint_engine.py``) driven through weight syncs as verl's
``CheckpointEngineManager.update_weights`` drives it, with verl's own registry; the π_old copy of the separate_async
actor (``recipe.dapo.trainer.CopyingDetachActorWorker``); and the adapted log call of verl's trainer. The mode end
to end: ``tests/verl/test_cpu.py``."""

from __future__ import annotations

import asyncio
import inspect
import logging
from pathlib import Path

import pytest
import torch

pytest.importorskip("verl")
from verl.checkpoint_engine import CheckpointEngineRegistry  # noqa: E402

from recipe.dapo.cpu.checkpoint_engine import BACKEND, SharedMemoryCheckpointEngine  # noqa: E402
from recipe.dapo.trainer import _clone_aliases  # noqa: E402
from recipe.dapo.verl_patches import accept_flush_in_separate_async_log  # noqa: E402


def weights(seed: int):
    """A model's named tensors, with a tied pair (one storage under two names) as in SmolLM2."""
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(16, 4, generator=g)
    return [("embed.weight", embed), ("layer.weight", torch.randn(4, 4, generator=g)), ("lm_head.weight", embed)]


def engines(directory: Path, actor_ranks: int = 2, rollout_workers: int = 2, **kwargs):
    """Engines as verl builds them: the actor side with is_master on rank 0, the rollout side without it."""
    new = CheckpointEngineRegistry.new
    actors = [
        new(BACKEND, bucket_size=1 << 20, is_master=r == 0, directory=str(directory), **kwargs)
        for r in range(actor_ranks)
    ]
    rollouts = [new(BACKEND, bucket_size=1 << 20, directory=str(directory), **kwargs) for _ in range(rollout_workers)]
    return actors, rollouts


def connect(actors, rollouts) -> Path:
    """verl's build_process_group: prepare on all (actor ranks first), the topology, init_process_group on all."""
    metadata = [e.prepare() for e in actors] + [e.prepare() for e in rollouts]
    actor_kwargs, rollout_kwargs = SharedMemoryCheckpointEngine.build_topology(len(actors), len(rollouts), metadata)
    for side, kwargs in ((actors, actor_kwargs), (rollouts, rollout_kwargs)):
        for i, engine in enumerate(side):
            engine.init_process_group(**{key: values[i] for key, values in kwargs.items()})
    return Path(actor_kwargs["path"][0])


async def _collect(engine, step):
    return [(name, tensor.clone()) async for name, tensor in engine.receive_weights(global_steps=step)]


def sync(actors, rollouts, step: int, sent):
    """One update_weights: every actor rank sends (drains its own generator), every rollout worker receives,
    concurrently; then finalize on all."""
    drained = []

    def generator(rank):
        for item in sent:
            drained.append(rank)
            yield item

    async def run():
        sends = [e.send_weights(generator(rank), global_steps=step) for rank, e in enumerate(actors)]
        receives = [_collect(e, step) for e in rollouts]
        return await asyncio.gather(*receives, *sends)

    results = asyncio.run(run())
    for engine in (*actors, *rollouts):
        engine.finalize()
    return results[: len(rollouts)], results[len(rollouts) :], drained


def test_registered_in_verls_registry():
    assert CheckpointEngineRegistry.get(BACKEND) is SharedMemoryCheckpointEngine


def test_every_rollout_worker_receives_the_actors_weights_and_the_file_is_removed(tmp_path):
    actors, rollouts = engines(tmp_path)
    for step in (1, 2):  # two syncs: a new file each, removed after each
        path = connect(actors, rollouts)
        assert path.parent == tmp_path
        sent = weights(step)
        received, metrics, drained = sync(actors, rollouts, step, sent)
        for got in received:
            assert [name for name, _ in got] == [name for name, _ in sent]
            for (_, a), (_, b) in zip(got, sent):
                assert torch.equal(a, b)
        # every actor rank drained its generator (FSDP's full-tensor gathers are collective)
        assert sorted(set(drained)) == [0, 1] and len(drained) == 2 * len(sent)
        assert metrics[0]["dapo/weight_transfer/bytes"] > 0 and metrics[1] == {}  # rank 0 wrote, rank 1 only drained
        assert not path.exists() and list(tmp_path.iterdir()) == []


def test_the_sent_weights_are_a_snapshot(tmp_path):
    """The actor's generator may hand out its live parameters, which the next update changes in place: the
    rollout gets the values at the time of the sync."""
    actors, rollouts = engines(tmp_path, actor_ranks=1, rollout_workers=1)
    live = torch.zeros(3)
    connect(actors, rollouts)

    async def run():
        await actors[0].send_weights(iter([("w", live)]), global_steps=1)
        live.add_(1.0)  # the optimizer's step after the send
        return await _collect(rollouts[0], 1)

    ((name, tensor),) = asyncio.run(run())
    assert name == "w" and torch.equal(tensor, torch.zeros(3))


def test_a_receiver_refuses_another_steps_weights(tmp_path):
    actors, rollouts = engines(tmp_path, actor_ranks=1, rollout_workers=1)
    connect(actors, rollouts)

    async def run():
        await actors[0].send_weights(iter(weights(0)), global_steps=3)
        return await _collect(rollouts[0], 4)

    with pytest.raises(RuntimeError, match="holds the weights of step 3, this sync is for step 4"):
        asyncio.run(run())


def test_a_receiver_waits_then_names_the_directory(tmp_path):
    actors, rollouts = engines(tmp_path, actor_ranks=1, rollout_workers=1, timeout_s=0.2)
    connect(actors, rollouts)  # the actor never sends
    with pytest.raises(TimeoutError, match=r"no weights at .* after 0 s .*directory shared"):
        asyncio.run(_collect(rollouts[0], 1))


def test_a_missing_directory_is_named_with_its_key(tmp_path):
    (actor,), _ = engines(tmp_path / "absent", actor_ranks=1, rollout_workers=0)
    with pytest.raises(FileNotFoundError, match=r"engine_kwargs\.shm\.directory"):
        actor.prepare()


def test_pi_old_copies_only_what_aliases_the_live_weights():
    """verl's FSDP2 save keeps ``param._local_tensor.detach().cpu()``: on a CPU the live tensor. The copy clones
    those, so an in-place update of the parameter leaves the saved π_old as it was; other tensors are kept."""
    param = torch.nn.Parameter(torch.zeros(4))
    other = torch.ones(2)
    saved_by_verl = ({"w": (param.detach().cpu(), "spec"), "b": (other, None)}, "global_spec")
    assert saved_by_verl[0]["w"][0].data_ptr() == param.data_ptr()  # the alias this guards against

    state, spec = _clone_aliases(saved_by_verl, {param.data_ptr()})
    with torch.no_grad():
        param.add_(1.0)
    assert torch.equal(state["w"][0], torch.zeros(4)) and state["w"][1] == "spec" and spec == "global_spec"
    assert state["b"][0] is other  # not a parameter's memory: not copied


def test_the_setup_log_call_of_verls_separate_trainer_works_once_adapted(caplog):
    """verl 0.9.1's ``PPOTrainerSeparateAsync._setup`` logs with ``flush=True`` when ``hybrid_engine=false``; a plain
    ``logging.Logger`` raises ``TypeError`` on it. Adapted, the same call logs its message."""
    from verl.trainer.ppo.v1 import trainer_separate_async as module

    assert "flush=True" in inspect.getsource(module.PPOTrainerSeparateAsync._setup)  # the installed verl's call
    plain = logging.getLogger("plain")
    plain.setLevel(logging.INFO)  # as verl sets its module's (VERL_LOGGING_LEVEL, default INFO)
    with pytest.raises(TypeError, match="flush"):
        plain.info("rollout served by standalone replicas only", flush=True)
    accept_flush_in_separate_async_log()
    accept_flush_in_separate_async_log()  # idempotent: one adapter
    assert isinstance(module.logger.logger, logging.Logger)
    with caplog.at_level(logging.INFO, logger=module.logger.logger.name):
        module.logger.info("rollout served by %d standalone replicas only", 1, flush=True)
    assert "rollout served by 1 standalone replicas only" in caplog.text
