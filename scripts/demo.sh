#!/usr/bin/env bash
# Install (if needed) and run the SPEAR CPU demo on the embedded search task and model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export GLOO_SOCKET_IFNAME=lo RAY_AUTH_MODE=disabled
# A name is one experiment (rllib-spear train refuses to start one twice without --resume): the
# demo keeps an earlier run of it under a dated name and starts afresh.
if [ -d results/spear_cpu_demo ] && [[ " $* " != *" --resume "* ]]; then
  old="results/spear_cpu_demo.$(date +%Y%m%d-%H%M%S)"
  mv results/spear_cpu_demo "$old"
  echo "an earlier demo run was moved to $old"
fi
.venv/bin/rllib-spear train configs/spear_cpu_demo.yaml "$@"
