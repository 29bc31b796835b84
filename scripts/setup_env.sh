#!/usr/bin/env bash
# Create (or reuse) the project virtual env in .venv and install exactly the versions pinned in requirements.lock
# (envace's dependencies with the dev, bench, models, mcp and vs-trl extras, CPU torch, uv, and the no-deps packages),
# then envace itself, editable. Everything goes in with --no-deps, so nothing is resolved here; scripts/check_lock.py then proves that the
# lock covers every requirement. Re-installs when the lock or pyproject.toml is newer than the last install.
# uv installs it where the local CPU torch wheel is found (PIP_FIND_LINKS or pip's find-links setting); plain pip
# otherwise, or with ENVACE_INSTALLER=pip. Refresh the lock with scripts/lock.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.envace-installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt requirements.lock ]; then exit 0; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
torch_version=$(sed -n 's/^torch==\([^ ;]*\).*/\1/p' requirements.lock)
uv_pin=$(grep -m1 '^uv==' requirements.lock)
FL="${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}"
if [ "${ENVACE_INSTALLER:-uv}" != pip ] && [ -n "$FL" ] && ls "$FL/torch-$torch_version+cpu-"*.whl >/dev/null 2>&1; then
  .venv/bin/pip install -q "$uv_pin"
  .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python --find-links "$FL" \
      --no-deps -r requirements.lock -e .
else  # plain pip: slower (about a minute on an idle machine)
  .venv/bin/pip install -q --no-deps -r requirements.lock -e .
fi
.venv/bin/python scripts/check_lock.py
touch "$stamp"
