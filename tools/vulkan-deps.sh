#!/usr/bin/env bash
# Installs what `--features vulkan` needs to build and run on a Debian 12 machine without a
# GPU, and prints the folder of Vulkan headers to give CMake (CMAKE_INCLUDE_PATH).
#
# Debian 12's Vulkan headers (1.3.239) are older than the ggml sdflow builds needs (it uses
# VK_EXT_layer_settings, headers >= 1.3.261), so the headers come from Debian 13's
# libvulkan-dev, downloaded through a private apt configuration (the system's sources stay
# as they are) and unpacked into a cache folder; nothing from Debian 13 is installed. The
# shader compiler, SPIR-V headers and the loader are Debian 12's own packages; Mesa's
# software Vulkan device (lavapipe) comes from bookworm-backports (25.0), through the same
# kind of private configuration, because Debian 12's own (22.3) crashes at random inside
# its worker threads under ggml (a third of the runs of some parity tests).
set -euo pipefail

cache="${XDG_CACHE_HOME:-$HOME/.cache}/sdflow/vulkan-headers"
version=1.4.309.0-1
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

# apt with only the given sources, its lists in a temporary folder.
private_apt() {
    local work="$1"; shift
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
    local suite
    for suite in "$@"; do
        echo "deb [signed-by=$keyring] http://deb.debian.org/debian $suite main"
    done > "$work/sources.list"
}
apt_opts() {
    echo -o "Dir::Etc::SourceList=$1/sources.list" -o "Dir::Etc::SourceParts=/dev/null" -o "Dir::State::Lists=$1/lists" -o "Dir::Cache=$1/cache"
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

need=()
for pkg in glslc spirv-headers glslang-tools libvulkan-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 \
        || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2; }
fi
if ! dpkg-query -W -f '${Version}' mesa-vulkan-drivers 2>/dev/null | grep -q '^2[5-9]\.'; then
    private_apt "$work/bpo" bookworm bookworm-backports
    # shellcheck disable=SC2046
    apt-get $(apt_opts "$work/bpo") update -qq >&2
    # shellcheck disable=SC2046
    DEBIAN_FRONTEND=noninteractive apt-get $(apt_opts "$work/bpo") install -y -qq --no-install-recommends -t bookworm-backports mesa-vulkan-drivers >&2
fi

if [ ! -f "$cache/usr/include/vulkan/vulkan_core.h" ]; then
    private_apt "$work/trixie" trixie
    # shellcheck disable=SC2046
    apt-get $(apt_opts "$work/trixie") update -qq >&2
    # shellcheck disable=SC2046
    (cd "$work/trixie" && apt-get $(apt_opts "$work/trixie") download "libvulkan-dev=$version" >&2)
    mkdir -p "$cache"
    dpkg -x "$work"/trixie/libvulkan-dev_*.deb "$cache"
fi
echo "$cache/usr/include"
