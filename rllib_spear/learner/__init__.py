"""The learner: the policy update of every algorithm, as a Ray-free core behind a thin RLlib adapter.

* ``core``            UpdateCore: the whole update of a learner batch (epochs, mini-batches,
                      micro-batches, loss, backward, clip, step or skip, metrics); LocalUpdate
                      (the same for a bare model, no RLlib)
* ``loss``            the loss of a micro-batch (on-policy and replayed parts, the KL term's
                      reference log-probs) and the metrics measured beside it
* ``steps``           the step boundary: backward share, clip per layout, optimizer step, the
                      bad-step rule and StepGuard
* ``microbatching``   token-budget micro-batches, epochs' views, LossMetrics
* ``ranks``           the learners' process group: rank, gather, the core's distributed ops
* ``optim``           the learner's AdamW (fused where torch supports it)
* ``module_layout``   ModuleLayout: module build, FSDP2 sharding, activation checkpointing,
                      the reference model, the compute context
* ``state``           the learner's own checkpoint state: random streams, skipped-step counters,
                      the FSDP shards' format
* ``failure``         what a learner rank's death does to a run
* ``rllib_learner``   GRPOTorchLearner: the RLlib TorchLearner adapter (the only module here
                      that imports Ray at import time, with ``failure``)

Nothing is imported here: ``import rllib_spear.learner.core`` needs no Ray.
"""
