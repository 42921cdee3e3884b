#!/usr/bin/env bash
# Builds `sdflow --features cuda` on a Debian 12 (x86_64) machine that has no GPU and no
# system CUDA: the CUDA 13 toolkit comes from NVIDIA's PyPI wheels, unpacked into a cache
# folder (no root, nothing installed system-wide), and the build gets its own target dir.
#
# Usage: tools/cuda-build.sh [--archs LIST] [--jobs N] [--strip-xz]
#   --archs LIST  CUDA architectures (CMAKE_CUDA_ARCHITECTURES), ';' or ',' separated;
#                 default $SDFLOW_CUDA_ARCHS or 86;89;90 (RTX 30xx, RTX 40xx, H100/H200)
#   --jobs N      cargo -j N, and CMAKE_BUILD_PARALLEL_LEVEL=N unless that is set already
#   --strip-xz    also write a stripped, xz-compressed copy of the binary (sdflow.xz)
# Environment: SDFLOW_CUDA_ARCHS (as --archs), SDFLOW_CUDA_TARGET_CPU (rustc target-cpu,
#   default x86-64-v3 = AVX2/FMA/F16C so the binary runs on other machines; `native` for
#   this machine's CPU only), SDFLOW_CUDA_HOME (toolkit folder), SDFLOW_CUDA_TARGET_DIR.
#
# What the wheels do not give, and how this script makes up for it:
# - they ship no libcuda.so (the driver), not even a stub, so ggml is built with
#   GGML_CUDA_NO_VMM=ON (its VMM pool is the only user of the driver API);
# - they ship no libcublas_static.a / libcublasLt_static.a / libculibos.a, which
#   llama-cpp-sys-2 asks for on Linux (static=cudart_static, cublas_static, cublasLt_static,
#   culibos, and -lcuda). Those requests are answered with empty archives from a shim folder
#   (CUDA_LIBRARY_PATH), and the final link of the sdflow binary alone gets
#   -lcudart -lcublas -lcublasLt (cargo rustc ... -- -C link-arg=...): the CUDA runtime and
#   cuBLAS are linked dynamically (libcudart.so.13, libcublas.so.13). A machine that runs
#   the binary needs an NVIDIA driver (>= 580 for CUDA 13) and those libraries, found through
#   LD_LIBRARY_PATH, the system, or the binary's folder (RUNPATH $ORIGIN:$ORIGIN/../lib).
set -euo pipefail

die() { echo "cuda-build: error: $*" >&2; exit 1; }
log() { echo "cuda-build: $*" >&2; }

# The CUDA 13.0 Update 2 components (they belong together; 13.0 needs driver >= 580).
WHEELS=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-cuda-cccl==13.0.85
    nvidia-cuda-runtime==13.0.96
    nvidia-cublas==13.1.0.3
)

archs="${SDFLOW_CUDA_ARCHS:-86;89;90}"
jobs=""
strip_xz=0
while [ $# -gt 0 ]; do
    case "$1" in
        --archs) [ $# -ge 2 ] || die "--archs needs a value"; archs="$2"; shift ;;
        --archs=*) archs="${1#--archs=}" ;;
        --jobs|-j) [ $# -ge 2 ] || die "--jobs needs a value"; jobs="$2"; shift ;;
        --jobs=*) jobs="${1#--jobs=}" ;;
        --strip-xz) strip_xz=1 ;;
        -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
    shift
done
archs="${archs//,/;}"
[[ "$archs" =~ ^[0-9]+[a-z]?(-real|-virtual)?(\;[0-9]+[a-z]?(-real|-virtual)?)*$ ]] \
    || die "bad CUDA architecture list '$archs' (e.g. 90 or 86;89;90)"
[ -z "$jobs" ] || [[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs takes a positive number"
target_cpu="${SDFLOW_CUDA_TARGET_CPU:-x86-64-v3}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}"
home="${SDFLOW_CUDA_HOME:-$cache/sdflow/cuda13}"
target_dir="${SDFLOW_CUDA_TARGET_DIR:-$cache/sdflow-target-cuda}"
root="$home/nvidia/cu13"     # the toolkit: bin/nvcc, nvvm/, include/, lib/ (lib64 -> lib)
shim="$home/link-shim"       # lib64/ of empty archives for llama-cpp-sys-2's static requests

# --- what must be there -------------------------------------------------------------------
[ "$(uname -m)" = x86_64 ] || die "only x86_64 Linux is supported (NVIDIA's wheels used here are x86_64)"
for tool in cargo cmake unzip ar readelf strip; do
    command -v "$tool" >/dev/null || die "'$tool' is missing (apt-get install cmake unzip binutils; cargo from rustup)"
done
[ "$strip_xz" = 0 ] || command -v xz >/dev/null || die "'xz' is missing (apt-get install xz-utils)"
command -v c++ >/dev/null || die "no C++ compiler (apt-get install build-essential)"

# --- the toolkit from PyPI ----------------------------------------------------------------
mkdir -p "$home/wheels" "$home/.installed"
missing=()
for w in "${WHEELS[@]}"; do
    [ -f "$home/.installed/$w" ] || missing+=("$w")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ -n "${PIP:-}" ]; then
        read -r -a pip <<< "$PIP"
    elif python3 -m pip --version >/dev/null 2>&1; then
        pip=(python3 -m pip)
    elif command -v pip3 >/dev/null; then
        pip=(pip3)
    else
        die "pip is missing, and it is needed to download the CUDA wheels (apt-get install python3-pip)"
    fi
    for w in "${missing[@]}"; do
        name="${w%%==*}" ver="${w##*==}"
        wheel=("$home/wheels/${name//-/_}-$ver-"*.whl)
        if [ ! -f "${wheel[0]}" ]; then
            log "downloading $w"
            "${pip[@]}" download --quiet --no-deps --only-binary=:all: --disable-pip-version-check \
                --dest "$home/wheels" "$w" \
                || die "pip could not download $w (no network, or PyPI not reachable? set PIP_INDEX_URL for a mirror)"
            wheel=("$home/wheels/${name//-/_}-$ver-"*.whl)
            [ -f "${wheel[0]}" ] || die "pip said it downloaded $w, but no ${name//-/_}-$ver-*.whl is in $home/wheels"
        fi
        log "unpacking ${wheel[0]##*/}"
        unzip -q -o "${wheel[0]}" 'nvidia/*' -d "$home" || die "cannot unpack ${wheel[0]} (a broken download? delete it and rerun)"
        touch "$home/.installed/$w"
        rm -f "${wheel[0]}"
    done
fi
[ -x "$root/bin/nvcc" ] || die "$root/bin/nvcc is missing after unpacking the wheels"
chmod +x "$root"/bin/* "$root"/nvvm/bin/* 2>/dev/null || true

# Unversioned names for the linker and FindCUDAToolkit, and lib64 where nvcc.profile looks.
for lib in libcudart libcublas libcublasLt; do
    real=("$root/lib/$lib.so."[0-9]*)
    [ -f "${real[0]}" ] || die "$root/lib/$lib.so.* is missing (wheel not unpacked?)"
    ln -sfn "${real[0]##*/}" "$root/lib/$lib.so"
done
[ -e "$root/lib64" ] || ln -sfn lib "$root/lib64"
mkdir -p "$shim/lib64"
for lib in cudart_static cublas_static cublasLt_static culibos cuda; do
    [ -f "$shim/lib64/lib$lib.a" ] || printf '!<arch>\n' > "$shim/lib64/lib$lib.a"
done

# A smoke test of nvcc (cicc, ptxas, headers, host compiler), for the first architecture.
first_arch="${archs%%;*}"; first_arch="${first_arch%%[a-z-]*}"
smoke="$(mktemp -d)"
trap 'rm -rf "$smoke"' EXIT
printf '#include <cuda_runtime.h>\n__global__ void k(float *x) { x[threadIdx.x] *= 2.f; }\nint main() { int n = 0; return cudaGetDeviceCount(&n) == cudaSuccess ? 0 : 0; }\n' > "$smoke/t.cu"
"$root/bin/nvcc" -arch="sm_$first_arch" -cudart shared "$smoke/t.cu" -o "$smoke/t" >"$smoke/log" 2>&1 \
    || { cat "$smoke/log" >&2; die "the unpacked toolkit cannot compile a test kernel for sm_$first_arch (see above)"; }
log "toolkit: $root ($("$root/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/CUDA \1/p'))"

# --- the build ----------------------------------------------------------------------------
export CARGO_TARGET_DIR="$target_dir"
export CMAKE_CUDA_COMPILER="$root/bin/nvcc"
export CMAKE_CUDA_ARCHITECTURES="$archs"   # llama-cpp-sys-2 passes CMAKE_* env vars to CMake
export GGML_CUDA_NO_VMM=ON                 # ... and GGML_* ones
export CUDAToolkit_ROOT="$root" CUDA_PATH="$root"
export CUDA_LIBRARY_PATH="$shim"           # find_cuda_helper: the link-search dir (<it>/lib64)
export PATH="$root/bin:$PATH"
export RUSTFLAGS="-C target-cpu=$target_cpu"   # replaces .cargo/config.toml's target-cpu=native
jobs_arg=()
if [ -n "$jobs" ]; then
    jobs_arg=(-j "$jobs")
    export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$jobs}"
fi

# llama-cpp-sys-2 neither reruns its build script nor reconfigures CMake when CMAKE_* values
# change, so a new architecture list (or toolkit) must start its CMake build afresh.
config="archs=$archs cpu=$target_cpu ${WHEELS[*]}"
stamp="$target_dir/.sdflow-cuda-config"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$config" ]; then
    log "build settings changed since the last build: rebuilding ggml"
    (cd "$repo" && cargo clean --release -p llama-cpp-sys-2 >&2)
fi
mkdir -p "$target_dir"
echo "$config" > "$stamp"

log "building sdflow --features cuda for CUDA architectures $archs (target dir $target_dir)"
start=$SECONDS
# shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader, not for the shell
(cd "$repo" && cargo rustc --release -p sdflow --bin sdflow --features cuda "${jobs_arg[@]}" -- \
    -C link-arg=-L"$root/lib" -C link-arg=-lcudart -C link-arg=-lcublas -C link-arg=-lcublasLt \
    -C 'link-arg=-Wl,-rpath,$ORIGIN:$ORIGIN/../lib') \
    || die "cargo build failed (see above)"
log "built in $(( (SECONDS - start) / 60 )) min $(( (SECONDS - start) % 60 )) s"

bin="$target_dir/release/sdflow"
[ -f "$bin" ] || die "no binary at $bin"
needed="$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
grep -q '^libcudart\.so' <<< "$needed" || die "$bin does not link libcudart dynamically:"$'\n'"$needed"
grep -q '^libcublas\.so' <<< "$needed" || die "$bin does not link libcublas dynamically:"$'\n'"$needed"

stripped="$smoke/sdflow.stripped"
strip -o "$stripped" "$bin"
size() { du -h --apparent-size "$1" | cut -f1; }
echo
echo "binary:         $bin"
echo "size:           $(size "$bin") ($(size "$stripped") stripped)"
if [ "$strip_xz" = 1 ]; then
    xz -9 -T "${jobs:-0}" -c "$stripped" > "$bin.xz.tmp" && mv "$bin.xz.tmp" "$bin.xz"
    echo "stripped + xz: $bin.xz ($(size "$bin.xz")); unpack with: xz -dc sdflow.xz > sdflow && chmod +x sdflow"
fi
echo "CUDA archs:     $archs    target-cpu: $target_cpu"
echo "NEEDED (readelf -d):"
sed 's/^/  /' <<< "$needed"
echo "ldd (LD_LIBRARY_PATH=$root/lib):"
LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$bin" | sed 's/^\s*/  /'
echo "to run it here: LD_LIBRARY_PATH=$root/lib $bin --help"
