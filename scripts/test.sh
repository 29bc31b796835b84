#!/usr/bin/env bash
# Run the test suite (offline, CPU; GPU tests are skipped without CUDA). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest "$@"
