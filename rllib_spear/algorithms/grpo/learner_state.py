"""Checkpoint state of the GRPO learner: its own RNG streams, the engines' weights, and the
sharded (FSDP) checkpoint format (docs/design.md "What is checkpointed", "Learner sharding").

Under FSDP the module weights and the optimizer state are torch.distributed.checkpoint folders
written by every rank (:meth:`LearnerStateMixin.save_sharded_state`, driven by the Algorithm's
``save_to_path``) and loadable with any number of ranks; the learner state that rank 0 writes
only says where they are.
"""
from __future__ import annotations

import os

from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from .learner_setup import rank

__all__ = ["LearnerStateMixin", "LEARNER_STATE_KEY", "SHARDED_STATE_DIR"]

#: Learner-state key of this learner's own state (RNG streams, the sharded-checkpoint marker).
LEARNER_STATE_KEY = "rllib_spear_learner"
#: Folder of the torch.distributed.checkpoint shards, inside the checkpoint's learner folder.
SHARDED_STATE_DIR = "sharded_state"


def _as_list(x) -> list:
    if x is None:
        return []
    return [x] if isinstance(x, str) else list(x)


class LearnerStateMixin:
    """get_state / set_state / restore_from_path of a TorchLearner with ``is_sharded`` and the
    generators ``_cov_generator`` and ``_entropy_generator`` (mixed in before TorchLearner)."""

    _restore_dir: str | None = None

    def engine_state(self) -> dict | None:
        """The inference weights for the engines, with the weights version (every rank must call
        this under FSDP: the shards are gathered one tensor at a time; rank 0 returns
        ``{"rl_module": {module_id: HF state dict}, WEIGHTS_SEQ_NO: n}``, the others None)."""
        from ray.rllib.core import COMPONENT_RL_MODULE
        from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

        if not self.is_sharded:
            state = self.get_state(components=COMPONENT_RL_MODULE, inference_only=True)
            return {COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE], WEIGHTS_SEQ_NO: state[WEIGHTS_SEQ_NO]}
        out = {mid: self.module[mid].unwrapped().get_state(inference_only=True) for mid in self.module.keys()}
        if rank() != 0:
            return None
        return {COMPONENT_RL_MODULE: out, WEIGHTS_SEQ_NO: self.get_state(components=[])[WEIGHTS_SEQ_NO]}

    def _own_state(self) -> dict:
        return {"cov_rng": self._cov_generator.get_state(),
                "entropy_rng": self._entropy_generator.get_state()}

    @override(TorchLearner)
    def get_state(self, components=None, *, not_components=None, **kwargs):
        from ray.rllib.core import COMPONENT_OPTIMIZER, COMPONENT_RL_MODULE

        if self.is_sharded:
            # The shards are written by every rank (save_sharded_state, driven by the
            # Algorithm's save_to_path); this state, written by rank 0 alone, says where.
            not_components = list(_as_list(not_components)) + [COMPONENT_RL_MODULE, COMPONENT_OPTIMIZER]
        state = super().get_state(components, not_components=not_components, **kwargs)
        own = self._own_state()
        if self.is_sharded:
            import torch.distributed as dist

            own["sharded_state"] = {"dir": SHARDED_STATE_DIR, "format": "torch.distributed.checkpoint",
                                    "world_size": dist.get_world_size() if dist.is_initialized() else 1}
        state[LEARNER_STATE_KEY] = own
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

        own = state.get(LEARNER_STATE_KEY) or {}
        if self.is_sharded and COMPONENT_OPTIMIZER in state:
            # A replicated (DDP / single-learner) checkpoint into sharded learners: the module
            # weights load (full tensors are scattered); the optimizer state is per-tensor and
            # its shards are cut the same way.
            state = dict(state)
            self._set_full_optimizer_state_sharded(state.pop(COMPONENT_OPTIMIZER))
        super().set_state(state)
        if "cov_rng" in own:
            self._cov_generator.set_state(own["cov_rng"])
            self._entropy_generator.set_state(own["entropy_rng"])
        sharded = own.get("sharded_state")
        if sharded and COMPONENT_RL_MODULE not in state:
            if self._restore_dir is None:
                raise ValueError("this learner state points to sharded weights on disk: restore it with "
                                 "restore_from_path / Algorithm.from_checkpoint, not set_state")
            self.load_sharded_state(os.path.join(self._restore_dir, sharded["dir"]))

    def _set_full_optimizer_state_sharded(self, opt_state: dict) -> None:
        """RLlib's optimizer state (full tensors, numpy; one entry per registered optimizer, by
        its ``<module_id>_<optimizer_name>``) into the sharded optimizers."""
        from ray.rllib.utils.torch_utils import convert_to_torch_tensor
        from torch.distributed.tensor import DTensor, distribute_tensor

        by_name = {f"{mid}_{name}": optim for mid in self.module.keys()
                   for name, optim in self.get_optimizers_for_module(mid)}
        for name, entry in opt_state.items():
            optim = by_name.get(name)
            if optim is None:
                continue
            saved = entry["state"]
            params = [p for g in optim.param_groups for p in g["params"]]
            new_state = {}
            for idx, per_param in convert_to_torch_tensor(saved["state"], device="cpu").items():
                p = params[int(idx)]
                out = {}
                for k, v in per_param.items():
                    if isinstance(p, DTensor) and v.dim() > 0 and tuple(v.shape) == tuple(p.shape):
                        v = distribute_tensor(v.to(p.dtype), p.device_mesh, p.placements)
                    out[k] = v
                new_state[int(idx)] = out
            optim.load_state_dict({**saved, "state": new_state})

    def _module_state_dicts(self, mid):
        """(rl_module, model state dict, optimizer state dict) of module ``mid`` (DCP layout)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        rlm = self.module[mid].unwrapped()
        optims = [optim for _, optim in self.get_optimizers_for_module(mid)]
        msd, osd = get_state_dict(rlm, optims)
        return rlm, optims, msd, osd

    def save_sharded_state(self, directory: str) -> None:
        """Every rank writes its shards of the module weights and the optimizer state as one
        torch.distributed.checkpoint per module (``directory/<module_id>``): no gather, so no rank
        ever holds the whole model, and DCP re-shards on load for any number of ranks."""
        import torch.distributed.checkpoint as dcp

        for mid in self.module.keys():
            _, _, msd, osd = self._module_state_dicts(mid)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(directory, str(mid)))

    def load_sharded_state(self, directory: str) -> None:
        """Load ``save_sharded_state``'s folder with this learner's ranks (any number, sharded or
        not): DCP reads each rank's slices of every tensor."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        for mid in self.module.keys():
            rlm, optims, msd, osd = self._module_state_dicts(mid)
            target = {"model": msd, "optim": osd}
            dcp.load(target, checkpoint_id=os.path.join(directory, str(mid)))
            set_state_dict(rlm, optims, model_state_dict=target["model"], optim_state_dict=target["optim"])
