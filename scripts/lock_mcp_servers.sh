#!/usr/bin/env bash
# Refresh the locks of the MCP servers envace's tests and built-in SQLite domain run (scripts/mcp_servers/NAME.in ->
# NAME.lock), resolved by uv for CPython 3.11 on Linux x86_64. Each server gets an environment of its own
# (scripts/setup_mcp_servers.sh), as users install servers: the SQLite server needs the 1.x MCP SDK, envace's client
# and the time server 2.x. Extra arguments go to `uv pip compile` (e.g. --upgrade).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh  # its uv
for spec in scripts/mcp_servers/*.in; do
  .venv/bin/uv pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
      --custom-compile-command scripts/lock_mcp_servers.sh "$spec" -o "${spec%.in}.lock" "$@"
  echo "lock_mcp_servers.sh: wrote ${spec%.in}.lock"
done
