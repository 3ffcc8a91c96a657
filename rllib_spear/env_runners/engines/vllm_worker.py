"""The vLLM ``worker_extension_cls`` of this project's engines (``VLLMEngine``): methods that
``collective_rpc`` calls by name inside every vLLM worker process.

By name, not as functions: with the engine core in its own process
(``VLLM_ENABLE_V1_MULTIPROCESSING=1``) vLLM serialises ``collective_rpc`` arguments with
msgpack and refuses a function unless ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``; a method name
always travels. vLLM imports this class in each worker before the model and its weight-transfer
engine are built, so importing this module also registers the gloo weight-transfer backend there
(``weight_streaming/vllm_transfer.py``; a worker process does not inherit its parent's registry).
"""
from __future__ import annotations

import torch

from ...weight_streaming import vllm_transfer  # noqa: F401  (registers the gloo backend)
from .tensor_wire import decode_tensors

__all__ = ["WorkerExtension", "WORKER_EXTENSION"]

#: The qualified name ``VLLMEngine`` passes as ``worker_extension_cls``.
WORKER_EXTENSION = "rllib_spear.env_runners.engines.vllm_worker.WorkerExtension"


class WorkerExtension:
    """Mixed into vLLM's worker class (``self`` is the worker)."""

    def rllib_spear_reload(self, items) -> None:
        """vLLM's in-place reload (one layerwise reload) over HF-named tensors."""
        self.reload_weights(weights_iterator=decode_tensors(items) if isinstance(items, list) else items)

    def rllib_spear_load_weights(self, items) -> None:
        """``model.load_weights`` (inside a layerwise reload opened by ``rllib_spear_begin_reload``,
        or a plain load on GPU)."""
        self.model_runner.get_model().load_weights(weights=decode_tensors(items) if isinstance(items, list) else items)

    def rllib_spear_begin_reload(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model_runner.get_model())

    def rllib_spear_end_reload(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model_runner.get_model(), self.vllm_config.model_config)
        self.model_runner.reset_lora_state()

    def rllib_spear_seed_sampler(self, seed: int) -> None:
        """Seed the generator that requests without their own seed sample from (once per batch)."""
        torch.manual_seed(int(seed))

    def rllib_spear_repack_lm_head(self) -> None:
        """Re-pack a tied CPU ``lm_head``: vLLM's CPU backend keeps a packed copy of it that a
        reload does not refresh."""
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(self.model_runner.model.lm_head, remove_weight=False)
