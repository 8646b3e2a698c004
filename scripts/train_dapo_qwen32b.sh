#!/usr/bin/env bash
# DAPO on Qwen2.5-32B (arXiv 2503.14476 §4.1), submitted with `ray job submit` to an existing Ray cluster.
#
# Usage:
#   bash scripts/train_dapo_qwen32b.sh [hydra overrides...]     # extra arguments are appended as Hydra overrides
#   DRY_RUN=1 bash scripts/train_dapo_qwen32b.sh ...            # print the exact command, contact nothing, exit 0
#
# The run's numbers are configs/dapo_trainer.yaml (the algorithm) + configs/experiment/qwen2_5_32b.yaml (sizes,
# hardware); this script adds the cluster, the paths and the knobs below, each an environment variable:
#
#   NNODES (16), GPUS_PER_NODE (8)               the cluster: trainer.nnodes, trainer.n_gpus_per_node
#   MODEL_PATH (Qwen/Qwen2.5-32B)                a local directory or hub id, on every node
#   TRAIN_FILES, VAL_FILES                       parquet made by scripts/prepare_data.py (default $HOME/data/dapo/)
#   PROJECT_NAME (DAPO), EXPERIMENT_NAME         W&B project and run name (trainer.logger=[console,wandb])
#   CKPT_DIR                                     checkpoints (shared storage); trainer.default_local_dir
#   SAVE_FREQ (5), TEST_FREQ (5), RESUME_MODE (auto)
#   SP_SIZE (8)                                  Ulysses sequence parallel size of the actor
#   OFFLOAD (true)                               FSDP parameter and optimizer offload
#   GEN_TP (4), GPU_MEMORY_UTILIZATION (0.8)     vLLM tensor parallel size and memory fraction
#   MAX_TOKENS_PER_GPU (22528)                   dynamic batch size cap: max_prompt_length + max_response_length
#   EXPERIMENT (qwen2_5_32b)                     the configs/experiment/ file
#   RAY_ADDRESS (http://localhost:8265)          the cluster's job server
#   WORKING_DIR (this repository)                uploaded as the job's working directory
#   RUNTIME_ENV                                  a runtime-env YAML file to use instead of the generated JSON
#                                                (it must set env_vars.VERL_USE_EXTERNAL_MODULES=recipe.dapo.plugin)
#   PYTHON (python3)                             the interpreter on the cluster
#
# W&B: the job's processes need WANDB_API_KEY (run `wandb login` on the nodes, or put it in RUNTIME_ENV's
# env_vars); this script does not copy secrets into the command line. README.md lists the metrics.
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

NNODES=${NNODES:-16}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen2.5-32B}
DATA_DIR=${DATA_DIR:-$HOME/data/dapo}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/dapo-math-17k.parquet}
VAL_FILES=${VAL_FILES:-$DATA_DIR/aime-2024.parquet}
PROJECT_NAME=${PROJECT_NAME:-DAPO}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-DAPO-Qwen2.5-32B}
CKPT_DIR=${CKPT_DIR:-$HOME/ckpts/$PROJECT_NAME/$EXPERIMENT_NAME}
SAVE_FREQ=${SAVE_FREQ:-5}
TEST_FREQ=${TEST_FREQ:-5}
RESUME_MODE=${RESUME_MODE:-auto}
SP_SIZE=${SP_SIZE:-8}
OFFLOAD=${OFFLOAD:-true}
GEN_TP=${GEN_TP:-4}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.8}
MAX_TOKENS_PER_GPU=${MAX_TOKENS_PER_GPU:-22528}
EXPERIMENT=${EXPERIMENT:-qwen2_5_32b}
RAY_ADDRESS=${RAY_ADDRESS:-http://localhost:8265}
WORKING_DIR=${WORKING_DIR:-$REPO_DIR}
RUNTIME_ENV=${RUNTIME_ENV:-}
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}

# Workers import the recipe from the uploaded working directory; VERL_USE_EXTERNAL_MODULES makes every verl
# process load the plugin that registers DAPO's loss, reward manager and trainer (recipe/dapo/plugin.py).
DEFAULT_RUNTIME_ENV_JSON='{"env_vars": {"VERL_USE_EXTERNAL_MODULES": "recipe.dapo.plugin", "TOKENIZERS_PARALLELISM": "true", "NCCL_DEBUG": "WARN", "VLLM_LOGGING_LEVEL": "WARN"}, "excludes": [".git", ".venv", ".hypothesis", ".pytest_cache", "runs", "outputs", "wandb", "checkpoints", "bench/results"]}'
if [[ -n "$RUNTIME_ENV" ]]; then
  runtime_env_args=(--runtime-env="$RUNTIME_ENV")
else
  runtime_env_args=(--runtime-env-json="$DEFAULT_RUNTIME_ENV_JSON")
fi

submit=(ray job submit --address="$RAY_ADDRESS" "${runtime_env_args[@]}" --working-dir="$WORKING_DIR" --)
module=("$PYTHON" -m recipe.dapo.main_dapo)
overrides=(
  "+experiment=$EXPERIMENT"
  # cluster, model, data
  "trainer.nnodes=$NNODES"
  "trainer.n_gpus_per_node=$GPUS_PER_NODE"
  "actor_rollout_ref.model.path=$MODEL_PATH"
  "data.train_files=$TRAIN_FILES"
  "data.val_files=$VAL_FILES"
  # tracking
  "trainer.logger=[console,wandb]"
  "trainer.project_name=$PROJECT_NAME"
  "trainer.experiment_name=$EXPERIMENT_NAME"
  # checkpoints and resume
  "trainer.default_local_dir=$CKPT_DIR"
  "trainer.save_freq=$SAVE_FREQ"
  "trainer.test_freq=$TEST_FREQ"
  "trainer.resume_mode=$RESUME_MODE"
  # memory and parallelism of the 32B run
  "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=$SP_SIZE"
  "actor_rollout_ref.actor.fsdp_config.param_offload=$OFFLOAD"
  "actor_rollout_ref.actor.fsdp_config.optimizer_offload=$OFFLOAD"
  "actor_rollout_ref.actor.use_dynamic_bsz=true"
  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$MAX_TOKENS_PER_GPU"
  "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=$MAX_TOKENS_PER_GPU"
  "actor_rollout_ref.rollout.tensor_model_parallel_size=$GEN_TP"
  "actor_rollout_ref.rollout.gpu_memory_utilization=$GPU_MEMORY_UTILIZATION"
  "actor_rollout_ref.rollout.max_num_batched_tokens=$MAX_TOKENS_PER_GPU"
)
overrides+=("$@")  # the caller's Hydra overrides come last, so they win

quote() {  # shell-quote one word only when it needs it, so the printed command stays readable
  if [[ "$1" =~ ^[A-Za-z0-9_./:=+@%,-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}

if [[ "$DRY_RUN" == "1" ]]; then
  line=""
  for word in "${submit[@]}" "${module[@]}"; do line+="$(quote "$word") "; done
  printf '%s\\\n' "$line"
  last=$((${#overrides[@]} - 1))
  for i in "${!overrides[@]}"; do
    if [[ $i -lt $last ]]; then printf '    %s \\\n' "$(quote "${overrides[$i]}")"; else printf '    %s\n' "$(quote "${overrides[$i]}")"; fi
  done
  exit 0
fi

if ! command -v ray >/dev/null 2>&1; then
  echo "error: the 'ray' command is not on PATH; activate the environment with verl and ray installed" >&2
  exit 1
fi
exec "${submit[@]}" "${module[@]}" "${overrides[@]}"
