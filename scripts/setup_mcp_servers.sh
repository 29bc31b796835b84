#!/usr/bin/env bash
# Install each MCP server of scripts/mcp_servers (NAME.lock) into an environment of its own, .venv-mcp/NAME, with
# exactly the locked versions (--no-deps: nothing resolved here); its executables are then .venv-mcp/NAME/bin/...
# (e.g. .venv-mcp/sqlite/bin/mcp-server-sqlite). Re-installs a server whose lock is newer than its last install.
# Uses the uv of the project environment (scripts/setup_env.sh); refresh the locks with scripts/lock_mcp_servers.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
for lock in scripts/mcp_servers/*.lock; do
  name=$(basename "$lock" .lock)
  venv=.venv-mcp/$name
  stamp=$venv/.envace-installed
  if [ -f "$stamp" ] && [ "$stamp" -nt "$lock" ]; then continue; fi
  [ -x "$venv/bin/python" ] || .venv/bin/uv venv -q --python "$(.venv/bin/python -c 'import sys; print(sys.executable)')" "$venv"
  .venv/bin/uv pip install -q --python "$venv/bin/python" --no-deps -r "$lock"
  touch "$stamp"
done
