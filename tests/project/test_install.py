"""The CPU install (``scripts/pip_cpu.py``, what ``make setup`` and ``make verl-cpu-setup`` install with) on a stock
machine and on this one: it never resolves a CUDA build of torch.

A stock machine is simulated as ``../shared/UPSTREAM.md`` says: this machine's pip configuration ignored
(``PIP_CONFIG_FILE=/dev/null`` and no ``PIP_*`` variables, so no local wheel folder), only the CA bundle kept for the
package registry. There the CPU build comes only from the PyTorch CPU index: where it answers, the resolve must pick
``torch==X+cpu`` and no NVIDIA package; where it does not (these machines), the install must stop with the project's
own message naming the index. With the configuration in place (as in CI) the resolve picks the CPU build too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from pip_cpu import TORCH_CPU_INDEX, index_answers, pinned_torch  # noqa: E402

pytestmark = pytest.mark.slow


def _stock_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    cert = os.environ.get("PIP_CERT")
    if cert:
        env["PIP_CERT"] = cert  # the registry's CA bundle on this machine, not a package source
    return env


def _resolve(env: dict, report: Path, *requirements: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "scripts/pip_cpu.py",
            "--dry-run",
            "--ignore-installed",
            "--report",
            str(report),
            "-q",
            *requirements,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _packages(report: Path) -> dict[str, str]:
    return {p["metadata"]["name"].lower(): p["metadata"]["version"] for p in json.loads(report.read_text())["install"]}


INSTALLS = {
    "main": ["-c", "constraints/cpu.txt", "-e", ".[test]"],
    "verl-cpu": ["-c", "constraints/verl-cpu.txt", "-r", "constraints/verl-cpu-requirements.txt"],
}


@pytest.mark.parametrize("install", INSTALLS)
def test_a_stock_machine_gets_the_cpu_torch_or_the_projects_message_never_cuda(install, tmp_path):
    pinned = pinned_torch(INSTALLS[install])
    assert pinned and pinned.endswith("+cpu")  # the pin a CUDA build can never satisfy
    result = _resolve(_stock_env(), tmp_path / "report.json", *INSTALLS[install])
    if index_answers(TORCH_CPU_INDEX):  # a machine that reaches the PyTorch CPU index
        assert result.returncode == 0, result.stderr[-3000:]
        packages = _packages(tmp_path / "report.json")
        assert packages["torch"] == pinned.split("==")[1]
        assert not [name for name in packages if name.startswith("nvidia-")]
    else:  # these machines: the index does not resolve
        assert result.returncode == 1
        assert f"served only by the PyTorch CPU wheel index {TORCH_CPU_INDEX}" in result.stderr
        assert "PIP_FIND_LINKS" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("install", INSTALLS)
def test_with_this_machines_pip_configuration_the_cpu_torch_is_resolved(install, tmp_path):
    result = _resolve(dict(os.environ), tmp_path / "report.json", *INSTALLS[install])
    assert result.returncode == 0, result.stderr[-3000:]
    packages = _packages(tmp_path / "report.json")
    assert packages["torch"].endswith("+cpu")
    assert not [name for name in packages if name.startswith("nvidia-")]
