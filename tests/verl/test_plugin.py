"""The plugin registers DAPO in a fresh Python process started as a Ray worker is: by environment only.

A worker process runs ``import verl`` and nothing of ours; verl then loads ``recipe.dapo.plugin`` through the
``verl.plugins`` entry point (pyproject.toml) or ``VERL_USE_EXTERNAL_MODULES`` (tests/verl/test_ray.py checks that
one inside a real Ray worker). The processes run from an empty directory, so only the installation can supply
the package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

pytestmark = pytest.mark.slow

PROBE = """
import json, verl
from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY
print(json.dumps({"loss": "dapo" in POLICY_LOSS_REGISTRY, "reward_manager": "dapo_paper" in REWARD_MANAGER,
                  "trainer": "dapo" in TRAINER_REGISTRY}))
"""


def test_entry_point_is_declared():
    declared = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert declared.get("dapo") == "recipe.dapo.plugin", (
        "the project is not pip-installed with its verl.plugins entry point: run "
        "pip install -c constraints/cpu.txt -e . --no-deps"
    )


def test_fresh_worker_processes(tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith("VERL_USE_EXTERNAL_")}
    envs = {
        "entry point": base,  # a worker of a cluster where the project is pip-installed
        "plugins off": base | {"VERL_USE_EXTERNAL_PLUGINS": "none"},  # control: nothing else registers them
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", PROBE],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, env in envs.items()
    }
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        results[name] = json.loads(out.strip().splitlines()[-1])
    assert results["entry point"] == {"loss": True, "reward_manager": True, "trainer": True}
    assert results["plugins off"] == {"loss": False, "reward_manager": False, "trainer": False}
