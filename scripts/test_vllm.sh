#!/usr/bin/env bash
# Run the vLLM engine's tests (tests/with_vllm) in .venv-vllm, the CPU build's environment (made on first use by
# scripts/setup_vllm_env.sh). vLLM's CPU build wants Intel's OpenMP preloaded. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_vllm_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_ENABLE_V1_MULTIPROCESSING=0
export LD_PRELOAD="$PWD/.venv-vllm/lib/libiomp5.so${LD_PRELOAD:+:$LD_PRELOAD}"
exec .venv-vllm/bin/python -m pytest -p no:cacheprovider -n 0 tests/with_vllm "$@"
