#!/usr/bin/env bash
# Installs what scripts/test.sh and scripts/plan_demo.sh need; a no-op when all is present.
# Target: Debian 12, run as root (sudo is used only when not root and available).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

APT_PACKAGES=(
    build-essential ninja-build ccache pkg-config
    clang libclang-rt-14-dev
    libgtest-dev libgmock-dev libbenchmark-dev pybind11-dev
    libgoogle-glog-dev libgflags-dev libyaml-cpp-dev libxxhash-dev nlohmann-json3-dev rapidjson-dev
    libjemalloc-dev
    libdlpack-dev
    python3 python3-dev python3-pip
    libibverbs1 libnuma1 libcurl4
)
# import name:pip requirement. torch 2.13.0 is the CPU build (bfloat16 tests and the demo).
# Upstream Mooncake Store (many nodes; its shared libraries need libibverbs1, libnuma1 and
# libcurl4 from apt): the non-CUDA wheel unless some variant is installed already.
PY_MODULES=(
    numpy:numpy pytest:pytest matplotlib:matplotlib tqdm:tqdm
    scikit_build_core:scikit-build-core pybind11:pybind11 torch:torch==2.13.0
    mooncake.store:mooncake-transfer-engine-non-cuda==0.3.13.post1
)

# A cmake >= 3.20 already on PATH (e.g. from pip) is kept; otherwise Debian's is installed.
cmake_ok() {
    command -v cmake >/dev/null 2>&1 || return 1
    local v
    v="$(cmake --version 2>/dev/null | sed -n 's/^cmake version \([0-9]*\.[0-9]*\).*/\1/p')"
    [[ -n "${v}" ]] || return 1
    local major="${v%%.*}" minor="${v#*.}"
    ((major > 3 || (major == 3 && minor >= 20)))
}
cmake_ok || APT_PACKAGES+=(cmake)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("${pkg}")
    fi
done

if ((${#missing[@]} > 0)); then
    if [[ "$(id -u)" -eq 0 ]]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        echo "install_deps: need root to install: ${missing[*]}" >&2
        exit 1
    fi
    echo "install_deps: apt-get install ${missing[*]}"
    log="$(mktemp)"
    if ! { "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -qq update &&
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends "${missing[@]}"; } >"${log}" 2>&1; then
        cat "${log}" >&2
        rm -f "${log}"
        echo "install_deps: apt-get failed" >&2
        exit 1
    fi
    rm -f "${log}"
fi

missing_py=()
for entry in "${PY_MODULES[@]}"; do
    python3 -c "import ${entry%%:*}" >/dev/null 2>&1 || missing_py+=("${entry#*:}")
done
if ((${#missing_py[@]} > 0)); then
    echo "install_deps: pip install ${missing_py[*]}"
    mcs_pip install -q "${missing_py[@]}"
fi

echo "install_deps: ok"
