"""Parts of the memory planner; the public API and the whole-config plan are in
:mod:`rllib_spear.planner`.

``layouts`` (constants, dtype sizes, :class:`LearnerLayout`, :class:`EngineLayout`), ``learner``
(activation peaks, packing cases, :class:`LearnerPlan`, ``plan_learner``, ``alternative_layouts``),
``engine`` (:class:`EnginePlan`, ``plan_engine``).
"""
