#!/usr/bin/env bash
# Train on the embedded default (tiny policy, built-in bank domain, CPU). Extra arguments go to `envace fit`,
# e.g. scripts/train.sh --trainer.max_steps=5
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/envace fit --config lit_configs/tiny.yaml "$@"
