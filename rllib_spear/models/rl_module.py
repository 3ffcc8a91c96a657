"""An RLlib (new API stack) ``TorchRLModule`` that holds a Hugging Face causal LM.

``model_config`` keys:
    model_path (str, required): a ``save_pretrained`` folder. A cold-start name ("embedded",
        "embedded:<task>") is resolved to its folder before the module is built, by
        ``rllib_spear.coldstart.resolve_model_path`` (``GRPO.setup`` does it once on the driver
        and rewrites the config; the env runners and the CLI call it too).
    dtype (str): "float32" (default), "bfloat16"/"bf16", "float16"/"fp16" (``models.dtypes``).
    lora (dict | None): ``peft.LoraConfig`` kwargs (e.g. ``{"r": 8, "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"]}``); only the adapters train.
    gradient_checkpointing (bool): activation checkpointing in the transformer body.
    logprob_chunk_size (int | None): positions per output-head chunk (default: automatic, about
        64 MB of float32 logits per chunk).
    temperature (float): score under softmax(logits / T) (default 1.0, match the sampler's T).
    compute_entropy (bool): default of the per-call entropy switch (default True). The
        full-vocabulary entropy costs an extra pass over the logits of every head chunk (and its
        recomputation in the backward pass), so callers that do not need it turn it off per call
        with ``batch["_need_entropy"] = False`` (the GRPO learner does when ``entropy_coeff == 0``,
        see ``GRPOTorchLearner``).

``forward_train(batch)`` takes ``input_ids`` and ``attention_mask`` ([B, T] tensors) and returns
``{"logp": [B, T], "entropy": [B, T]}`` (``entropy`` only when requested, see
``compute_entropy``) aligned like ``rllib_spear.core.trajectory`` (position t
is about token t; position 0 and padding are 0). Optional batch keys: ``_score_mask`` [B, T]
(only those positions go through the output head, the others hold 0: the learner passes its
loss mask, ``models.logprobs.token_logprobs``), and, when no entropy is requested,
``_entropy_mask`` [B, T]: a detached entropy at those positions only, returned as
``entropy_sample`` (the learner's entropy-metric sample).

State: ``get_state`` returns torch tensors with Hugging Face parameter names (no module prefix,
tied ``lm_head.weight`` dropped), in the model's dtype, on CPU -- never RLlib's float32 numpy
conversion, which fails on bf16. ``get_state(inference_only=True)`` returns the merged weights
(base + LoRA deltas) under the base model's names, ready for ``GenerationEngine.update_weights``
and for an inference-only module's ``set_state``. Without ``inference_only`` a LoRA module returns
its full PEFT state (base and adapter weights) for checkpoints.

Sharded (FSDP2, ``models.sharding``): ``get_state`` is a collective. Every rank gathers the
parameters one tensor at a time; rank 0 keeps a CPU copy of each and returns the state, the other
ranks return ``{}``. ``set_state`` with whole tensors scatters each rank's shards.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any, Collection, Dict, Optional, Union

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.core.rl_module.torch import TorchRLModule

from ..rllib_private import ray_deprecation_logger
from .hf_policy import load_causal_lm, score_batch

__all__ = ["HFCausalLMRLModule", "hf_rl_module_spec", "empty_weights"]


class _RLlibOwnRLModuleConfigNotice(logging.Filter):
    """Drops RLlib's "`RLModule(config=[RLModuleConfig object])` has been deprecated" notice.

    RLlib's own ``RLModule.__init__`` builds the deprecated ``RLModuleConfig`` for every module
    (ray/rllib/core/rl_module/rl_module.py), whatever the subclass passes: this module uses the
    new constructor, so the notice, printed by every learner and runner, names nothing a user
    can change and reads like a failure. Every other deprecation notice still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "RLModule(config=[RLModuleConfig" not in record.getMessage()


ray_deprecation_logger().addFilter(_RLlibOwnRLModuleConfigNotice())

#: Set by ``empty_weights()``: modules built meanwhile hold meta-device (unallocated) weights.
_EMPTY_INIT: contextvars.ContextVar[bool] = contextvars.ContextVar("rllib_spear_empty_init", default=False)


@contextlib.contextmanager
def empty_weights():
    """Build HFCausalLMRLModules on the meta device (no weights loaded) inside this block: the
    FSDP learner ranks other than 0 do, and receive rank 0's weights once sharded, so a node
    reads and holds one copy of the checkpoint instead of one per GPU."""
    token = _EMPTY_INIT.set(True)
    try:
        yield
    finally:
        _EMPTY_INIT.reset(token)


def _model_folder(path: str) -> str:
    """``model_config["model_path"]`` as a folder to load; a cold-start name that was not resolved
    first is refused with the fix (this layer does not know the cold starts)."""
    if path == "embedded" or path.startswith("embedded:"):
        raise ValueError(
            f"HFCausalLMRLModule: model_path {path!r} names a cold start, not a folder: resolve it first "
            "with rllib_spear.coldstart.resolve_model_path (GRPO.setup does it for the learners)")
    return path


class HFCausalLMRLModule(TorchRLModule):
    """A causal LM as an RLModule; generation happens elsewhere (an engine), this scores tokens."""

    def setup(self) -> None:
        cfg = dict(self.model_config or {})
        if "model_path" not in cfg:
            raise ValueError("HFCausalLMRLModule needs model_config['model_path']")
        chunk = cfg.get("logprob_chunk_size")
        self._chunk_size = int(chunk) if chunk else None
        self._temperature = float(cfg.get("temperature", 1.0))
        self._compute_entropy = bool(cfg.get("compute_entropy", True))
        # packed scoring is a learner knob: the learner's layout sets it (learners(packed_microbatches=...))
        self.packed_microbatches = False
        path = _model_folder(str(cfg["model_path"]))
        lora = cfg.get("lora")
        self._is_lora = bool(lora) and not self.inference_only
        # The Ray-free loader (models/hf_policy.py; the GPU check without Ray calls it too). A
        # sharded learner rank other than 0 (``empty_weights``) builds the architecture only, on
        # the meta device; rank 0's weights arrive after sharding.
        model = load_causal_lm(path, dtype=cfg.get("dtype", "float32"), lora=lora if self._is_lora else None,
                               gradient_checkpointing=bool(cfg.get("gradient_checkpointing")) and not self.inference_only,
                               empty=_EMPTY_INIT.get(), attn_implementation=cfg.get("attn_implementation"))
        self._tied = bool(getattr(model.config, "tie_word_embeddings", False))
        self.model = model

    # ------------------------------------------------------------------ forward
    def _forward(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return score_batch(self.model, batch, device=self._device(), temperature=self._temperature,
                           chunk_size=self._chunk_size, packed=self.packed_microbatches,
                           need_entropy=kwargs.get("need_entropy", self._compute_entropy))

    def _forward_train(self, batch: Dict[str, Any], **kwargs) -> Dict[str, Any]:
        return self._forward(batch, **kwargs)

    def _device(self) -> torch.device:
        # The learner sets the compute device of a sharded model: with FSDP's CPU offload the
        # parameters live on the CPU while the inputs and the gathered blocks are on the GPU.
        dev = getattr(self, "compute_device", None)
        return dev if dev is not None else next(self.model.parameters()).device

    # ------------------------------------------------------------------ state
    def hf_model(self):
        """The underlying transformers model (the PEFT base model when LoRA is on)."""
        return self.model.get_base_model() if self._is_lora else self.model

    def _merged_hf_state(self, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Base-model names -> weights with the LoRA deltas added (no in-place merge), from the
        base model's (whole) state dict ``sd``: W + scaling * B @ A per active adapter."""
        from peft.tuners.lora import LoraLayer

        base = self.model.get_base_model()
        out: dict[str, torch.Tensor] = {}
        for k, v in sd.items():
            if "lora_" in k:
                continue
            out[k.replace(".base_layer.", ".")] = v
        for name, mod in base.named_modules():
            if isinstance(mod, LoraLayer) and not getattr(mod, "merged", False):
                key = f"{name}.weight"
                w = out[key]
                for adapter in mod.active_adapters:
                    if adapter in mod.lora_A:
                        a = sd[f"{name}.lora_A.{adapter}.weight"].float()
                        b = sd[f"{name}.lora_B.{adapter}.weight"].float()
                        delta = (b @ a) * float(mod.scaling[adapter])
                        if getattr(mod, "fan_in_fan_out", False):
                            delta = delta.T
                        w = w + delta.to(w.dtype)
                out[key] = w
        return out

    def _whole_state(self, model) -> dict[str, torch.Tensor] | None:
        """model.state_dict() as whole CPU tensors (gathered one by one when sharded; None on
        the ranks other than 0)."""
        from .sharding import is_sharded, iter_full_state

        sd = model.state_dict()
        if not is_sharded(model):
            return {k: v.detach().to("cpu", copy=True) for k, v in sd.items()}
        import torch.distributed as dist

        keep = (dist.get_rank() if dist.is_initialized() else 0) == 0
        out = {k: v for k, v in iter_full_state(sd, keep=keep)}
        return out if keep else None

    def get_state(
        self,
        components: Optional[Union[str, Collection[str]]] = None,
        *,
        not_components: Optional[Union[str, Collection[str]]] = None,
        inference_only: bool = False,
        **kwargs,
    ) -> Dict[str, Any]:
        with torch.no_grad():
            if self._is_lora and inference_only:
                sd = self._whole_state(self.model.get_base_model())
                sd = None if sd is None else self._merged_hf_state(sd)
            else:
                sd = self._whole_state(self.model)
        if sd is None:
            return {}
        out = {}
        for k, v in sd.items():
            if self._tied and k.endswith("lm_head.weight"):
                continue  # tied to the input embedding; shipping it twice doubles the payload
            out[k] = v
        return out

    @staticmethod
    def hf_state_dict_from_state(state: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        """An engine-ready HF state dict (torch tensors, HF names) from this module's
        ``get_state(inference_only=True)`` (numpy arrays are converted; a full PEFT state is
        refused: ask for ``inference_only=True``, which merges the adapters)."""
        if any("lora_" in k or k.startswith("base_model.model.") for k in state):
            raise ValueError("a PEFT (LoRA) module state is not an HF state dict: use get_state(inference_only=True)")
        return {k: (v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))) for k, v in state.items()}

    def set_state(self, state: Dict[str, Any]) -> None:
        if not state:
            return
        if self._is_lora and not any("lora_" in k or k.startswith("base_model.") for k in state):
            target = self.model.get_base_model()  # merged weights into a LoRA module: load the base
            if any(".base_layer." in k for k in target.state_dict()):
                raise ValueError("set_state: merged (inference-only) weights cannot be loaded into a LoRA module")
        else:
            target = self.model
        tensors = {}
        for k, v in state.items():
            t = v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v))
            tensors[k] = t
        from .sharding import is_sharded

        if is_sharded(target):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            # whole tensors on every rank -> each rank keeps its shards
            own = target.state_dict()
            missing = [k for k in own if k not in tensors]
            unexpected = [k for k in tensors if k not in own]
            if not unexpected:
                set_model_state_dict(target, tensors, options=StateDictOptions(full_state_dict=True, strict=False))
        else:
            missing, unexpected = target.load_state_dict(tensors, strict=False)
        missing = [k for k in missing if not (self._tied and k.endswith("lm_head.weight"))]
        if unexpected:
            raise ValueError(f"set_state: unexpected keys {list(unexpected)[:5]}")
        if missing:
            raise ValueError(f"set_state: missing keys {list(missing)[:5]}")


def hf_rl_module_spec(model_path: str, *, inference_only: bool = False, **options) -> RLModuleSpec:
    """An ``RLModuleSpec`` for ``HFCausalLMRLModule`` with placeholder spaces (token ids).
    ``options`` go to ``model_config`` (dtype, lora, gradient_checkpointing, ...)."""
    import json
    from pathlib import Path

    vocab = int(json.loads((Path(model_path) / "config.json").read_text()).get("vocab_size", 2))
    return RLModuleSpec(
        module_class=HFCausalLMRLModule,
        observation_space=gym.spaces.Box(0, vocab - 1, (1,), np.int64),
        action_space=gym.spaces.Discrete(vocab),
        inference_only=inference_only,
        model_config={"model_path": str(model_path), **options},
    )
