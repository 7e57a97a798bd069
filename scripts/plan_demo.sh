#!/usr/bin/env bash
# Main job: build the planner tool (Release) and plan a Kimi-K2 weight update.
# Extra arguments are passed to mooncake_sparse_plan.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bash scripts/install_deps.sh

if [[ ! -f benchmarks/plan_bench.cc ]]; then
    echo "plan_demo: benchmarks/plan_bench.cc (mooncake_sparse_plan) does not exist yet" >&2
    exit 1
fi

mcs_step "configure + build build/release (mooncake_sparse_plan)"
mcs_configure_release
cmake --build build/release -j"${JOBS}" --target mooncake_sparse_plan

mcs_step "mooncake_sparse_plan --model kimi-k2 --summary $*"
exec build/release/benchmarks/mooncake_sparse_plan --model kimi-k2 --summary "$@"
