#!/usr/bin/env bash
# Builds what the tensor fast path needs from this working tree on a CUDA machine, then runs the
# GPU tests and the tensor benchmark, writing everything into OUTDIR.
#
#   benchmarks/run_gpu_tensor.sh OUTDIR
#
# Needs: python3 with torch (CUDA), numpy, pybind11, pytest; cmake, ninja, a C++20 compiler.
# Header-only dependencies the machine may lack (nlohmann/json, rapidjson, xxhash.h, dlpack) are
# taken from .devdeps/ when present (DEVDEPS=DIR overrides). The node daemon needs gflags, glog and
# yaml-cpp: when the machine lacks them they are taken from Debian packages in .devdeps/debs/
# (unpacked into the build tree; fetch them on a Debian/Ubuntu box with
#   cd .devdeps/debs && apt-get download libgflags-dev libgflags2.2 libgoogle-glog-dev \
#       libgoogle-glog0v6 libyaml-cpp-dev libyaml-cpp0.7 libunwind8 libunwind-dev libjemalloc-dev
# ); without either, the daemon is not built and the daemon tests and benchmark points skip.
# OUTDIR/parts.txt says which parts ran.
#
# The extension is built with the GPU codec when nvcc is found (GPU_CODEC=0 skips it). Upstream
# Mooncake (for the mooncake:// tests and the side-by-side benchmark) is used when
# `import mooncake.store` works, else installed from a wheel in .devdeps/wheels/ (e.g. the
# mooncake-transfer-engine-cuda13 wheel matching this machine's Python) into the build tree.
#
# Environment: PYTHON (python3), JOBS (nproc), BUILD_DIR (build-tensor-gpu), BENCH_ARGS (extra
# arguments of benchmarks/tensor_bench.py, e.g. "--iters 3"), CMAKE_ARGS (extra configure arguments,
# e.g. "-DCMAKE_STRIP=/bin/true" to keep the extension's symbols for a profiler), UPSTREAM_BENCH_ARGS (of
# benchmarks/upstream_tensor_bench.py), SKIP_TESTS=1, TEST_FILES (the pytest files
# to run), SKIP_BENCH=1, SKIP_UPSTREAM_BENCH=1, GPU_SYNC=1 (benchmarks/gpu_sync_bench.py with
# GPU_SYNC_ARGS: OUTDIR/gpu_sync.jsonl), BATCH_BENCH=1 (benchmarks/batch_bench.py --device cuda
# with BATCH_BENCH_ARGS: OUTDIR/batch.jsonl), XNODE=1 (benchmarks/xnode_tensor_bench.py --device
# cuda with XNODE_ARGS: OUTDIR/xnode.jsonl), NOSPIN=1 (the node points again with a client
# that sleeps for its replies: OUTDIR/tensor_bench_nospin.jsonl),
# NSYS=1 (profile 64 MiB puts/gets with nsys when present: OUTDIR/nsys_*.txt).
set -uo pipefail

out="${1:?usage: benchmarks/run_gpu_tensor.sh OUTDIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
mkdir -p "${out}"
out="$(cd "${out}" && pwd)"
py="${PYTHON:-python3}"
jobs="${JOBS:-$(nproc)}"
build="${BUILD_DIR:-${root}/build-tensor-gpu}"
devdeps="${DEVDEPS:-${root}/.devdeps}"
parts="${out}/parts.txt"
: > "${parts}"
note() { echo "$*" | tee -a "${parts}" >&2; }

note "host: $(hostname) $(date -u +%FT%TZ)"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>&1 || true; } | tee "${out}/device.txt" >&2
"${py}" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())" 2>&1 | tee -a "${parts}" >&2

# ---- 1. Shims for header-only dependencies missing here ---------------------------------------
shim="${build}/shim"
mkdir -p "${shim}/share/cmake/nlohmann_json"
prefix_path="${shim}"
if [[ -d "${devdeps}" ]]; then
    cat > "${shim}/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake" <<EOF
# A header-only stand-in for nlohmann_json's package config (headers from ${devdeps}).
if(NOT TARGET nlohmann_json::nlohmann_json)
    add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
    set_target_properties(nlohmann_json::nlohmann_json PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${devdeps}")
endif()
EOF
    cat > "${shim}/share/cmake/nlohmann_json/nlohmann_jsonConfigVersion.cmake" <<'EOF'
set(PACKAGE_VERSION "3.11.3")
set(PACKAGE_VERSION_COMPATIBLE TRUE)
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
    set(PACKAGE_VERSION_COMPATIBLE FALSE)
endif()
EOF
    extra_inc="-DMOONCAKE_SPARSE_XXHASH_INCLUDE_DIR=${devdeps} -DMOONCAKE_SPARSE_DLPACK_INCLUDE_DIR=${devdeps} -DMOONCAKE_SPARSE_RAPIDJSON_INCLUDE_DIR=${devdeps}"
    note "deps: header shims from ${devdeps}"
else
    rm -f "${shim}/share/cmake/nlohmann_json/"*.cmake
    extra_inc=""
    note "deps: no ${devdeps}; relying on system headers"
fi

# ---- 2. Configure + build (daemon only when gflags/glog/yaml-cpp are found) -------------------
pybind_dir="$("${py}" -m pybind11 --cmakedir)"
with_cuda=OFF
if [[ "${GPU_CODEC:-1}" == 1 ]] && { command -v nvcc > /dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; }; then
    with_cuda=ON
    command -v nvcc > /dev/null || export PATH="/usr/local/cuda/bin:${PATH}"
fi
note "GPU codec in the extension: ${with_cuda}"
configure() {
    cmake -S . -B "${build}" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_PREFIX_PATH="${prefix_path}" \
        -DPython_EXECUTABLE="$(command -v "${py}")" -Dpybind11_DIR="${pybind_dir}" \
        -DMOONCAKE_SPARSE_BUILD_PYTHON=ON -DMOONCAKE_SPARSE_BUILD_TESTS=OFF \
        -DMOONCAKE_SPARSE_BUILD_BENCHMARKS=OFF -DMOONCAKE_SPARSE_WITH_CUDA="${with_cuda}" \
        -DMOONCAKE_SPARSE_USE_CCACHE=OFF ${extra_inc} ${CMAKE_ARGS:-} "$@" > "${out}/configure.log" 2>&1
}
# Unpacks the daemon's dependencies from .devdeps/debs into the build tree (paths rewritten).
unpack_debs() {
    local debroot="${build}/debroot" d
    ls "${devdeps}"/debs/*.deb > /dev/null 2>&1 || return 1
    rm -rf "${debroot}"
    mkdir -p "${debroot}"
    for d in "${devdeps}"/debs/*.deb; do
        if command -v dpkg > /dev/null; then
            dpkg -x "${d}" "${debroot}" || return 1
        else
            (cd "${debroot}" && ar p "${d}" "$(ar t "${d}" | grep '^data.tar')" | tar -x -f - \
                --use-compress-program="$(case "$(ar t "${d}" | grep '^data.tar')" in
                    *.xz) echo xz;; *.zst) echo zstd;; *) echo gzip;; esac) -d") || return 1
        fi
    done
    local lib="${debroot}/usr/lib/x86_64-linux-gnu"
    sed -i "s|^prefix=/usr\$|prefix=${debroot}/usr|" "${lib}"/pkgconfig/*.pc
    sed -i "s|\"/usr/share/glog/cmake\"|\"${debroot}/usr/share/glog/cmake\"|" \
        "${lib}"/cmake/glog/*.cmake 2> /dev/null
    prefix_path="${prefix_path};${debroot}/usr"
    export PKG_CONFIG_PATH="${lib}/pkgconfig${PKG_CONFIG_PATH:+:${PKG_CONFIG_PATH}}"
    export LD_LIBRARY_PATH="${lib}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
    note "deps: daemon dependencies unpacked from ${devdeps}/debs into ${debroot}"
}
# A build tree kept from an earlier run already has them unpacked (and configured against them).
if [[ -d "${build}/debroot/usr/lib/x86_64-linux-gnu" ]]; then
    prefix_path="${prefix_path};${build}/debroot/usr"
    export LD_LIBRARY_PATH="${build}/debroot/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
fi
daemon=1
if ! configure -DMOONCAKE_SPARSE_BUILD_DAEMON=ON && ! { unpack_debs && configure -DMOONCAKE_SPARSE_BUILD_DAEMON=ON; }; then
    daemon=0
    if ! configure -DMOONCAKE_SPARSE_BUILD_DAEMON=OFF; then
        note "FAILED: cmake configure (see configure.log)"
        exit 1
    fi
fi
targets=(_core)
[[ "${daemon}" == 1 ]] && targets+=(mooncake_sparse_node)
if ! cmake --build "${build}" -j"${jobs}" --target "${targets[@]}" > "${out}/build.log" 2>&1; then
    note "FAILED: build (see build.log)"
    tail -40 "${out}/build.log" >&2
    exit 1
fi
note "built: _core$([[ "${daemon}" == 1 ]] && echo ' + mooncake_sparse_node (daemon)' || echo '; daemon NOT built (gflags/glog/yaml-cpp missing): daemon tests/points skip')"

# ---- 3. A package tree: python/mooncake/sparse + the extension (+ bin/mooncake_sparse_node) ----
pkg="${build}/pyroot/mooncake/sparse"
rm -rf "${build}/pyroot"
mkdir -p "${pkg}/bin"
cp python/mooncake/sparse/*.py python/mooncake/sparse/py.typed "${pkg}/"
cp "${build}"/python/_core*.so "${pkg}/"
[[ "${daemon}" == 1 ]] && cp "${build}/src/node/mooncake_sparse_node" "${pkg}/bin/"
export PYTHONPATH="${build}/pyroot${PYTHONPATH:+:${PYTHONPATH}}"
# Upstream Mooncake: installed already, or from a wheel in .devdeps/wheels (no network needed).
if ! "${py}" -c "import mooncake.store" > /dev/null 2>&1; then
    wheel="$(ls "${devdeps}"/wheels/mooncake_transfer_engine*.whl 2> /dev/null | head -1)"
    if [[ -n "${wheel}" ]]; then
        rm -rf "${build}/upstream"
        if "${py}" -m pip install -q --no-deps --no-index --target "${build}/upstream" "${wheel}" \
            > "${out}/upstream_install.log" 2>&1; then
            export PYTHONPATH="${PYTHONPATH}:${build}/upstream"
            note "upstream: $(basename "${wheel}") installed into the build tree"
        else
            note "upstream: installing $(basename "${wheel}") failed (see upstream_install.log)"
        fi
    fi
fi
"${py}" -c "import mooncake.store, mooncake.sparse as m; print('upstream importable; mooncake.sparse at', m.__file__)" 2>&1 | tail -1 | tee -a "${parts}" >&2
# The daemon has no torch to bring libcudart along: point the loader at torch's copy (and the
# toolkit's) so that it, too, finds the CUDA runtime.
cudart_dir="$("${py}" - <<'EOF' 2>/dev/null
import glob, os
import torch
base = os.path.dirname(os.path.dirname(torch.__file__))
found = []
for pattern in ("nvidia/cu*/lib/libcudart.so*", "nvidia/cuda_runtime/lib/libcudart.so*",
                "torch/lib/libcudart*.so*"):
    found += glob.glob(os.path.join(base, pattern))
print(os.path.dirname(sorted(found)[0]) if found else "")
EOF
)"
export LD_LIBRARY_PATH="${cudart_dir:+${cudart_dir}:}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
note "cudart search path: ${LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
unset MOONCAKE_SPARSE_NODE_BIN
"${py}" -c "import mooncake.sparse as m; print('capabilities', m.connect().capabilities())" 2>&1 | tee -a "${parts}" >&2

status=0
# ---- 4. Tests (from outside the tree, so the package above is what is imported) --------------
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
    (cd /tmp && "${py}" -m pytest -q -p no:cacheprovider -rs --junitxml="${out}/pytest.xml" \
        ${TEST_FILES:-"${root}/tests/python/test_tensor_gpu.py" "${root}/tests/python/test_tensor.py" \
        "${root}/tests/python/test_gpu_codec.py" "${root}/tests/python/test_upstream.py"}) \
        > "${out}/pytest.log" 2>&1
    rc=$?
    note "tests: rc=${rc} ($(tail -1 "${out}/pytest.log"))"
    grep -E "^SKIPPED|FAILED|^ERROR" "${out}/pytest.log" | head -40 | tee -a "${parts}" >&2
    [[ ${rc} != 0 ]] && status=1
fi

# ---- 5. Benchmark -----------------------------------------------------------------------------
if [[ "${SKIP_BENCH:-0}" != 1 ]]; then
    # shellcheck disable=SC2086
    "${py}" benchmarks/tensor_bench.py --json "${out}/tensor_bench.jsonl" ${BENCH_ARGS:-} \
        > /dev/null 2> "${out}/tensor_bench.log"
    rc=$?
    note "bench: rc=${rc}, $(grep -c '"what": "tensor_\|"what": "staged_' "${out}/tensor_bench.jsonl" 2>/dev/null || echo 0) result lines"
    [[ ${rc} != 0 ]] && { tail -20 "${out}/tensor_bench.log" >&2; status=1; }
fi
# ---- 5b. The node client sleeping for its replies instead of polling (NOSPIN=1) ------------
if [[ "${NOSPIN:-0}" == 1 && "${SKIP_BENCH:-0}" != 1 ]]; then
    # shellcheck disable=SC2086
    "${py}" benchmarks/tensor_bench.py --json "${out}/tensor_bench_nospin.jsonl" --backends node \
        --node-reply-spin-max 0 ${BENCH_ARGS:-} > /dev/null 2> "${out}/tensor_bench_nospin.log"
    rc=$?
    note "bench (no reply spin): rc=${rc}"
    [[ ${rc} != 0 ]] && { tail -20 "${out}/tensor_bench_nospin.log" >&2; status=1; }
fi
# ---- 5c. A whole sparse RL step of a MoE layer against the dense paths (GPU_SYNC=1) ---------
if [[ "${GPU_SYNC:-0}" == 1 ]]; then
    # shellcheck disable=SC2086
    "${py}" benchmarks/gpu_sync_bench.py --json "${out}/gpu_sync.jsonl" ${GPU_SYNC_ARGS:-} \
        > /dev/null 2> "${out}/gpu_sync.log"
    rc=$?
    note "gpu_sync bench: rc=${rc}, $(grep -c '"what": "gpu_sync"' "${out}/gpu_sync.jsonl" 2>/dev/null || echo 0) result lines"
    [[ ${rc} != 0 ]] && { tail -20 "${out}/gpu_sync.log" >&2; status=1; }
fi
# ---- 5d. Fixed cost per object of the batch calls with every tensor on the GPU (BATCH_BENCH=1) -
if [[ "${BATCH_BENCH:-0}" == 1 ]]; then
    # shellcheck disable=SC2086
    "${py}" benchmarks/batch_bench.py --device cuda --json "${out}/batch.jsonl" ${BATCH_BENCH_ARGS:-} \
        > /dev/null 2> "${out}/batch.log"
    rc=$?
    note "batch bench (cuda): rc=${rc}"
    [[ ${rc} != 0 ]] && { tail -20 "${out}/batch.log" >&2; status=1; }
fi
# ---- 5e. Tensors across nodes (two daemons on one master, XNODE=1) ------------------------------
if [[ "${XNODE:-0}" == 1 ]] && "${py}" -c "import mooncake.store" > /dev/null 2>&1; then
    # shellcheck disable=SC2086
    "${py}" benchmarks/xnode_tensor_bench.py --device cuda --json "${out}/xnode.jsonl" ${XNODE_ARGS:-} \
        > /dev/null 2> "${out}/xnode.log"
    rc=$?
    note "xnode bench (cuda): rc=${rc}"
    [[ ${rc} != 0 ]] && { tail -20 "${out}/xnode.log" >&2; status=1; }
fi
# ---- 6. Side by side with upstream Mooncake's tensor calls -------------------------------------
if [[ "${SKIP_UPSTREAM_BENCH:-0}" != 1 ]] && "${py}" -c "import mooncake.store" > /dev/null 2>&1; then
    # shellcheck disable=SC2086
    "${py}" benchmarks/upstream_tensor_bench.py --json "${out}/upstream_tensor_bench.jsonl" \
        ${UPSTREAM_BENCH_ARGS:-} > /dev/null 2> "${out}/upstream_tensor_bench.log"
    rc=$?
    note "upstream bench: rc=${rc}, $(wc -l < "${out}/upstream_tensor_bench.jsonl" 2>/dev/null || echo 0) lines"
    [[ ${rc} != 0 ]] && { tail -20 "${out}/upstream_tensor_bench.log" >&2; status=1; }
fi

# ---- 7. Where the fixed cost of a 64 MiB put/get goes (nsys, when present) ---------------------
if [[ "${NSYS:-0}" == 1 ]] && command -v nsys > /dev/null; then
    for backend in embedded node; do
        nsys profile -q -t cuda,osrt -o "${out}/nsys_${backend}" --force-overwrite true \
            "${py}" benchmarks/tensor_bench.py --sizes-mib 64 --batch "" --devices cuda --backends "${backend}" \
            --iters 20 > /dev/null 2>&1
        nsys stats -q --report cuda_api_sum,cuda_gpu_trace --format csv \
            "${out}/nsys_${backend}.nsys-rep" > "${out}/nsys_${backend}.txt" 2>&1
        rm -f "${out}/nsys_${backend}.nsys-rep" "${out}/nsys_${backend}.sqlite"
    done
    note "nsys: profiles in nsys_*.txt"
fi
exit ${status}
