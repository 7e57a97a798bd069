# Shared helpers for scripts/*.sh (sourced, not run). Sets ROOT and cds into the repository root.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

JOBS="${JOBS:-2}"

mcs_step() { printf '\n==> %s\n' "$*"; }

# pip through the interpreter on PATH; allowed into a Debian "externally managed" system Python
# (fresh Debian 12, root, no venv), which is where CI runs.
mcs_pip() {
    if python3 - <<'PY'
import os, sys, sysconfig
managed = os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
sys.exit(0 if managed and sys.prefix == sys.base_prefix else 1)
PY
    then
        export PIP_BREAK_SYSTEM_PACKAGES=1
    fi
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore python3 -m pip "$@"
    # Outside a venv a user who cannot write the system's site-packages gets a user install:
    # its scripts (mooncake_sparse_node) land in the user base's bin/, which a non-login shell
    # may not have on PATH.
    local user_bin
    # site.getuserbase(), not `python -m site --user-base`: that exits 1 inside a venv (user
    # site-packages disabled), which would stop a `set -e` script.
    user_bin="$(python3 -c 'import site; print(site.getuserbase())')/bin"
    case ":${PATH}:" in
        *":${user_bin}:"*) ;;
        *) export PATH="${user_bin}:${PATH}" ;;
    esac
}

# The Release tree shared by test.sh and plan_demo.sh (same cache values, so neither re-triggers
# a full rebuild of the other).
mcs_configure_release() {
    cmake -S . -B build/release -G Ninja \
        -DCMAKE_BUILD_TYPE=Release \
        -DMOONCAKE_SPARSE_BUILD_TESTS=ON \
        -DMOONCAKE_SPARSE_BUILD_BENCHMARKS=ON \
        -DMOONCAKE_SPARSE_SANITIZE=
}
