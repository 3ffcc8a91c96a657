"""The learner's own checkpoint state (docs/design.md "What is checkpointed", "Learner sharding").

* :class:`RandomStreams`: the learner's random streams (Clip-Cov's token draws, and the tokens of
  the entropy metric: a stream of its own, so that the metric does not move Clip-Cov's draws),
  one generator each per rank; rank 0, the only rank whose state RLlib saves, checkpoints every
  rank's (gathered at the end of each update) and every rank restores its own.
* :func:`own_state` / :func:`restore_own_state`: the learner's entry in RLlib's learner state
  (``LEARNER_STATE_KEY``: the streams, the skipped-step counters, and under FSDP where the
  shards are).
* The sharded format: under FSDP the module weights and the optimizer state are
  torch.distributed.checkpoint folders written by every rank (:func:`save_sharded_state`, driven
  by the Algorithm's ``save_to_path``) and loadable with any number of ranks
  (:func:`load_sharded_state`); :func:`load_full_optimizer_state_sharded` puts a replicated
  checkpoint's optimizer state into sharded optimizers.

Importing this module needs no Ray (the update core takes its seeded streams from here).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Sequence

import torch

from .steps import StepGuard

logger = logging.getLogger(__name__)

__all__ = ["LEARNER_STATE_KEY", "SHARDED_STATE_DIR", "RNG_STREAMS", "seeded_generator", "RandomStreams",
           "own_state", "restore_own_state", "save_sharded_state", "load_sharded_state",
           "load_full_optimizer_state_sharded"]

#: Learner-state key of this learner's own state (RNG streams, the sharded-checkpoint marker).
LEARNER_STATE_KEY = "rllib_spear_learner"
#: Folder of the torch.distributed.checkpoint shards, inside the checkpoint's learner folder.
SHARDED_STATE_DIR = "sharded_state"
#: The learner's random streams and their seed offsets: Clip-Cov's token draws, and the tokens
#: of the entropy metric.
RNG_STREAMS = {"cov_rng": 7919, "entropy_rng": 104729}
#: Rank stride of the seeds: rank r draws from seed + offset + r * stride (a prime, larger than
#: the offsets, so that no two (stream, rank) pairs share a seed).
_RANK_STRIDE = 1_000_003

#: {module id: (the unwrapped RLModule, its optimizers)}: what a sharded checkpoint holds.
ModuleParts = Mapping[Any, tuple[torch.nn.Module, Sequence[torch.optim.Optimizer]]]


def seeded_generator(seed: int, stream: str, rank_: int) -> torch.Generator:
    """The CPU generator of ``stream`` on learner rank ``rank_``, seeded with
    ``seed + offset(stream) + rank_ * 1_000_003``. Rank 0 keeps a single learner's stream; the
    other ranks draw independently (with one seed, every rank would pick the same positions of
    its own rows: correlated Clip-Cov draws)."""
    return torch.Generator(device="cpu").manual_seed(int(seed) + RNG_STREAMS[stream] + rank_ * _RANK_STRIDE)


class RandomStreams:
    """The generators of learner rank ``rank`` (of ``world_size``), seeded from ``seed``
    (:func:`seeded_generator`), and every rank's states as rank 0 checkpoints them (the
    initial ones until the first update gathers them: :meth:`remember_ranks`)."""

    def __init__(self, seed: int, rank: int, world_size: int) -> None:
        self.seed, self.rank, self.world_size = int(seed), int(rank), int(world_size)
        self.generators = {stream: seeded_generator(self.seed, stream, self.rank) for stream in RNG_STREAMS}
        self.rank_states = {r: self._seeded_state(r) for r in range(self.world_size)}

    @property
    def cov(self) -> torch.Generator:
        """Clip-Cov's token draws."""
        return self.generators["cov_rng"]

    @property
    def entropy(self) -> torch.Generator:
        """The tokens of the entropy metric's sample."""
        return self.generators["entropy_rng"]

    def _seeded_state(self, rank_: int) -> dict:
        return {stream: seeded_generator(self.seed, stream, rank_).get_state() for stream in RNG_STREAMS}

    def state(self) -> dict:
        """This rank's generator states ``{stream: ByteTensor}``."""
        return {stream: g.get_state() for stream, g in self.generators.items()}

    def remember_ranks(self, states: list[dict]) -> None:
        """Every rank's generator states, gathered at the end of an update: the generators only
        move in updates, so rank 0 checkpoints every rank's current states."""
        self.rank_states = dict(enumerate(states))

    def checkpoint(self) -> dict:
        """This rank's generator states (top level, for readers of the older format) and every
        rank's (``rank_rng``, by rank; this rank's are current)."""
        mine = self.state()
        return {**mine, "rank_rng": {**self.rank_states, self.rank: mine}}

    def restore(self, own: dict) -> None:
        """Restore this rank's generators from a checkpoint's learner state. Rank r takes the
        saved states of rank r; a rank the checkpoint does not hold (it was written by fewer
        ranks) starts its seeded stream, with a warning. A checkpoint without per-rank states
        (older format) holds rank 0's only."""
        saved = {int(r): st for r, st in (own.get("rank_rng") or {}).items()}
        if not saved and "cov_rng" in own:
            saved = {0: {stream: own[stream] for stream in RNG_STREAMS}}
        if not saved:
            return
        me = self.rank
        if me not in saved:
            logger.warning("learner rank %d: the checkpoint holds the random streams of ranks %s only; "
                           "this rank reseeds its Clip-Cov and entropy-sample streams", me, sorted(saved))
        for stream, g in self.generators.items():
            state = saved[me][stream] if me in saved else self._seeded_state(me)[stream]
            g.set_state(torch.as_tensor(state, dtype=torch.uint8).clone())
        self.rank_states = {r: saved.get(r) or self._seeded_state(r) for r in range(self.world_size)}


def own_state(streams: RandomStreams, guard: StepGuard, sharded_world_size: int | None) -> dict:
    """The learner's entry in its state (``LEARNER_STATE_KEY``): the random streams, the
    skipped-step counters (a run of skipped steps that spans a restore still stops at its
    limit), and under FSDP (``sharded_world_size``: the ranks that write the shards) where the
    shards are: the state RLlib saves is written by rank 0 alone."""
    own = streams.checkpoint()
    if sharded_world_size is not None:
        own["sharded_state"] = {"dir": SHARDED_STATE_DIR, "format": "torch.distributed.checkpoint",
                                "world_size": int(sharded_world_size)}
    own["step_guard"] = guard.get_state()
    return own


def restore_own_state(own: dict, streams: RandomStreams, guard: StepGuard) -> None:
    """Restore the streams and the skipped-step counters from the learner's entry (checkpoints of
    older versions hold no counters)."""
    streams.restore(own)
    if "step_guard" in own:
        guard.set_state(own["step_guard"])


def load_full_optimizer_state_sharded(optimizers: Mapping[str, torch.optim.Optimizer], opt_state: dict) -> None:
    """RLlib's optimizer state (full tensors, numpy; one entry per registered optimizer, by its
    ``<module_id>_<optimizer_name>``) into the sharded ``optimizers`` (by the same names): the
    optimizer state is per-tensor, and its shards are cut as the parameters' are."""
    from ray.rllib.utils.torch_utils import convert_to_torch_tensor
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, entry in opt_state.items():
        optim = optimizers.get(name)
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


def save_sharded_state(parts: ModuleParts, directory: str) -> None:
    """Every rank writes its shards of the module weights and the optimizer state as one
    torch.distributed.checkpoint per module (``directory/<module_id>``): no gather, so no rank
    ever holds the whole model, and DCP re-shards on load for any number of ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    for mid, (rlm, optims) in parts.items():
        msd, osd = get_state_dict(rlm, list(optims))
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(directory, str(mid)))


def load_sharded_state(parts: ModuleParts, directory: str) -> None:
    """Load :func:`save_sharded_state`'s folder with this learner's ranks (any number, sharded or
    not): DCP reads each rank's slices of every tensor."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    for mid, (rlm, optims) in parts.items():
        msd, osd = get_state_dict(rlm, list(optims))
        target = {"model": msd, "optim": osd}
        dcp.load(target, checkpoint_id=os.path.join(directory, str(mid)))
        set_state_dict(rlm, list(optims), model_state_dict=target["model"], optim_state_dict=target["optim"])
