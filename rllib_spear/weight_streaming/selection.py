"""Which transport and which vLLM weight-transfer backend a config uses (docs/design.md "Weight
streaming"); pure functions, no vLLM or Ray import."""
from __future__ import annotations

__all__ = ["GLOO_BACKEND", "TRANSFER_BACKENDS", "resolve_transport", "resolve_transfer_backend"]

#: The name of this project's CPU backend in vLLM's weight-transfer factories
#: (``weight_streaming/vllm_transfer.py``).
GLOO_BACKEND = "rllib_spear_gloo"
#: ``weight_transfer_backend`` values besides "auto".
TRANSFER_BACKENDS = ("nccl", "ipc", GLOO_BACKEND)


def resolve_transport(transport: str | None, engine: str) -> str:
    """``weight_sync_transport`` as used: None means "vllm" for vLLM engines (vLLM's own
    weight-transfer API) and "object_store" for the HF engine."""
    if transport is None:
        return "vllm" if engine == "vllm" else "object_store"
    return transport


def resolve_transfer_backend(backend: str, *, learner_gpus: float, colocate: bool) -> str:
    """``weight_transfer_backend`` as used: "auto" is ``GLOO_BACKEND`` for CPU learners, "ipc"
    when each engine shares its learner's GPU (``colocate``), else "nccl"."""
    if backend != "auto":
        return backend
    if not learner_gpus:
        return GLOO_BACKEND
    return "ipc" if colocate else "nccl"
