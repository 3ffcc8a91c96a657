#!/usr/bin/env bash
# GPU check of the engine layer: on an NVIDIA machine with the regular `vllm` wheel installed in
# the active Python (pip install -e . vllm), build a small Qwen2 model, generate with VLLMEngine,
# compare log-probs with HF, update weights and prove the update took, print tokens/s; then the
# sharded learner step: 2 FSDP2 + bf16 learner ranks (RLlib learner group) on a random-init
# Qwen2.5-0.5B-shaped model, weight sync into vLLM, peak GPU memory per rank. On a 1-GPU machine
# the 2 ranks share the GPU (num_gpus_per_learner=0.4 each, gloo process group: NCCL refuses two
# ranks on one device). Needs ray (a project dependency); nothing is downloaded.
# Usage: bash benchmarks/gpu_check.sh [extra args for gpu_check.py]
#   GPU_CHECK_BOTH=0     skip the load_weights engine run
#   GPU_CHECK_SHARDED=0  skip the sharded learner step
#   GPU_CHECK_TP=0       skip the tensor-parallel env-runner step (GPU_CHECK_TP_SIZE=K: its
#                        tensor_parallel_size, default 1: fits one GPU)
# Without a GPU: python benchmarks/gpu_check.py --cpu-smoke (the same sharded code path on CPU).
# Without Ray and vLLM (a bare GPU machine): python benchmarks/gpu_learner_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
$PY -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'vllm', vllm.__version__)"
export VLLM_ENABLE_V1_MULTIPROCESSING=${VLLM_ENABLE_V1_MULTIPROCESSING:-0}
export TOKENIZERS_PARALLELISM=false
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
rc=0
# 1) default path: reload_weights (what the CPU backend needs too)
timeout 420 $PY benchmarks/gpu_check.py "$@" || rc=$?
# 2) the plain load_weights path, in a fresh process (GPU only)
if [ "${GPU_CHECK_BOTH:-1}" = "1" ]; then
  timeout 300 $PY benchmarks/gpu_check.py --update-method load_weights --prompts 16 --max-new 32 "$@" || rc=$?
fi
# 3) the sharded learner step (2 FSDP2 ranks, bf16) + weight sync into vLLM, in a fresh process
if [ "${GPU_CHECK_SHARDED:-1}" = "1" ]; then
  timeout 600 $PY benchmarks/gpu_check.py --sharded-only "$@" || rc=$?
fi
# 4) a vLLM env runner with tensor_parallel_size K built by RLlib from the config (its bundle and
#    actor hold K GPUs) + one training iteration, in a fresh process (benchmarks/gpu_tp_runner.py)
if [ "${GPU_CHECK_TP:-1}" = "1" ]; then
  timeout 300 $PY benchmarks/gpu_check.py --tp-runner-only --tp-size "${GPU_CHECK_TP_SIZE:-1}" "$@" || rc=$?
fi
exit $rc
