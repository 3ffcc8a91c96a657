#!/usr/bin/env bash
# Install (if needed) and run the SPEAR CPU demo on the embedded search task and model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export GLOO_SOCKET_IFNAME=lo RAY_AUTH_MODE=disabled
.venv/bin/rllib-spear train configs/spear_cpu_demo.yaml "$@"
