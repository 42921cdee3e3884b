#!/usr/bin/env bash
# Installs what `--features vulkan` needs to build and run on a Debian 12 machine without a
# GPU, and prints the folder of Vulkan headers to give CMake (CMAKE_INCLUDE_PATH).
#
# Debian 12's Vulkan headers (1.3.239) are older than the ggml sdflow builds needs (it uses
# VK_EXT_layer_settings, headers >= 1.3.261), so the headers come from Debian 13's
# libvulkan-dev, downloaded through a private apt configuration (the system's sources stay
# as they are) and unpacked into a cache folder; nothing from Debian 13 is installed. The
# shader compiler, SPIR-V headers, the loader and Mesa's software Vulkan device (lavapipe)
# are Debian 12's own packages.
set -euo pipefail

cache="${XDG_CACHE_HOME:-$HOME/.cache}/sdflow/vulkan-headers"
version=1.4.309.0-1

need=()
for pkg in glslc spirv-headers glslang-tools libvulkan-dev mesa-vulkan-drivers; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 \
        || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2; }
fi

if [ ! -f "$cache/usr/include/vulkan/vulkan_core.h" ]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" > "$work/sources.list"
    opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
          -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache")
    apt-get "${opts[@]}" update -qq >&2
    (cd "$work" && apt-get "${opts[@]}" download "libvulkan-dev=$version" >&2)
    mkdir -p "$cache"
    dpkg -x "$work"/libvulkan-dev_*.deb "$cache"
fi
echo "$cache/usr/include"
