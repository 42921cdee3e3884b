#!/usr/bin/env bash
# SD1.5 on the CPU, sdflow beside diffusers (PyTorch), same sizes, steps and threads.
# Needs: pip install torch diffusers transformers. Usage: bench/sd15.sh [threads] [sizes] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-$(nproc)}"
sizes="${2:-256,512}"
steps="${3:-4}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sdflow-target}"
echo "== sdflow"
SDFLOW_BENCH_THREADS="$threads" SDFLOW_BENCH_SIZES="$sizes" SDFLOW_BENCH_STEPS="$steps" \
    cargo bench -q -p sdflow-core --bench sd15
echo "== diffusers"
python3 bench/sd15_diffusers.py "$threads" "$sizes" "$steps"
