#!/usr/bin/env bash
# The embedded demo (tiny policy, built-in bank domain, CPU, about 7 minutes on 2 idle cores): SFT warm start, EnvACE
# rehearsal RL with no real tool call, then a real-environment test of both checkpoints, printed as a table.
# Extra arguments go to `python -m envace.cli.demo`, e.g. scripts/train.sh --rl=--trainer.max_steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two threads for one job on two free cores; set OMP_NUM_THREADS=1 if another process keeps a core busy. The thread
# count changes the results (the order of float sums), so the README's table is for 2.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
# The same CPU kernels on every x86 machine with AVX2, instead of the widest this CPU has (which order float sums
# differently, so one seed gave another table on another machine): ATen's AVX2 kernels, MKL's AVX2 reproducibility
# branch, oneDNN capped at AVX2. Set any of them to choose otherwise (e.g. ATEN_CPU_CAPABILITY=avx512).
export ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx2}" MKL_CBWR="${MKL_CBWR:-AVX2}"
export ONEDNN_MAX_CPU_ISA="${ONEDNN_MAX_CPU_ISA:-AVX2}"
exec .venv/bin/python -m envace.cli.demo "$@"
