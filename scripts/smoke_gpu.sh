#!/usr/bin/env bash
# Install check on one GPU: 2 DAPO steps of a small model through verl (vLLM rollout, FSDP actor, Ray, the
# recipe's loss, reward manager, sampler and trainer), then one validation. A few minutes; prints "smoke: OK".
#
# Usage:
#   bash scripts/smoke_gpu.sh [hydra overrides...]
#   DRY_RUN=1 bash scripts/smoke_gpu.sh      # print the command, run nothing
#
# Environment variables:
#   MODEL_PATH (Qwen/Qwen2.5-1.5B-Instruct)  a local directory or hub id
#   DATA_DIR ($HOME/data/dapo)               where scripts/prepare_data.py writes (run first if files are missing)
#   TRAIN_FILES, VAL_FILES                   default $DATA_DIR/dapo-math-17k.parquet, $DATA_DIR/aime-2024.parquet
#   CUDA_VISIBLE_DEVICES                     the GPU to use (one)
#   PYTHON (python3)
# Needs: a CUDA GPU, `pip install -e ".[gpu]"` (verl[vllm,fsdp]==0.9.1 with its CUDA torch), the model and data
# reachable (hub access, or local paths).
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-1.5B-Instruct}
DATA_DIR=${DATA_DIR:-$HOME/data/dapo}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/dapo-math-17k.parquet}
VAL_FILES=${VAL_FILES:-$DATA_DIR/aime-2024.parquet}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}

command=(
  "$PYTHON" -m recipe.dapo.main_dapo
  +experiment=smoke_1gpu
  "actor_rollout_ref.model.path=$MODEL_PATH"
  "data.train_files=$TRAIN_FILES"
  "data.val_files=$VAL_FILES"
  "$@"
)

if [[ "$DRY_RUN" == "1" ]]; then
  printf '%s %s %s \\\n' "${command[@]:0:3}"
  last=$((${#command[@]} - 1))
  for ((i = 3; i <= last; i++)); do
    if [[ $i -lt $last ]]; then printf '    %q \\\n' "${command[$i]}"; else printf '    %q\n' "${command[$i]}"; fi
  done
  exit 0
fi

if [[ ! -f "$TRAIN_FILES" || ! -f "$VAL_FILES" ]]; then
  echo "smoke: preparing DAPO-Math-17k and AIME 2024 in $DATA_DIR (scripts/prepare_data.py)"
  "$PYTHON" "$REPO_DIR/scripts/prepare_data.py" --out-dir "$DATA_DIR"
fi

cd "$REPO_DIR"
# a local Ray instance inherits this environment: the plugin reaches every worker even without pip install
export VERL_USE_EXTERNAL_MODULES=${VERL_USE_EXTERNAL_MODULES:-recipe.dapo.plugin}
export PYTHONPATH="$REPO_DIR${PYTHONPATH:+:$PYTHONPATH}"
"${command[@]}"
echo "smoke: OK (2 DAPO steps and a validation ran; look above for dapo/kept_group_frac, train/num_gen_batches," \
  "dapo/overlong_frac, actor/entropy, response_length/mean, val-core/math_dapo/acc/mean@4)"
