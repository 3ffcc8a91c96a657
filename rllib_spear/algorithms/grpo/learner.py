"""GRPOTorchLearner: the policy update of GRPO / Dr.BoT / SPEAR / SPADER on an HF causal LM.

The driver sends one padded batch per learner (whole groups; advantages, masks and the global
loss normalizers already computed). Here:

* rows are split into mini-batches (``minibatch_id`` column; one optimizer step each), and each
  mini-batch into token-budget micro-batches whose gradients are accumulated;
* every loss term uses the normalizers of the *global* mini-batch (all micro-batches of all
  learners), so the gradient does not depend on the micro-batch split or the learner count;
* under DDP (``num_learners > 1``) the all-reduce runs once per optimizer step (``no_sync`` on
  the other micro-batches), and every learner performs the same number of backward passes;
* on-policy rows and replayed (SIL) rows may share a batch (``joint`` mode): each part gets its
  own loss config (Clip-Cov replay parameters) and normalizer, and replay rows are weighted by
  ``loss_weight`` (w_SIL).

Sharding (``learners(sharding=...)``, docs/design.md "Learner sharding"): under "ddp" RLlib wraps
the module in DDP; under "fsdp" ``_make_module`` applies FSDP2 (``models.sharding``) before the
optimizer is built, so AdamW holds the float32 master shards and their state. FSDP runs collectives
in every forward and backward, so every rank runs the same number of micro-batches (ranks with
fewer rows run fully-masked dummy rows) and gradients are reduce-scattered after every micro-batch
(accumulating sharded gradients instead of a full unsharded copy). ``mixed_precision="bf16"``
computes in bf16: FSDP's MixedPrecisionPolicy when sharded, ``torch.autocast`` otherwise.
Checkpoints under FSDP are torch.distributed.checkpoint folders written by every rank
(``save_sharded_state``), loadable with any number of ranks (``set_state``).

Entropy: the full-vocabulary entropy costs an extra pass over the logits of every head chunk
(plus its recomputation in the checkpointed backward). The learner asks the module for it
(``batch["_need_entropy"]``) on every micro-batch only when ``entropy_coeff > 0`` (the bonus needs
its gradient); otherwise on one micro-batch of the first mini-batch of each update, so the
``entropy`` metric is still logged at a fraction of the cost. Micro-batches group rows of similar
length (less padding), so that micro-batch is drawn with probability proportional to its tokens:
its token-mean entropy is then an unbiased estimate of the update's. The old-log-prob
recomputation never asks for it.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import numpy as np
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from ...core.losses import METRIC_REDUCE, LossNormalizer, policy_loss
from ...models import sharding
from ...models.threads import apply_torch_threads

logger = logging.getLogger(__name__)

#: Learner-state key of this learner's own state (RNG streams, the sharded-checkpoint marker).
LEARNER_STATE_KEY = "rllib_spear_learner"
#: Folder of the torch.distributed.checkpoint shards, inside the checkpoint's learner folder.
SHARDED_STATE_DIR = "sharded_state"

__all__ = ["GRPOTorchLearner", "BATCH_COLUMNS"]

#: Columns of the learner batch (all [B, T] unless noted [B]).
BATCH_COLUMNS = (
    "input_ids", "attention_mask", "loss_mask", "old_logp", "engine_logp", "advantages",
    "minibatch_id",  # [B] int
    "norm_num_tokens", "norm_num_seqs", "t_norm",  # [B] global normalizers of the row's mini-batch part
    "is_replay", "loss_weight",  # [B]
)


class GRPOTorchLearner(TorchLearner):
    """TorchLearner with token-budget micro-batching and core.policy_loss."""

    @override(TorchLearner)
    def build(self) -> None:
        apply_torch_threads(getattr(self.config, "torch_num_threads", None))
        self._ref_model = None
        self._restore_dir = None
        super().build()
        seed = int(getattr(self.config, "seed", 0) or 0)
        # Clip-Cov draws tokens at random: a learner-owned generator keeps it reproducible.
        self._cov_generator = torch.Generator(device="cpu").manual_seed(seed + 7919)
        # Which micro-batch logs the entropy metric (its own stream: Clip-Cov draws stay as they are).
        self._entropy_generator = torch.Generator(device="cpu").manual_seed(seed + 104729)
        self._first_minibatch = False

    @property
    def is_sharded(self) -> bool:
        """FSDP2 layout (learners(sharding="fsdp"))."""
        return getattr(self.config, "sharding", "ddp") == "fsdp"

    @override(TorchLearner)
    def _make_module(self):
        config = self.config
        if self.is_sharded and self._device is not None and self._device.type == "cuda":
            torch.cuda.set_device(self._device)  # FSDP's default mesh uses the current device
        if self.is_sharded and _rank() != 0:
            from ...models.rl_module import empty_weights

            with empty_weights():  # rank 0 reads the weights; the others get their shards from it
                module = super()._make_module()
        else:
            module = super()._make_module()
        for mid in module.keys():
            rlm = module[mid]
            hf = _hf_model_of(rlm)
            self._apply_activation_checkpointing(rlm, hf)
            if float(getattr(config, "kl_coeff", 0.0) or 0.0) > 0 and self._ref_model is None:
                # KL to a frozen reference (SPADER option): a copy of the initial policy,
                # learner-only, taken before sharding (and sharded like the policy).
                import copy

                from ...models.logprobs import unwrap_causal_lm

                self._ref_model = copy.deepcopy(unwrap_causal_lm(hf)).eval()
                self._ref_model.requires_grad_(False)
                if self.is_sharded:
                    self._shard_from_rank0(self._ref_model)
            if self.is_sharded:
                import torch.distributed as dist

                if not dist.is_initialized():
                    raise RuntimeError("sharding='fsdp' needs the learners' process group: use "
                                       ".learners(num_learners=N) with N >= 1 (remote learners)")
                self._shard_from_rank0(hf)
                rlm.compute_device = self._device
        return module

    @override(TorchLearner)
    def _map_module_to_device(self, module) -> None:
        # FSDP moves each rank's shards to the mesh's device as it shards (and keeps them in CPU
        # memory under cpu_offload): moving the whole model to the GPU first would need a full
        # replica's memory on every rank, which is what sharding is for.
        if not self.is_sharded:
            super()._map_module_to_device(module)

    def _shard_from_rank0(self, model) -> None:
        """FSDP2-shard ``model`` and fill every rank's shards from rank 0's loaded weights."""
        full = dict(model.state_dict()) if _rank() == 0 else None  # CPU tensors, no copy
        sharding.shard_causal_lm(model, mixed_precision=self.config.mixed_precision,
                                 cpu_offload=bool(self.config.cpu_offload))
        sharding.load_full_state_from_rank0(model, full, self._device)

    def _apply_activation_checkpointing(self, rlm, hf) -> None:
        """learners(activation_checkpointing=True/False) overrides model_config's switch."""
        want = getattr(self.config, "activation_checkpointing", None)
        if want is None or not hasattr(hf, "gradient_checkpointing_enable"):
            return
        from ...models.logprobs import unwrap_causal_lm

        lm = unwrap_causal_lm(hf)
        if want:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            lm.config.use_cache = False
            if hf is not lm and hasattr(hf, "enable_input_require_grads"):
                hf.enable_input_require_grads()  # LoRA: frozen embeddings, checkpointed blocks
        elif getattr(lm, "is_gradient_checkpointing", False):
            lm.gradient_checkpointing_disable()

    @override(TorchLearner)
    def _make_modules_ddp_if_necessary(self) -> None:
        if not self.is_sharded:  # FSDP shards instead of replicating
            super()._make_modules_ddp_if_necessary()

    def _compute_context(self):
        """bf16 autocast for mixed precision on a replicated (DDP / single) learner; FSDP casts
        the gathered parameters itself (MixedPrecisionPolicy)."""
        if getattr(self.config, "mixed_precision", None) == "bf16" and not self.is_sharded:
            return torch.autocast(device_type=self._device.type if self._device is not None else "cpu",
                                  dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _max_over_ranks(self, n: int) -> int:
        """max(n) over the learner ranks (FSDP: every rank must run as many forwards)."""
        import torch.distributed as dist

        if not (self.is_sharded and dist.is_initialized()) or dist.get_world_size() == 1:
            return n
        t = torch.tensor([n], dtype=torch.long,
                         device=self._device if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    # ------------------------------------------------------------------ optimizer
    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        config = config or self.config
        module = self._module[module_id]
        params = [p for p in self.get_parameters(module) if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=1.0, betas=tuple(config.adam_betas), weight_decay=config.weight_decay
        )
        lr = config.lr
        warmup = int(getattr(config, "lr_warmup_steps", 0) or 0)
        if warmup > 0 and not isinstance(lr, (list, tuple)):
            # Linear warmup over `warmup` training iterations (the driver passes the iteration
            # index as the schedule's timestep), then constant.
            lr = [[0, lr / (warmup + 1)], [warmup, lr]]
        self.register_optimizer(module_id=module_id, optimizer=optimizer, params=params,
                                lr_or_lr_schedule=lr)

    # ------------------------------------------------------------------ loss
    @override(TorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out) -> torch.Tensor:
        logp = fwd_out["logp"]
        entropy = fwd_out.get("entropy")
        ref_logp = fwd_out.get("ref_logp")
        if ref_logp is None and self._ref_model is not None:
            from ...models.logprobs import token_logprobs

            with torch.no_grad(), self._compute_context():
                ref_logp = token_logprobs(self._ref_model, batch["input_ids"], batch["attention_mask"],
                                          temperature=float(config.temperature)).float()
        is_replay = batch["is_replay"].bool()
        total = logp.new_zeros(())
        # One host sync decides the parts; a part holding every row is used without indexing
        # (no row copies in the forward, no index_put in the backward: the common on-policy case).
        n_replay = int(is_replay.sum())
        n_rows = int(is_replay.shape[0])
        parts = []
        if n_replay < n_rows:
            parts.append((False, None if n_replay == 0 else ~is_replay))
        if n_replay > 0:
            parts.append((True, None if n_replay == n_rows else is_replay))
        for replay, rows in parts:
            def take(t, rows=rows):
                return t if rows is None else t[rows]
            norm = LossNormalizer(
                num_tokens=float(take(batch["norm_num_tokens"])[0]),
                num_seqs=float(take(batch["norm_num_seqs"])[0]),
                t_norm=float(take(batch["t_norm"])[0]),
            )
            loss_cfg = config.policy_loss_config(replay=replay)
            loss, metrics = policy_loss(
                take(logp), take(batch["old_logp"]), take(batch["advantages"]),
                take(batch["loss_mask"]), config=loss_cfg, normalizer=norm,
                engine_logp=take(batch["engine_logp"]) if loss_cfg.tis_cap else None,
                ref_logp=None if ref_logp is None else take(ref_logp),
                entropy=None if entropy is None else take(entropy),
                generator=self._cov_generator,
            )
            weight = float(take(batch["loss_weight"])[0])
            total = total + weight * loss
            prefix = "sil_" if replay else ""
            for k, v in metrics.items():
                # a "_max" metric is a maximum over the update, not a mean of per-batch maxima
                reduce = METRIC_REDUCE.get(k, "mean")
                self.metrics.log_value((module_id, prefix + k), float(v), reduce=reduce, window=1000)
            # Engine-vs-trainer mismatch: logp_new before any optimizer step equals the trainer's
            # logp_old, so measure it on the first mini-batch of an update.
            if not replay and self._first_minibatch:
                m = take(batch["loss_mask"]) > 0
                if bool(m.any()):
                    diff = (take(logp).detach() - take(batch["engine_logp"])).abs()[m]
                    self.metrics.log_value((module_id, "logp_mismatch_mean"), float(diff.mean()), window=1000)
                    self.metrics.log_value((module_id, "logp_mismatch_max"), float(diff.max()), reduce="max", window=1000)
        return total

    def _recompute_old_logp(self, module, data: dict, budget: int) -> torch.Tensor:
        """logp_old of the on-policy rows under the current weights (no grad), micro-batched like
        the update. Replayed (SIL) rows keep their stored behaviour log-probs: their ratio is
        pi_theta / pi_behaviour (docs/algorithms.md 2.3), and the current weights are not the
        policy that generated them."""
        out = data["old_logp"].clone()
        on_policy = torch.nonzero(data["is_replay"] == 0).flatten()
        parts = [on_policy[p] for p in _token_budget_microbatches(data["attention_mask"][on_policy], budget)]
        # FSDP: every rank runs the same number of forwards (the others score a dummy row).
        parts = parts + [None] * (self._max_over_ranks(len(parts)) - len(parts))
        with torch.no_grad(), self._compute_context():
            for part in parts:
                if part is None:
                    sub = _dummy_rows(data, None)
                    sub["_need_entropy"] = False
                    module.forward_train(sub)
                    continue
                sub = _slice_rows(data, part)
                sub["_need_entropy"] = False
                logp = module.forward_train(sub)["logp"].detach().float()
                T = logp.shape[1]
                out[part, :T] = logp * sub["loss_mask"]
        return out

    # ------------------------------------------------------------------ update
    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: Any):
        (module_id, data), = batch.items()
        module = self.module[module_id]
        config = self.config.get_config_for_module(module_id)
        budget = int(config.micro_batch_token_budget)
        mb_ids = data["minibatch_id"].long()
        num_minibatches = int(data["num_minibatches"][0]) if len(mb_ids) else 0
        last_loss = torch.zeros(())
        # DDP averages gradients over learners, while each learner's loss is already its share
        # of the global-batch loss (global normalizers): scale back so the sum is the gradient.
        # (FSDP's reduce-scatter averages the same way.)
        ddp_scale = float(self.config.num_learners) if self.config.num_learners > 1 else 1.0
        loss_cfg = config.policy_loss_config()
        if getattr(config, "recompute_old_logprobs", False) or loss_cfg.tis_cap:
            # Trainer-side logp_old (1.6): the ratio is taken against the trainer's numerics and
            # the engine log-probs only enter the truncated importance weight.
            data = dict(data)
            data["old_logp"] = self._recompute_old_logp(module, data, budget)
        fwd_out: dict = {}
        trained_tokens = 0
        # Entropy on every micro-batch only when the bonus needs it; else one sample for metrics.
        entropy_always = float(getattr(config, "entropy_coeff", 0.0) or 0.0) > 0
        replicated_multi = self.config.num_learners > 1 and not self.is_sharded
        for mb in range(num_minibatches):
            self._first_minibatch = mb == 0
            rows = torch.nonzero(mb_ids == mb).flatten()
            micro = _token_budget_microbatches(data["attention_mask"][rows], budget)
            # A learner without rows of this mini-batch joins the collectives with dummy rows;
            # under FSDP every forward is a collective, so every rank runs as many micro-batches.
            n_micro = self._max_over_ranks(max(len(micro), 1))
            micro = micro + [None] * (n_micro - len(micro))
            entropy_part = _entropy_sample_part(data["attention_mask"][rows], micro,
                                                self._entropy_generator) if mb == 0 else -1
            for optim in self._optimizer_parameters:
                optim.zero_grad(set_to_none=True)
            for i, part in enumerate(micro):
                sync = i == len(micro) - 1
                ctx = contextlib.nullcontext()
                if replicated_multi and not sync:
                    ctx = module.no_sync()  # DDP: one all-reduce per optimizer step
                with ctx:
                    if part is None:
                        sub = _dummy_rows(data, None)
                    else:
                        sub = _slice_rows(data, rows[part])
                    sub["_need_entropy"] = entropy_always or i == entropy_part
                    with self._compute_context():
                        fwd_out = module.forward_train(sub)
                    fwd_out = {k: v.float() for k, v in fwd_out.items()}
                    loss = self.compute_loss_for_module(
                        module_id=module_id, config=config, batch=sub, fwd_out=fwd_out)
                    if part is None:
                        loss = loss * 0.0
                    (loss * ddp_scale).backward()
                    trained_tokens += int(sub["attention_mask"].sum()) if part is not None else 0
                    last_loss = loss.detach()
            if self.is_sharded:
                self._clip_and_step(module_id, config)
                continue
            grads = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
            grad_norm = _global_norm(grads.values())
            self.metrics.log_value((module_id, "grad_norm"), grad_norm, window=1000)
            post = self.postprocess_gradients(grads)
            self.apply_gradients(post)
        self._first_minibatch = False
        if num_minibatches:
            # This rank's parameter / gradient / optimizer-state bytes at the last step (shards
            # only under FSDP): what benchmarks/learner_memory.py and the memory planner compare.
            for k, v in self.state_bytes().items():
                self.metrics.log_value((module_id, k), v, reduce="max", window=1)
        self.metrics.log_value((module_id, "num_optimizer_steps"), num_minibatches, reduce="sum")
        self.metrics.log_value((module_id, "trained_tokens"), trained_tokens, reduce="sum")
        return fwd_out, {module_id: last_loss}, {}


    def _clip_and_step(self, module_id, config) -> None:
        """FSDP: global-norm clip over every rank's shards, then the optimizer step (RLlib's
        clip and finite checks work on whole tensors, not on DTensor shards)."""
        params = [p for p in self._params.values() if p.grad is not None]
        norm = sharding.global_grad_norm(p.grad for p in params)
        grad_norm = float(norm)
        self.metrics.log_value((module_id, "grad_norm"), grad_norm, window=1000)
        if not np.isfinite(grad_norm):  # the same global norm on every rank: all skip together
            logger.warning("grad_norm is %s: skipping this optimizer step", grad_norm)
            for optim in self._optimizer_parameters:
                optim.zero_grad(set_to_none=True)
            return
        clip = getattr(config, "grad_clip", None)
        if clip is not None and getattr(config, "grad_clip_by", "global_norm") == "global_norm":
            sharding.clip_grads_(params, float(clip), norm)
        elif clip is not None:
            raise ValueError("sharding='fsdp' supports grad_clip_by='global_norm' only")
        for optim in self._optimizer_parameters:
            optim.step()

    def state_bytes(self) -> dict[str, int]:
        """Bytes this rank stores for parameters, gradients and optimizer state (a DTensor counts
        its local shard; the optimizer's scalar ``step`` counters are included)."""
        params = [p for mid in self.module.keys() for p in self.module[mid].parameters()]
        opt = [t for optim in self._optimizer_parameters for st in optim.state.values()
               for t in st.values() if isinstance(t, torch.Tensor)]
        return {"param_bytes": sharding.local_bytes(params),
                "grad_bytes": sharding.local_bytes(p.grad for p in params),
                "optimizer_bytes": sharding.local_bytes(opt)}

    # ------------------------------------------------------------------ weights and state
    def engine_state(self) -> dict | None:
        """The inference weights for the engines, with the weights version (every rank must call
        this under FSDP: the shards are gathered one tensor at a time; rank 0 returns
        ``{"rl_module": {module_id: HF state dict}, WEIGHTS_SEQ_NO: n}``, the others None)."""
        from ray.rllib.core import COMPONENT_RL_MODULE
        from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

        if not self.is_sharded:
            state = self.get_state(components=COMPONENT_RL_MODULE, inference_only=True)
            return {COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE], WEIGHTS_SEQ_NO: self._weights_seq_no}
        out = {mid: self.module[mid].unwrapped().get_state(inference_only=True) for mid in self.module.keys()}
        if _rank() != 0:
            return None
        return {COMPONENT_RL_MODULE: out, WEIGHTS_SEQ_NO: self._weights_seq_no}

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
        self._restore_dir = str(path)  # set_state finds the sharded state beside the state file
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
        """RLlib's optimizer state (full tensors, numpy) into the sharded optimizers."""
        from ray.rllib.utils.torch_utils import convert_to_torch_tensor
        from torch.distributed.tensor import DTensor, distribute_tensor

        for name, entry in opt_state.items():
            optim = self._named_optimizers.get(name)
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

    def save_sharded_state(self, directory: str) -> None:
        """Every rank writes its shards of the module weights and the optimizer state as one
        torch.distributed.checkpoint per module (``directory/<module_id>``): no gather, so no rank
        ever holds the whole model, and DCP re-shards on load for any number of ranks."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        for mid in self.module.keys():
            rlm = self.module[mid].unwrapped()
            optims = [self._named_optimizers[n] for n in self._module_optimizers.get(mid, [])]
            msd, osd = get_state_dict(rlm, optims)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(directory, str(mid)))

    def load_sharded_state(self, directory: str) -> None:
        """Load ``save_sharded_state``'s folder with this learner's ranks (any number, sharded or
        not): DCP reads each rank's slices of every tensor."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        for mid in self.module.keys():
            rlm = self.module[mid].unwrapped()
            optims = [self._named_optimizers[n] for n in self._module_optimizers.get(mid, [])]
            msd, osd = get_state_dict(rlm, optims)
            target = {"model": msd, "optim": osd}
            dcp.load(target, checkpoint_id=os.path.join(directory, str(mid)))
            set_state_dict(rlm, optims, model_state_dict=target["model"], optim_state_dict=target["optim"])


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _as_list(x) -> list:
    if x is None:
        return []
    return [x] if isinstance(x, str) else list(x)


def _hf_model_of(module):
    """The HF causal LM held by an HFCausalLMRLModule."""
    for name in ("model", "lm", "hf_model"):
        m = getattr(module, name, None)
        if isinstance(m, torch.nn.Module):
            return m
    raise AttributeError(f"{type(module).__name__} holds no HF model under .model/.lm/.hf_model")


def _token_budget_microbatches(attention_mask: torch.Tensor, budget: int) -> list[torch.Tensor]:
    """Rows packed into parts with ``len(part) x longest row of the part <= budget``.

    Rows are taken longest first, so that each part holds rows of similar length: a part is
    padded to its longest row, and mixing a 400-token trajectory with 60-token guesses pays
    the padding on every short row (a third of the learner's FLOPs in the search task). The
    order of rows does not change the accumulated gradient (the loss uses global normalizers).
    A single row longer than the budget forms its own part (it cannot be split).
    """
    lengths = attention_mask.sum(dim=1).tolist()
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    parts: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        L = int(lengths[i])
        new_max = max(cur_max, L)
        if cur and new_max * (len(cur) + 1) > budget:
            parts.append(cur)
            cur, new_max = [], L
        cur.append(i)
        cur_max = new_max
    if cur:
        parts.append(cur)
    return [torch.tensor(sorted(p), dtype=torch.long) for p in parts]


def _entropy_sample_part(attention_mask: torch.Tensor, parts: list, generator: torch.Generator) -> int:
    """Index of the micro-batch that logs the entropy metric, drawn with P(part) = tokens / total."""
    if len(parts) <= 1:  # also the [None] placeholder of a learner without rows
        return 0
    tokens = torch.tensor([float(attention_mask[p].sum()) for p in parts])
    return int(torch.multinomial(tokens, 1, generator=generator))


def _slice_rows(data: dict, rows: torch.Tensor) -> dict:
    """Rows of the batch, with the time axis trimmed to the longest real row."""
    T = int(data["attention_mask"][rows].sum(dim=1).max().item()) if len(rows) else 1
    out = {}
    for k, v in data.items():
        if not isinstance(v, torch.Tensor):
            continue
        v = v[rows]
        out[k] = v[:, :T] if v.dim() == 2 else v
    return out


def _dummy_rows(data: dict, _=None) -> dict:
    """A one-row, fully masked batch (loss 0) so DDP / FSDP ranks stay in lockstep."""
    out = _slice_rows(data, torch.tensor([0]))
    out["loss_mask"] = torch.zeros_like(out["loss_mask"])
    out["norm_num_tokens"] = torch.ones_like(out["norm_num_tokens"])
    out["norm_num_seqs"] = torch.ones_like(out["norm_num_seqs"])
    return out


def _global_norm(grads) -> float:
    """L2 norm over all gradients with a single host sync (not one per parameter)."""
    gs = [g.detach() for g in grads]
    if not gs:
        return 0.0
    return float(torch.nn.utils.get_total_norm(gs, norm_type=2.0))
