#!/usr/bin/env bash
# The embedded demo (tiny policy, built-in bank domain, CPU, about 10 minutes on 2 cores): SFT warm start, EnvACE
# rehearsal RL with no real tool call, then a real-environment test of both checkpoints, printed as a table.
# Extra arguments go to `python -m envace.demo`, e.g. scripts/train.sh --rl=--trainer.max_steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two threads for one job on two free cores; set OMP_NUM_THREADS=1 if another process keeps a core busy.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
exec .venv/bin/python -m envace.demo "$@"
