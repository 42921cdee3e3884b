#!/usr/bin/env bash
# FLUX.1 per block on the CPU: sdflow (core/benches/flux_blocks.rs) beside PyTorch/diffusers
# (bench/flux_diffusers.py), one engine at a time, same shapes and threads.
# Usage: bench/flux.sh [threads] [sizes]   e.g. bench/flux.sh 2 512
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-2}"
sizes="${2:-512}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sdflow-target}"
SDFLOW_BENCH_THREADS="$threads" SDFLOW_BENCH_SIZES="$sizes" cargo bench -q -p sdflow-core --bench flux_blocks
python3 bench/flux_diffusers.py "$threads" "$sizes"
