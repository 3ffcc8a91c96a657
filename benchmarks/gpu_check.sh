#!/usr/bin/env bash
# GPU check of the engine layer: on an NVIDIA machine with the regular `vllm` wheel installed in
# the active Python (pip install -e . vllm), build a small Qwen2 model, generate with VLLMEngine,
# compare log-probs with HF, update weights and prove the update took, print tokens/s.
# Usage: bash benchmarks/gpu_check.sh [extra args for gpu_check.py]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
$PY -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'vllm', vllm.__version__)"
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
export TOKENIZERS_PARALLELISM=false
rc=0
# 1) default path: reload_weights (what the CPU backend needs too)
timeout 420 $PY benchmarks/gpu_check.py "$@" || rc=$?
# 2) the plain load_weights path, in a fresh process (GPU only)
if [ "${GPU_CHECK_BOTH:-1}" = "1" ]; then
  timeout 300 $PY benchmarks/gpu_check.py --update-method load_weights --prompts 16 --max-new 32 "$@" || rc=$?
fi
exit $rc
