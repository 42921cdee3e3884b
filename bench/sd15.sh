#!/usr/bin/env bash
# SD1.5 (or SDXL) on the CPU: sdflow, stable-diffusion.cpp and diffusers (PyTorch), same sizes,
# steps and threads, then one table of all three.
# Needs: pip install torch diffusers transformers. Usage: bench/sd15.sh [threads] [sizes] [steps]
# SDFLOW_BENCH_MODEL=sdxl benchmarks SDXL base instead (checkpoint ~/.cache/sdflow/bench/sdxl_f16.safetensors,
# 6.5 GiB, written on the first run; diffusers needs ~14 GiB of memory for it in f32).
# SDFLOW_BENCH_SKIP_SDCPP=1 leaves sd.cpp out (its first build compiles sd.cpp and ggml, minutes);
# SDFLOW_BENCH_SDCPP=prebuilt runs it only if bench/sdcpp is already built, without building.
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-$(nproc)}"
sizes="${2:-256,512}"
steps="${3:-4}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/sdflow-target}"
# Its own target dir: bench/sdcpp is a separate workspace, and sharing the main one would
# lock it for the length of sd.cpp's C++ build.
sdcpp_target="${SDCPP_BENCH_TARGET_DIR:-$HOME/.cache/sdcpp-bench-target}"
sdcpp_bin="$sdcpp_target/release/sdcpp-bench"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "== sdflow"
# Also writes the checkpoint the sd.cpp run loads.
SDFLOW_BENCH_THREADS="$threads" SDFLOW_BENCH_SIZES="$sizes" SDFLOW_BENCH_STEPS="$steps" \
    cargo bench -q -p sdflow-core --bench sd15 | tee "$out/1-sdflow"

echo "== stable-diffusion.cpp"
if [ -n "${SDFLOW_BENCH_SKIP_SDCPP:-}" ]; then
    echo "skipped (SDFLOW_BENCH_SKIP_SDCPP)"
elif [ "${SDFLOW_BENCH_SDCPP:-}" = prebuilt ] && [ ! -x "$sdcpp_bin" ]; then
    echo "skipped: $sdcpp_bin not built (SDFLOW_BENCH_SDCPP=prebuilt)"
elif [ "${SDFLOW_BENCH_SDCPP:-}" != prebuilt ] &&
    ! CARGO_TARGET_DIR="$sdcpp_target" cargo build -q --release --manifest-path bench/sdcpp/Cargo.toml; then
    # The other two engines still run: a C++ toolchain or libclang problem is sd.cpp's alone.
    echo "skipped: building bench/sdcpp failed (see above)"
else
    "$sdcpp_bin" "$threads" "$sizes" "$steps" | tee "$out/2-sdcpp"
fi

echo "== diffusers"
python3 bench/sd15_diffusers.py "$threads" "$sizes" "$steps" | tee "$out/3-diffusers"

echo "== side by side ($threads threads, $steps steps; text encode is per prompt)"
# Each engine prints "<name> <model>, weights W, ..., text encode T s per prompt" and then rows
# "<size>² s/step vae_s rss_gib"; join them by size.
awk '
    /(SD1\.5|SDXL), .*text encode/ {
        engine = $1; split($0, field, ", "); weights = field[2]; sub(/^weights /, "", weights)
        text = $0; sub(/.*text encode /, "", text); sub(/ s per prompt.*/, "", text)
        next
    }
    engine != "" && $1 ~ /²$/ && NF == 4 {
        n++; size[n] = $1; sub(/²$/, "", size[n]); row[n] = sprintf("%-10s %-18s %8s %14s %14s %14s", engine, weights, $2, $3, $4, text)
    }
    END {
        printf "%6s %-10s %-18s %8s %14s %14s %14s\n", "size", "engine", "weights", "s/step", "VAE decode s", "peak RSS GiB", "text encode s"
        # sizes in first-seen order, engines in run order
        for (i = 1; i <= n; i++) if (!(size[i] in seen)) { seen[size[i]] = 1; order[++m] = size[i] }
        for (j = 1; j <= m; j++) for (i = 1; i <= n; i++) if (size[i] == order[j]) printf "%5s² %s\n", size[i], row[i]
    }
' "$out"/*
