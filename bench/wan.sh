#!/usr/bin/env bash
# Wan 2.1 T2V 1.3B per block on the CPU: sdflow (core/benches/wan_blocks.rs) beside
# PyTorch/diffusers (bench/wan_diffusers.py), one engine at a time, same shapes and threads.
# Usage: bench/wan.sh [threads] [frames] [WxH]   e.g. bench/wan.sh 2 9,33 832x480
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-2}"
frames="${2:-9,33}"
size="${3:-832x480}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sdflow-target}"
SDFLOW_BENCH_THREADS="$threads" SDFLOW_BENCH_FRAMES="$frames" SDFLOW_BENCH_SIZE="$size" cargo bench -q -p sdflow-core --bench wan_blocks
python3 bench/wan_diffusers.py "$threads" "$frames" "$size"
