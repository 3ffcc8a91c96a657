"""Load a policy's HF causal LM and score a learner batch with it, without Ray.

``HFCausalLMRLModule`` (models/rl_module.py) builds its model with :func:`load_causal_lm` and
runs its forward pass with :func:`score_batch`; the RLlib-free update core of the learner
(learner/core.py) and benchmarks/gpu_learner_check.py call the same two
functions, so a machine without Ray (a bare GPU box) exercises the code the learner runs.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch

from .dtypes import torch_dtype
from .logprobs import token_logprobs

__all__ = ["load_causal_lm", "score_batch"]


def load_causal_lm(model_path: str | None = None, *, config: Any = None, dtype: str | torch.dtype = "float32",
                   lora: Mapping[str, Any] | None = None, gradient_checkpointing: bool = False,
                   empty: bool = False, device: str | torch.device | None = None,
                   attn_implementation: str | None = None) -> torch.nn.Module:
    """The HF causal LM of a policy, as the learner's module holds it.

    ``model_path``: a ``save_pretrained`` folder, read with ``from_pretrained``. ``config`` instead
    (a transformers ``PretrainedConfig``): a random-init model of that architecture (no files;
    the GPU check's 1.5B and 7B shapes). ``empty``: the architecture only, on the meta device
    (an FSDP rank other than 0 gets its shards from rank 0). ``device``: where a random-init
    model is built (initialising billions of weights on a GPU takes seconds, on a CPU minutes).
    ``gradient_checkpointing``: non-reentrant activation checkpointing of the blocks (and no KV
    cache). ``lora``: ``peft.LoraConfig`` kwargs; the returned model is then the PEFT model,
    whose adapters alone train. ``attn_implementation``: transformers' attention kernel
    ("sdpa", "eager", "flex_attention", "sdpa_varlen", ...; None: transformers' default, "sdpa" where
    it can), e.g. "sdpa_varlen" (models/varlen_attention.py) or "flex_attention" for packed
    micro-batches (docs/design.md "Packed micro-batches")."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from . import varlen_attention  # noqa: F401  registers "sdpa_varlen" before a config names it

    dt = torch_dtype(dtype)
    attn = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if (model_path is None) == (config is None):
        raise ValueError("load_causal_lm needs exactly one of model_path and config")
    if empty:
        with torch.device("meta"):
            cfg = config if config is not None else AutoConfig.from_pretrained(model_path)
            model = AutoModelForCausalLM.from_config(cfg, dtype=dt, **attn)
    elif config is not None:
        with torch.device(device if device is not None else "cpu"):
            model = AutoModelForCausalLM.from_config(config, dtype=dt, **attn)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dt, **attn)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if lora:
        from peft import LoraConfig, get_peft_model

        lcfg = dict(lora)
        lcfg.setdefault("task_type", "CAUSAL_LM")
        model = get_peft_model(model, LoraConfig(**lcfg))
        if gradient_checkpointing:
            # frozen embeddings under checkpointed blocks: their output must ask for a gradient
            model.enable_input_require_grads()
    return model


def score_batch(model: torch.nn.Module, batch: Mapping[str, Any], *, device: torch.device,
                temperature: float = 1.0, chunk_size: int | None = None,
                need_entropy: bool = True, packed: bool = False) -> dict[str, torch.Tensor]:
    """The module's forward pass on a learner (micro-)batch: ``{"logp": [B, T]}``, plus
    ``"entropy"`` when asked for (``batch["_need_entropy"]``, default ``need_entropy``), or,
    without it, ``"entropy_sample"``: a detached entropy at ``batch["_entropy_mask"]`` only.
    Only ``batch["_score_mask"]`` positions go through the output head
    (``models.logprobs.token_logprobs``). ``packed``: the body runs over the real tokens of the
    rows packed into one (the learner's ``packed_microbatches``; ``models.packing``)."""
    ids = torch.as_tensor(batch["input_ids"], dtype=torch.long, device=device)
    mask = batch.get("attention_mask")
    mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask, device=ids.device).long()
    need = batch.get("_need_entropy", need_entropy)
    score = batch.get("_score_mask")
    sample = None if need else batch.get("_entropy_mask")
    out = token_logprobs(
        model,
        ids,
        mask,
        temperature=temperature,
        chunk_size=chunk_size,
        return_entropy=bool(need),
        score_mask=None if score is None else torch.as_tensor(score, device=ids.device),
        entropy_mask=None if sample is None else torch.as_tensor(sample, device=ids.device),
        packed=packed,
    )
    if need:
        return {"logp": out[0], "entropy": out[1]}
    if sample is not None:
        return {"logp": out[0], "entropy_sample": out[1]}
    return {"logp": out}
