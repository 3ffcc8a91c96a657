"""The memory planner: what one learner GPU and one engine GPU need for a config (``rllib-spear
plan``, docs/memory_planner.md). Pure Python (no torch, no Ray at import).

From the bottom up: ``layouts`` (constants, dtype sizes, :class:`LearnerLayout`,
:class:`EngineLayout`), ``learner`` (activation peaks, packings, :func:`plan_learner`), ``engine``
(:func:`plan_engine`), ``colocate`` (one GPU shared by a learner rank and an engine),
``memory_plan`` (:class:`MemoryPlan` of a whole config), ``fixes`` (what to change when a part
does not fit), ``report`` (the text ``rllib-spear plan`` prints) and ``config_plan`` (:func:`plan`
and :func:`check_fits` of a GRPOConfig).
"""
from .colocate import ColocatedPlan, plan_colocated
from .config_plan import check_cpu_learner_memory, check_fits, learner_sequence_length, plan
from .engine import EnginePlan, plan_engine
from .fixes import plan_problems
from .layouts import GIB, MEMORY_ERROR, OVERHEAD_GIB, EngineLayout, LearnerLayout
from .learner import ActivationPeak, LearnerPlan, activation_peak, packed_cases, packing_cases, plan_learner
from .memory_plan import MemoryPlan, available_host_memory_gb, plan_memory
from .report import format_plan

__all__ = [
    "GIB", "OVERHEAD_GIB", "MEMORY_ERROR", "LearnerLayout", "EngineLayout", "ActivationPeak", "LearnerPlan",
    "EnginePlan", "ColocatedPlan", "MemoryPlan", "activation_peak", "packed_cases", "packing_cases", "plan_learner", "plan_engine",
    "plan_colocated", "plan_memory", "available_host_memory_gb", "plan", "check_fits", "check_cpu_learner_memory", "learner_sequence_length", "plan_problems", "format_plan",
]
