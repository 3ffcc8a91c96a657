"""Checkpoint state of the GRPO learner: its own RNG streams, the engines' weights, and the
sharded (FSDP) checkpoint format (docs/design.md "What is checkpointed", "Learner sharding").

Under FSDP the module weights and the optimizer state are torch.distributed.checkpoint folders
written by every rank (:meth:`LearnerStateMixin.save_sharded_state`, driven by the Algorithm's
``save_to_path``) and loadable with any number of ranks; the learner state that rank 0 writes
only says where they are.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from .learner_setup import rank

logger = logging.getLogger(__name__)

__all__ = ["LearnerStateMixin", "LEARNER_STATE_KEY", "SHARDED_STATE_DIR", "seeded_generator", "gather_objects"]

#: Learner-state key of this learner's own state (RNG streams, the sharded-checkpoint marker).
LEARNER_STATE_KEY = "rllib_spear_learner"
#: Folder of the torch.distributed.checkpoint shards, inside the checkpoint's learner folder.
SHARDED_STATE_DIR = "sharded_state"
#: The learner's random streams (the attribute of each generator) and their seed offsets:
#: Clip-Cov's token draws, and the tokens of the entropy metric (its own stream, so that the
#: metric does not move Clip-Cov's draws).
RNG_STREAMS = {"cov_rng": ("_cov_generator", 7919), "entropy_rng": ("_entropy_generator", 104729)}
#: Rank stride of the seeds: rank r draws from seed + offset + r * stride (a prime, larger than
#: the offsets, so that no two (stream, rank) pairs share a seed).
_RANK_STRIDE = 1_000_003


def seeded_generator(seed: int, stream: str, rank_: int) -> torch.Generator:
    """The CPU generator of ``stream`` on learner rank ``rank_``, seeded with
    ``seed + offset(stream) + rank_ * 1_000_003``. Rank 0 keeps a single learner's stream; the
    other ranks draw independently (with one seed, every rank would pick the same positions of
    its own rows: correlated Clip-Cov draws)."""
    return torch.Generator(device="cpu").manual_seed(int(seed) + RNG_STREAMS[stream][1] + rank_ * _RANK_STRIDE)


def world_size() -> int:
    """The number of learner ranks (1 without a process group)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def gather_objects(obj: Any) -> list:
    """``obj`` of every learner rank, by rank (a collective: every rank must call it); ``[obj]``
    without a process group."""
    import torch.distributed as dist

    if world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _as_list(x) -> list:
    if x is None:
        return []
    return [x] if isinstance(x, str) else list(x)


def wire_dtype_of(tensor_dtype: torch.dtype, engine_dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a tensor travels in to the engines: the engines' dtype for a floating tensor
    that is wider (fp32 master weights to bf16 engines: half the bytes, the same values the
    engine's own cast would give), else its own (integers, or an engine at least as wide: a
    widening cast would only add bytes)."""
    if (engine_dtype is not None and tensor_dtype.is_floating_point and engine_dtype.is_floating_point
            and engine_dtype.itemsize < tensor_dtype.itemsize):
        return engine_dtype
    return tensor_dtype


def _to_wire(t: torch.Tensor, engine_dtype: torch.dtype | None) -> torch.Tensor:
    dtype = wire_dtype_of(t.dtype, engine_dtype)
    return t if dtype == t.dtype else t.to(dtype)


def _engine_state_dict(model, keep_vars: bool = False) -> dict:
    """The HF model's state dict as the engines load it: a tied ``lm_head.weight`` left out."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return {k: v for k, v in model.state_dict(keep_vars=keep_vars).items()
            if not (tied and k.endswith("lm_head.weight"))}


class LearnerStateMixin:
    """get_state / set_state / restore_from_path of a TorchLearner with ``is_sharded``, and its
    random streams (``_cov_generator``, ``_entropy_generator``; ``_seed_generators`` makes them),
    checkpointed for every rank (mixed in before TorchLearner)."""

    _restore_dir: str | None = None
    # the weight sync's sender state (docs/design.md "Weight streaming")
    _engine_bucket_stream = None  # object store: the buckets still to put
    _engine_next_bucket = None  # object store: the bucket put by the next call
    _engine_weights_manifest = None  # object store: the refs put so far (rank 0 owns them)
    _engine_stream_bytes = 0  # object store: bytes put for the last stream (in the wire dtype)
    _shared_weights = None  # shared memory: the blocks that hold the weights

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

    def iter_engine_weights(self, placeholders: bool = False, engine_dtype: str | torch.dtype | None = None):
        """(HF name, whole tensor) of the default module's inference weights, one tensor at a
        time, for the weight stream (docs/design.md "Weight streaming"). Under FSDP every rank
        must drain it (each tensor is all-gathered, ``models.sharding.iter_full_state``) and only
        rank 0 gets tensors (the others get None, or with ``placeholders`` an empty "meta"
        tensor of the same shape and wire dtype, so that they can cut the same buckets);
        unsharded, rank 0 yields the tensors as they are (no copy) and the other ranks nothing.
        ``engine_dtype``: the engines' weight dtype ("bfloat16" or a torch dtype); each floating
        tensor wider than it is cast to it on the way (``wire_dtype_of``; one tensor at a time, on the learner's device). The
        tied ``lm_head.weight`` is left out. A LoRA module yields its merged weights (computed
        whole first: the merge needs them)."""
        from ...models.dtypes import torch_dtype
        from ...models.sharding import iter_full_state

        engine_dtype = None if engine_dtype is None else torch_dtype(engine_dtype)
        keep = rank() == 0
        rlm, model = self._engine_model()
        if model is not rlm.model:  # LoRA: the merged state (a collective under FSDP)
            merged = rlm.get_state(inference_only=True)
            yield from ((k, _to_wire(v, engine_dtype) if keep or placeholders else None) for k, v in merged.items())
            return
        sd = _engine_state_dict(model)
        if not self.is_sharded:
            if keep:
                yield from ((k, _to_wire(v.detach(), engine_dtype)) for k, v in sd.items())
            return
        for k, v in sd.items():
            wire = wire_dtype_of(v.dtype, engine_dtype)
            (_, t), = iter_full_state({k: v}, keep=keep, dtype=None if wire == v.dtype else wire)
            yield k, (torch.empty(v.shape, dtype=wire, device="meta") if t is None and placeholders else t)

    def _engine_model(self):
        """(the default module's RLModule, its HF model): what ``iter_engine_weights`` walks."""
        from ray.rllib.core import DEFAULT_MODULE_ID

        mids = list(self.module.keys())
        rlm = self.module[DEFAULT_MODULE_ID if DEFAULT_MODULE_ID in mids else mids[0]].unwrapped()
        return rlm, rlm.hf_model()

    def shared_weights_unsupported(self) -> str:
        """Why this learner cannot keep its inference weights in shared memory (transport
        "shared_memory"), or "" when it can: they must be whole CPU tensors, used as they are."""
        rlm, model = self._engine_model()
        if self.is_sharded:
            return "the learner is sharded (sharding='fsdp'): its weights are gathered per sync"
        if model is not rlm.model:
            return "the module has LoRA adapters: the engines get merged weights, computed per sync"
        if any(t.device.type != "cpu" for t in model.state_dict().values()):
            return "the learner's weights are not on the CPU"
        return ""

    def share_engine_weights(self, refresh: bool = False):
        """Transport "shared_memory": rank 0 keeps its inference weights in named shared memory
        and returns a ``weight_streaming.SharedWeightsHandle`` (block names, layout, version,
        node); the other ranks return None. The weights move into new blocks at the first call,
        with ``refresh`` (new runners must map them) and when a parameter was re-allocated
        since; new blocks keep their names until :meth:`unlink_engine_weights`."""
        import ray

        from ...weight_streaming.shared_memory import SharedWeights

        if rank() != 0:
            return None
        named = list(_engine_state_dict(self._engine_model()[1], keep_vars=True).items())
        shared = self._shared_weights
        if shared is None or refresh or not shared.holds(named):
            why = self.shared_weights_unsupported()  # checked when (re-)sharing, not every sync
            if why:
                raise ValueError(f"weight_sync_transport='shared_memory' cannot run: {why}; use 'object_store'")
            if shared is not None:
                shared.unlink()
            shared = self._shared_weights = SharedWeights(named)
        return shared.handle(self.weights_version(), ray.get_runtime_context().get_node_id())

    def unlink_engine_weights(self) -> None:
        """Remove the names of the shared blocks (every runner has mapped them): nothing is left
        in /dev/shm however the processes end."""
        if self._shared_weights is not None:
            self._shared_weights.unlink()

    def weights_version(self) -> int:
        """The learner's weights version (WEIGHTS_SEQ_NO)."""
        from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

        return int(self.get_state(components=[])[WEIGHTS_SEQ_NO])

    def put_next_engine_bucket(self, bucket_bytes: int, start: bool = False, engine_dtype: str | None = None):
        """Transport "object_store", one bucket per call, so that the driver can forward each
        bucket to the runners while this learner puts the next (docs/design.md "Weight
        streaming"). ``start``: begin a new stream of the current weights (older unreleased refs
        are dropped). Every rank advances the stream by one bucket (under FSDP it gathers that
        bucket's tensors); rank 0 ``ray.put``s it and returns ``(version, meta, ref, last)``, the
        other ranks return None. ``last`` is True for the final bucket. Rank 0 keeps the refs
        (it owns the objects) until :meth:`release_engine_weights`. ``engine_dtype`` (with
        ``start``; e.g. "bfloat16"): the engines' weight dtype, which wider floating tensors are
        cast to before they are put (``iter_engine_weights``)."""
        from ...weight_streaming import WeightManifest, iter_buckets, put_bucket

        sender = rank() == 0
        if not sender and not self.is_sharded:
            return None  # nothing to gather: rank 0 alone walks its weights
        if start:
            # unpacked: ray.put serialises each tensor straight into the store (one copy); the
            # other ranks cut the same buckets from placeholders, one gathered bucket per call
            self._engine_bucket_stream = iter_buckets(
                self.iter_engine_weights(placeholders=True, engine_dtype=engine_dtype), bucket_bytes, pack=False)
            self._engine_stream_bytes = 0
            self._engine_weights_manifest = WeightManifest(self.weights_version()) if sender else None
            self._engine_next_bucket = next(self._engine_bucket_stream, None)
            if self._engine_next_bucket is None:
                self._engine_bucket_stream = None
                if sender:
                    raise RuntimeError("weight sync: the module has no inference weights to send")
        stream = self._engine_bucket_stream
        if stream is None:
            if sender:
                raise RuntimeError("put_next_engine_bucket: no weight stream in progress; call it with start=True")
            return None  # e.g. LoRA: the merge gathered everything at the start; rank 0 holds it
        bucket, self._engine_next_bucket = self._engine_next_bucket, None
        ref = put_bucket(bucket) if sender else None
        meta = bucket.meta
        del bucket  # its tensors (gathered ones under FSDP) go before the next bucket's come
        self._engine_next_bucket = next(stream, None)  # look ahead one bucket to know the last
        last = self._engine_next_bucket is None
        if last:
            self._engine_bucket_stream = None
        if not sender:
            return None
        man = self._engine_weights_manifest
        man.buckets.append(meta)
        man.refs.append(ref)
        self._engine_stream_bytes += meta.nbytes
        return man.version, meta, ref, last

    def engine_stream_bytes(self) -> int | None:
        """Bytes rank 0 put in the object store for the last (or current) weight stream; None on
        the other ranks."""
        return self._engine_stream_bytes if rank() == 0 else None

    def release_engine_weights(self) -> None:
        """Drop the refs of the last stream of ``put_next_engine_bucket`` (the objects are freed
        once no runner or driver holds them either), and the stream if it was left unfinished."""
        self._engine_weights_manifest = None
        self._engine_bucket_stream = None
        self._engine_next_bucket = None

    def open_weight_group(self, group_id: str, world_size: int):
        """Transport "collective", step 1: rank 0 opens a TCP store on its node for a new
        weight group of ``world_size`` members (itself and the runners) and returns (host,
        port); the other ranks return None. An older group is dropped."""
        if rank() != 0:
            return None
        from ...weight_streaming.collective import open_store

        self._weight_group = None
        store, host, port = open_store(world_size)
        self._weight_group_pending = (group_id, world_size, store)
        return host, port

    def join_weight_group(self) -> None:
        """Step 2 (rank 0; blocks until every runner joined, see ``LLMEnvRunner.join_weight_group``)."""
        if rank() != 0:
            return None
        from ...weight_streaming.collective import join_group

        group_id, world_size, store = self._weight_group_pending
        self._weight_group_pending = None
        self._weight_group = join_group(group_id, world_size, store=store)

    def broadcast_engine_weights(self, bucket_bytes: int, engine_dtype: str | None = None):
        """Broadcast the weights bucket by bucket to the weight group (every rank takes part in
        the gathers under FSDP; rank 0 sends), wider floating tensors cast to ``engine_dtype``
        (the engines' weight dtype, e.g. "bfloat16"); rank 0 returns (version, number of
        buckets)."""
        from ...weight_streaming import iter_buckets
        from ...weight_streaming.collective import broadcast_buckets

        buckets = iter_buckets(self.iter_engine_weights(engine_dtype=engine_dtype), bucket_bytes)
        if rank() != 0:
            for _ in buckets:
                pass
            return None
        group = getattr(self, "_weight_group", None)
        if group is None:
            raise RuntimeError("broadcast_engine_weights: no weight group (open_weight_group / join_weight_group)")
        version = self.weights_version()
        try:
            return version, broadcast_buckets(group, buckets, version)
        except Exception:
            self._weight_group = None  # a broken group is re-formed by the next sync
            raise

    # ------------------------------------------------------------------ random streams
    def _seed_generators(self, seed: int) -> None:
        """This rank's generators (``seeded_generator``), and every rank's initial states (what
        rank 0 checkpoints until the first update gathers them)."""
        self._rng_seed = int(seed)
        for stream, (attr, _) in RNG_STREAMS.items():
            setattr(self, attr, seeded_generator(seed, stream, rank()))
        self._rank_rng_states = {r: self._seeded_rng_state(r) for r in range(world_size())}

    def _seeded_rng_state(self, rank_: int) -> dict:
        return {stream: seeded_generator(self._rng_seed, stream, rank_).get_state() for stream in RNG_STREAMS}

    def _rng_state(self) -> dict:
        """This rank's generator states ``{stream: ByteTensor}``."""
        return {stream: getattr(self, attr).get_state() for stream, (attr, _) in RNG_STREAMS.items()}

    def _remember_rank_rng_states(self, states: list[dict]) -> None:
        """Every rank's generator states, gathered at the end of an update (``gather_objects``):
        the generators only move in updates, so rank 0, the only rank whose ``get_state`` RLlib
        calls, checkpoints every rank's current states."""
        self._rank_rng_states = dict(enumerate(states))

    def _set_rng_state(self, own: dict) -> None:
        """Restore this rank's generators from a checkpoint's learner state. Rank r takes the
        saved states of rank r; a rank the checkpoint does not hold (it was written by fewer
        ranks) starts its seeded stream, with a warning. A checkpoint without per-rank states
        (older format) holds rank 0's only."""
        saved = {int(r): st for r, st in (own.get("rank_rng") or {}).items()}
        if not saved and "cov_rng" in own:
            saved = {0: {stream: own[stream] for stream in RNG_STREAMS}}
        if not saved:
            return
        me = rank()
        if me not in saved:
            logger.warning("learner rank %d: the checkpoint holds the random streams of ranks %s only; "
                           "this rank reseeds its Clip-Cov and entropy-sample streams", me, sorted(saved))
        for stream, (attr, _) in RNG_STREAMS.items():
            state = saved[me][stream] if me in saved else self._seeded_rng_state(me)[stream]
            getattr(self, attr).set_state(torch.as_tensor(state, dtype=torch.uint8).clone())
        self._rank_rng_states = {r: saved.get(r) or self._seeded_rng_state(r) for r in range(world_size())}

    def _own_state(self) -> dict:
        """This learner's own state: its generator states (top level, for readers of the older
        format) and every rank's (``rank_rng``, by rank; this rank's are current)."""
        mine = self._rng_state()
        ranks = {**getattr(self, "_rank_rng_states", {}), rank(): mine}
        return {**mine, "rank_rng": ranks}

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
        guard = getattr(self, "_step_guard", None)
        if guard is not None:
            own["step_guard"] = guard.get_state()
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
            self._set_full_optimizer_state_sharded(state.pop(COMPONENT_OPTIMIZER))
        super().set_state(state)
        self._set_rng_state(own)
        if "step_guard" in own and getattr(self, "_step_guard", None) is not None:
            self._step_guard.set_state(own["step_guard"])  # absent in checkpoints of older versions
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
            self._weights_seq_no = int(state[WEIGHTS_SEQ_NO])

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
