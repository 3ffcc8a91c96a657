"""GRPOTorchLearner: the RLlib adapter of the learner (GRPO / Dr.BoT / SPEAR / SPADER on an HF
causal LM).

The driver sends one padded batch per learner (whole groups; advantages, masks and the global
loss normalizers already computed). The update itself -- epochs, mini-batches, token-budget
micro-batches, loss, backward, norm / clip, the optimizer step or its skip, the loss metrics --
is the Ray-free :class:`~rllib_spear.learner.core.UpdateCore` (docs/design.md "One training
iteration"). This class is what RLlib calls, and answers with the learner's pieces:

* ``build`` -> the random streams (``state.RandomStreams``), the skipped-step guard
  (``steps.StepGuard``) and the weight senders; ``make_module`` / ``move_module_to_device`` /
  ``wrap_module_for_ddp`` (three private TorchLearner methods, handed over by the base
  ``rllib_private.TorchLearnerPrivateHooks``, which says why each is overridden) -> the module
  layout (``module_layout.ModuleLayout``: FSDP2 sharding, activation checkpointing, the
  reference model);
* ``configure_optimizers_for_module`` -> AdamW (``optim.build_adamw``) and the lr schedule;
* ``run_update`` (RLlib's private update step, through the same base) -> one
  :meth:`UpdateCore.update` call per learner batch: the module and its optimizers go in, an
  ``UpdateResult`` comes out, and this class logs it to RLlib's ``self.metrics`` (combined over
  the learners). Inside the update the core calls nothing of this class: no crossing per
  micro-batch;
* ``compute_loss_for_module`` (abstract in RLlib; the update does not call it) -> the core's
  loss of a batch (``loss.policy_loss_parts``), its metrics straight to the logger;
* ``get_state`` / ``set_state`` / ``restore_from_path`` -> RLlib's state plus the learner's own
  (``state``: random streams, skipped-step counters, the FSDP shards' folder), and
  ``save_sharded_state`` / ``load_sharded_state`` (every rank, driven by the Algorithm's
  ``save_to_path``).

Sharding (``learners(sharding=...)``, docs/design.md "Learner sharding"): under "ddp" RLlib
wraps the module in DDP; under "fsdp" the module is FSDP2-sharded before the optimizer is built.
``mixed_precision="bf16"`` computes in bf16: FSDP's MixedPrecisionPolicy when sharded,
``torch.autocast`` otherwise. Checkpoints under FSDP: torch.distributed.checkpoint folders
written by every rank, loadable with any number of ranks.

Bad steps (docs/design.md "Fault tolerance"): the core skips a step with a non-finite loss or
gradient on any rank; the learner logs ``skipped_steps`` per update (counted by rank 0 only: the
decision is the same on every rank, and RLlib sums the learners' counts), and the guard stops
the run after ``max_consecutive_skipped_steps`` skipped steps in a row.

RLlib's ``torch_skip_nan_gradients`` and its private grad-scaler and lr-scheduler classes do not
apply: the core's step is the skip rule above, and the lr schedule is RLlib's
``lr_or_lr_schedule``.
"""
from __future__ import annotations

import os

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from ..core.losses import METRIC_REDUCE
from ..models import sharding
from ..models.threads import apply_torch_threads
from ..rllib_private import TorchLearnerPrivateHooks
from ..weight_streaming.learner_side import WeightSenders
from .core import UpdateCore, UpdateResult, UpdateSettings
from .loss import policy_loss_parts
from .microbatching import LossMetrics
from .module_layout import ModuleLayout
from .optim import build_adamw
from .ranks import ProcessGroupRanks, gather_objects, rank, world_size
from .state import (
    LEARNER_STATE_KEY,
    SHARDED_STATE_DIR,
    RandomStreams,
    load_full_optimizer_state_sharded,
    load_sharded_state,
    own_state,
    restore_own_state,
    save_sharded_state,
)
from .steps import ReplicatedClip, ShardedClip, StepGuard

__all__ = ["GRPOTorchLearner", "BATCH_COLUMNS", "LEARNER_STATE_KEY", "SHARDED_STATE_DIR"]

#: Columns of the learner batch (all [B, T] unless noted [B]).
BATCH_COLUMNS = (
    "input_ids", "attention_mask", "loss_mask", "old_logp", "engine_logp", "advantages",
    "minibatch_id",  # [B, num_epochs] int: the row's mini-batch in each epoch
    "norm_num_tokens", "norm_num_seqs",  # [B, num_epochs] global normalizers of the row's mini-batch part
    "t_norm",  # [B]
    "is_replay", "loss_weight",  # [B]
)


def _as_list(x) -> list:
    if x is None:
        return []
    return [x] if isinstance(x, str) else list(x)


class GRPOTorchLearner(TorchLearnerPrivateHooks):
    """RLlib's TorchLearner around the Ray-free update core (see the module docstring)."""

    layout: ModuleLayout | None = None  # made with the module (make_module)
    _restore_dir: str | None = None  # restore_from_path's folder while RLlib calls set_state

    @override(TorchLearner)
    def build(self) -> None:
        apply_torch_threads(getattr(self.config, "torch_num_threads", None))
        tokens = getattr(self.config, "entropy_metric_tokens", 1024)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError(f"training(entropy_metric_tokens=...) must be an int >= 0 (0 = no entropy metric), "
                             f"got {tokens!r}")
        super().build()
        # Clip-Cov draws tokens at random, and so does the entropy metric: learner-owned
        # generators, one stream each and per rank (state.RandomStreams), keep both reproducible.
        self.streams = RandomStreams(int(getattr(self.config, "seed", 0) or 0), rank(), world_size())
        # skipped optimizer steps over the learner's life: consecutive ones span updates
        self.step_guard = StepGuard(getattr(self.config, "max_consecutive_skipped_steps", None))
        # the weight sync's learner side: one sender per transport (weight_streaming/learner_side.py)
        self.weight_senders = WeightSenders(self)

    @property
    def is_sharded(self) -> bool:
        """FSDP2 layout (learners(sharding="fsdp"))."""
        return getattr(self.config, "sharding", "ddp") == "fsdp"

    # ------------------------------------------------------------------ module layout
    def make_module(self):
        self.layout = ModuleLayout(self.config, self.device)
        return self.layout.make_module(super().make_module)

    def move_module_to_device(self, module) -> None:
        # FSDP moves each rank's shards to the mesh's device as it shards (and keeps them in CPU
        # memory under cpu_offload): moving the whole model to the GPU first would need a full
        # replica's memory on every rank, which is what sharding is for.
        if not self.is_sharded:
            super().move_module_to_device(module)

    def wrap_module_for_ddp(self) -> None:
        if not self.is_sharded:  # FSDP shards instead of replicating
            super().wrap_module_for_ddp()

    def all_optimizers(self) -> list[torch.optim.Optimizer]:
        """Every registered optimizer, module by module."""
        return [optim for mid in self.module.keys() for _, optim in self.get_optimizers_for_module(mid)]

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank stores for parameters, gradients and optimizer state (a DTensor counts
        its local shard; the optimizer's scalar ``step`` counters are included)."""
        params = [p for mid in self.module.keys() for p in self.module[mid].parameters()]
        opt = [t for optim in self.all_optimizers() for st in optim.state.values()
               for t in st.values() if isinstance(t, torch.Tensor)]
        return {"param_bytes": sharding.local_bytes(params),
                "grad_bytes": sharding.local_bytes(p.grad for p in params),
                "optimizer_bytes": sharding.local_bytes(opt)}

    # ------------------------------------------------------------------ optimizer
    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        config = config or self.config
        module = self.module[module_id]
        params = [p for p in self.get_parameters(module) if p.requires_grad]
        # fused where torch supports it (optim): the step is a few kernels, not one chain per
        # parameter tensor
        optimizer = build_adamw(params, lr=1.0, betas=tuple(config.adam_betas),
                                weight_decay=config.weight_decay, sharded=self.is_sharded)
        lr = config.lr
        warmup = int(getattr(config, "lr_warmup_steps", 0) or 0)
        if warmup > 0 and not isinstance(lr, (list, tuple)):
            # Linear warmup over `warmup` training iterations (the driver passes the iteration
            # index as the schedule's timestep), then constant.
            lr = [[0, lr / (warmup + 1)], [warmup, lr]]
        self.register_optimizer(module_id=module_id, optimizer=optimizer, params=params,
                                lr_or_lr_schedule=lr)

    # ------------------------------------------------------------------ the update
    def update_core(self, module_id) -> UpdateCore:
        """The update core of module ``module_id``: its forward pass (DDP's when wrapped), its
        optimizers, the module config's settings, the layout's clip, ranks and compute context,
        and this learner's streams and guard."""
        module = self.module[module_id]
        config = self.config.get_config_for_module(module_id)
        if self.is_sharded:
            clip = ShardedClip(getattr(config, "grad_clip", None), getattr(config, "grad_clip_by", "global_norm"))
        else:
            clip = ReplicatedClip(config.grad_clip, config.grad_clip_by, log_gradients=config.log_gradients)
        # DDP: one all-reduce per optimizer step (no_sync on the other micro-batches)
        replicated_multi = self.config.num_learners > 1 and not self.is_sharded
        return UpdateCore(
            forward=module.forward_train, optimizers=dict(self.get_optimizers_for_module(module_id)),
            settings=UpdateSettings.of(config),
            loss_config=lambda replay: config.policy_loss_config(replay=replay), clip=clip,
            ranks=ProcessGroupRanks(self.device, lockstep=self.is_sharded,
                                    ddp_module=module if replicated_multi else None),
            entropy_generator=self.streams.entropy, cov_generator=self.streams.cov,
            num_learners=self.config.num_learners, compute_context=self.layout.compute_context,
            reference=self.layout.reference_logp(config.temperature), guard=self.step_guard)

    def run_update(self, batch: dict) -> tuple:
        """``num_epochs`` passes (the width of ``minibatch_id``) over the batch, each one optimizer
        step per mini-batch of that epoch's shuffle: one call of the core, then its metrics."""
        (module_id, data), = batch.items()
        result = self.update_core(module_id).update(data)
        total_loss = self._log_update(module_id, result)
        return result.fwd_out, {module_id: torch.tensor(total_loss, dtype=torch.float32)}, {}

    def _log_update(self, module_id, result: UpdateResult) -> float:
        """Log one update's results, the loss metrics combined over every learner's micro-batches
        (one gather, which also brings every rank's generator states to rank 0 for its
        checkpoint), and return the update's loss ``LossMetrics.total_loss``: what RLlib logs as
        ``total_loss``, the same on every learner and for any micro-batch split."""
        log = self.metrics.log_value
        for norms in result.step_norms:
            log((module_id, "grad_norm"), norms.grad_norm, window=1000)
            for name, norm in norms.optimizer_norms.items():  # RLlib's clip metric
                log((module_id, f"gradients_{name}_global_norm"), norm, window=1)
        if result.steps:
            # This rank's parameter / gradient / optimizer-state bytes at the last step (shards
            # only under FSDP): what benchmarks/learner_memory.py and the memory planner compare.
            for k, v in self.state_bytes().items():
                log((module_id, k), v, reduce="max", window=1)
        gathered = gather_objects({"metrics": result.metrics.state(), "rng": self.streams.state()})
        self.streams.remember_ranks([g["rng"] for g in gathered])
        merged = LossMetrics.merged(g["metrics"] for g in gathered)
        for key, (value, reduce) in merged.results().items():
            log((module_id, key), value, reduce=reduce, window=1000)
        # every rank takes and skips the same steps (one global batch, stepped in lockstep), and
        # RLlib sums the learners' results: rank 0 counts them, so 2 learners do not report 2x
        first = rank() == 0
        log((module_id, "num_optimizer_steps"), result.steps if first else 0, reduce="sum")
        log((module_id, "skipped_steps"), result.skipped if first else 0, reduce="sum")
        log((module_id, "trained_tokens"), result.trained_tokens, reduce="sum")
        return merged.total_loss()

    @override(TorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out) -> torch.Tensor:
        """The loss of ``batch`` (``loss.policy_loss_parts``), its metrics logged. RLlib's
        ``compute_losses`` calls this; the learner's own update computes the loss in the core."""
        total, parts = policy_loss_parts(
            batch, fwd_out, loss_config=lambda replay: config.policy_loss_config(replay=replay),
            reference=self.layout.reference_logp(config.temperature), generator=self.streams.cov)
        for prefix, metrics in parts:
            for k, v in metrics.items():
                self.metrics.log_value((module_id, prefix + k), float(v), reduce=METRIC_REDUCE.get(k, "mean"),
                                       window=1000)
        return total

    # ------------------------------------------------------------------ state
    def _module_parts(self) -> dict:
        """{module id: (unwrapped RLModule, its optimizers)}: what the sharded checkpoint holds."""
        return {mid: (self.module[mid].unwrapped(), [optim for _, optim in self.get_optimizers_for_module(mid)])
                for mid in self.module.keys()}

    @override(TorchLearner)
    def get_state(self, components=None, *, not_components=None, **kwargs):
        from ray.rllib.core import COMPONENT_OPTIMIZER, COMPONENT_RL_MODULE

        if self.is_sharded:
            # The shards are written by every rank (save_sharded_state, driven by the
            # Algorithm's save_to_path); this state, written by rank 0 alone, says where.
            not_components = list(_as_list(not_components)) + [COMPONENT_RL_MODULE, COMPONENT_OPTIMIZER]
        state = super().get_state(components, not_components=not_components, **kwargs)
        state[LEARNER_STATE_KEY] = own_state(self.streams, self.step_guard,
                                             world_size() if self.is_sharded else None)
        return state

    @override(TorchLearner)
    def restore_from_path(self, path, *, component=None, filesystem=None, **kwargs):
        # RLlib's restore_from_path reads the state file and calls set_state(state) without the
        # path; set_state finds the sharded state beside the state file through _restore_dir.
        self._restore_dir = str(path)
        try:
            return super().restore_from_path(path, component=component, filesystem=filesystem, **kwargs)
        finally:
            self._restore_dir = None

    @override(TorchLearner)
    def set_state(self, state) -> None:
        from ray.rllib.core import COMPONENT_OPTIMIZER, COMPONENT_RL_MODULE
        from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

        own = state.get(LEARNER_STATE_KEY) or {}
        state = dict(state)
        has_module = COMPONENT_RL_MODULE in state
        if has_module:
            # The module weights first, whatever their version: RLlib's Learner.set_state loads
            # them only when the state's WEIGHTS_SEQ_NO is higher than this learner's, so an
            # older state set into a live learner (Algorithm.set_state of an earlier get_state)
            # would put its optimizer state on the newer weights (docs/design.md "Restoring an
            # older checkpoint"; restore_from_path loads the module from its own folder).
            self.module.set_state(state.pop(COMPONENT_RL_MODULE))
        if self.is_sharded and COMPONENT_OPTIMIZER in state:
            # A replicated (DDP / single-learner) checkpoint into sharded learners: the module
            # weights loaded above (full tensors are scattered); the optimizer state is
            # per-tensor and its shards are cut the same way.
            load_full_optimizer_state_sharded(
                {f"{mid}_{name}": optim for mid in self.module.keys()
                 for name, optim in self.get_optimizers_for_module(mid)},
                state.pop(COMPONENT_OPTIMIZER))
        super().set_state(state)
        restore_own_state(own, self.streams, self.step_guard)
        sharded = own.get("sharded_state")
        if sharded and not has_module:
            if self._restore_dir is None:
                raise ValueError("this learner state points to sharded weights on disk: restore it with "
                                 "restore_from_path / Algorithm.from_checkpoint, not set_state")
            self.load_sharded_state(os.path.join(self._restore_dir, sharded["dir"]))
        if WEIGHTS_SEQ_NO in state and (has_module or sharded or self._restore_dir is not None):
            # The restored weights' version, older or not (RLlib only ever raises it, and never
            # to 0): the weight sync then sends them to the runners, which apply any version
            # other than the one they hold. In restore_from_path (_restore_dir) RLlib has loaded
            # the module from its own folder before this state. A state without module weights
            # or a version (LearnerGroup.set_weights) keeps this learner's, as in RLlib.
            self.set_weights_seq_no(int(state[WEIGHTS_SEQ_NO]))

    def save_sharded_state(self, directory: str) -> None:
        """Every rank writes its shards of the module weights and the optimizer state
        (``state.save_sharded_state``)."""
        save_sharded_state(self._module_parts(), directory)

    def load_sharded_state(self, directory: str) -> None:
        """Load :meth:`save_sharded_state`'s folder with this learner's ranks (any number)."""
        load_sharded_state(self._module_parts(), directory)
