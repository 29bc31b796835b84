#!/usr/bin/env bash
# Create (or reuse) .venv-vllm: envace (editable, with its dev and models extras) beside vLLM's community CPU build,
# exactly as pinned in requirements-vllm.lock (scripts/lock.sh writes it). It is its own environment because that
# build needs an older transformers than the main one (.venv). Everything goes in with --no-deps, as in
# scripts/setup_env.sh; the check at the end imports vLLM and envace's engine. Re-installs when the lock or
# pyproject.toml is newer than the last install. On a CUDA machine use `pip install 'envace[vllm]'` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-vllm
stamp=$venv/.envace-installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt requirements-vllm.lock ]; then exit 0; fi
[ -x $venv/bin/python ] || python3 -m venv $venv
uv_pin=$(grep -m1 '^uv==' requirements-vllm.lock)
FL="${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}"
$venv/bin/pip install -q "$uv_pin"
$venv/bin/uv pip install -q --compile-bytecode --python $venv/bin/python ${FL:+--find-links "$FL"} \
    --no-deps -r requirements-vllm.lock -e .
LD_PRELOAD="$PWD/$venv/lib/libiomp5.so" $venv/bin/python -c "import vllm, envace.engines.vllm_engine" 2>/dev/null \
  || { echo "setup_vllm_env.sh: vLLM does not import in $venv" >&2; exit 1; }
touch "$stamp"
