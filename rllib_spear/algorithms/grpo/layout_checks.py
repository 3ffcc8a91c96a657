"""validate() of the learners' layout (docs/design.md "Learner sharding"): sharding, mixed
precision, CPU offload, master-weight dtype, and the memory plan when GPU memory is declared.
``cfg`` is the algorithm config; ``err(message)`` raises naming the knob."""
from __future__ import annotations

import logging
from typing import Any, Callable

from ray.util import log_once

from ...models.packing import PACKED_ATTENTION
from .defaults import LOW_PRECISION_MASTER_EFFECT, MIXED_PRECISION, SHARDING_STRATEGIES

__all__ = ["check_learner_layout", "check_memory_plan"]


def check_learner_layout(cfg: Any, err: Callable[[str], None]) -> None:
    """sharding / mixed_precision / cpu_offload / model dtype (docs/design.md "Learner sharding")."""
    if cfg.sharding not in SHARDING_STRATEGIES:
        err(f"`sharding` must be one of {SHARDING_STRATEGIES} (set it with .learners(sharding=...)), "
            f"got {cfg.sharding!r}")
    if cfg.mixed_precision not in MIXED_PRECISION:
        err(f"`mixed_precision` must be None, 'bf16' or 'auto' (.learners(mixed_precision=...)), "
            f"got {cfg.mixed_precision!r}")
    if cfg.sharding == "fsdp" and cfg.num_learners < 1:
        err("`sharding='fsdp'` runs on remote learner ranks: set .learners(num_learners=N) with N >= 1 "
            f"(got num_learners={cfg.num_learners})")
    if cfg.sharding == "fsdp" and cfg.grad_clip is not None and cfg.grad_clip_by != "global_norm":
        err("`sharding='fsdp'` clips by the global norm over all shards: set .training(grad_clip_by="
            f"'global_norm') (got {cfg.grad_clip_by!r})")
    packed = getattr(cfg, "packed_microbatches", False)
    if not isinstance(packed, bool):
        err(f"`packed_microbatches` must be True or False (.learners(packed_microbatches=...)), got {packed!r}")
    attn = (cfg.model_config or {}).get("attn_implementation")
    if attn is not None and not (isinstance(attn, str) and attn):
        err("`model_config['attn_implementation']` must be a transformers attention name ('sdpa', 'eager', "
            f"'flex_attention', ...) or None for transformers' default, got {attn!r}")
    elif packed is True and attn is not None and attn not in PACKED_ATTENTION:
        err(f"`packed_microbatches=True` masks the packed rows through the attention mask transformers builds "
            f"for {PACKED_ATTENTION}; `model_config['attn_implementation']` is {attn!r}: pick one of those, or set "
            ".learners(packed_microbatches=False)")
    if cfg.cpu_offload and cfg.sharding != "fsdp":
        err("`cpu_offload=True` offloads FSDP shards: use it with .learners(sharding='fsdp')")
    cpus = getattr(cfg, "num_cpus_per_learner", "auto")
    if (cfg.cpu_offload and (getattr(cfg, "num_gpus_per_learner", 0) or 0) > 0
            and (not isinstance(cpus, (int, float)) or cpus < 1) and log_once("offload_one_thread")):
        # GPU learners reserve no CPU by default ("auto" = 0): the offloaded AdamW step would run
        # on one thread (models/threads.py). A warning: the CPUs a node can spare are the user's call.
        logging.getLogger(__name__).warning(
            "cpu_offload=True runs the AdamW step of each learner's shards on the CPU, with one torch "
            "thread per learner at num_cpus_per_learner=%r: reserve cores for it with "
            ".learners(num_cpus_per_learner=N) (N threads per learner).", cpus)
    if cfg.gpu_memory_gb is not None and (not isinstance(cfg.gpu_memory_gb, (int, float))
                                           or cfg.gpu_memory_gb <= 0):
        err(f"`gpu_memory_gb` must be a number > 0 or None, got {cfg.gpu_memory_gb!r}")
    from ...models.dtypes import dtype_name

    try:
        dtype = dtype_name((cfg.model_config or {}).get("dtype", "float32"))
    except ValueError:
        return  # reported by validate() already
    if cfg.mixed_precision == "bf16" and dtype != "float32":
        err(f"`mixed_precision='bf16'` keeps fp32 master weights and computes in bf16: set "
            f"model_config['dtype'] to 'float32' (or drop it), got {dtype!r}")
    if cfg.mixed_precision in (None, "auto") and dtype in ("bfloat16", "float16") and log_once("low_precision_master"):
        logging.getLogger(__name__).warning(
            "model_config['dtype']=%r trains %s weights with %s AdamW state: most updates round away "
            "(benchmarks/master_weights.py, one AdamW step at lr 1e-6: %s). Use "
            ".learners(mixed_precision='bf16') with float32 master weights instead.",
            dtype, dtype, dtype, LOW_PRECISION_MASTER_EFFECT)
    check_memory_plan(cfg, err)
    check_cpu_learner_memory_once(cfg)

def check_cpu_learner_memory_once(cfg: Any) -> None:
    """CPU learners whose planned peak exceeds this machine's available RAM: a warning (once per
    process) naming the budget and activation checkpointing that fit, instead of an OOM kill in
    the first update. A warning, not an error: the learners may run on another machine, and the
    CPU estimate is the GPU planner's (docs/memory_planner.md)."""
    from ...planning import check_cpu_learner_memory

    msg = check_cpu_learner_memory(cfg)
    if msg and log_once("cpu_learner_memory"):
        logging.getLogger(__name__).warning("%s", msg)


def check_memory_plan(cfg: Any, err: Callable[[str], None]) -> None:
    """With ``gpu_memory_gb`` (or ``engine_gpu_memory_gb``) declared, refuse a config whose memory
    plan (rllib_spear/planning/, ``rllib-spear plan``) does not fit, naming the knob to change.
    Reads the model's config.json only (no weights, no torch); nothing to do when neither is set."""
    if cfg.gpu_memory_gb is None and cfg.engine_gpu_memory_gb is None:
        return
    g = cfg.engine_gpu_memory_gb
    if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or g <= 0):
        err(f"`engine_gpu_memory_gb` must be a number > 0 or None, got {g!r}")
    from ...planning import MEMORY_ERROR, check_fits

    try:
        msg = check_fits(cfg)
    except ValueError as e:  # no shape for the model, or a value the planner cannot size
        msg = (f"{MEMORY_ERROR} cannot check that the config fits gpu_memory_gb / engine_gpu_memory_gb: {e} "
               "(or drop gpu_memory_gb to skip the check)")
    if msg:
        err(msg)
