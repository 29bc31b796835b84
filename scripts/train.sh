#!/usr/bin/env bash
# Train on the embedded default (tiny policy, built-in bank domain, CPU). Extra arguments go to `envace fit`,
# e.g. scripts/train.sh --trainer.max_steps=5
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The tiny default runs fastest on one thread (and a busy second core slows multi-threaded CPU kernels 50x).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec .venv/bin/envace fit --config lit_configs/tiny.yaml "$@"
