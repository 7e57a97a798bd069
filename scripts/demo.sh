#!/usr/bin/env bash
# Main job: build and install mooncake.sparse, then run the end-to-end sparse update demo on the
# embedded store. Extra arguments go to the demo (e.g. --quick, --apply scatter_add, --json PATH).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bash scripts/install_deps.sh

mcs_step "pip install . (mooncake.sparse)"
mcs_pip install -q --no-build-isolation .

mcs_step "python -m mooncake.sparse.demo $*"
cd /tmp
exec python3 -m mooncake.sparse.demo "$@"
