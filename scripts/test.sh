#!/usr/bin/env bash
# Install (if needed) and run the test suite. Extra args go to pytest.
# With CI=true every cache (rllib_spear's built policies, data and BM25 indexes, HF, torch, vLLM,
# pip) is an empty temporary folder, removed at the end: no state of the machine can make CI pass.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${CI:-}" = true ]; then
  CACHE_ROOT=$(mktemp -d "${TMPDIR:-/tmp}/rllib_spear_ci_cache.XXXXXX")
  trap 'rm -rf "$CACHE_ROOT"' EXIT
  export RLLIB_SPEAR_CACHE="$CACHE_ROOT/rllib_spear" HF_HOME="$CACHE_ROOT/hf" TORCH_HOME="$CACHE_ROOT/torch" \
    XDG_CACHE_HOME="$CACHE_ROOT/xdg" VLLM_CACHE_ROOT="$CACHE_ROOT/vllm" PIP_CACHE_DIR="$CACHE_ROOT/pip" \
    TRITON_CACHE_DIR="$CACHE_ROOT/triton" NUMBA_CACHE_DIR="$CACHE_ROOT/numba"
  unset RLLIB_SPEAR_DATA_DIR RLLIB_SPEAR_BUILD_DEFAULT_POLICY
  echo "CI: empty caches under $CACHE_ROOT"
fi
bash scripts/install.sh
export VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 GLOO_SOCKET_IFNAME=lo RAY_AUTH_MODE=disabled
# pytest exits 5 when no test ran: that is a failure for us too (set -e keeps it non-zero).
.venv/bin/python -m pytest -q -rs "$@"
