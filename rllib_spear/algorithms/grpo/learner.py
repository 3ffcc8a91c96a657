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
from typing import Any

import numpy as np
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override

from ...core.losses import METRIC_REDUCE, LossNormalizer, policy_loss
from ...models.threads import apply_torch_threads

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
        super().build()
        seed = int(getattr(self.config, "seed", 0) or 0)
        # Clip-Cov draws tokens at random: a learner-owned generator keeps it reproducible.
        self._cov_generator = torch.Generator(device="cpu").manual_seed(seed + 7919)
        # Which micro-batch logs the entropy metric (its own stream: Clip-Cov draws stay as they are).
        self._entropy_generator = torch.Generator(device="cpu").manual_seed(seed + 104729)
        self._first_minibatch = False
        # KL to a frozen reference (SPADER option): a copy of the initial policy, learner-only.
        self._ref_model = None
        if float(getattr(self.config, "kl_coeff", 0.0) or 0.0) > 0:
            import copy

            from ...models.logprobs import unwrap_causal_lm

            module = self.module[next(iter(self.module.keys()))].unwrapped()
            self._ref_model = copy.deepcopy(unwrap_causal_lm(_hf_model_of(module))).eval()
            self._ref_model.requires_grad_(False)

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

            with torch.no_grad():
                ref_logp = token_logprobs(self._ref_model, batch["input_ids"], batch["attention_mask"],
                                          temperature=float(config.temperature))
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
        if len(on_policy) == 0:
            return out
        parts = [on_policy[p] for p in _token_budget_microbatches(data["attention_mask"][on_policy], budget)]
        with torch.no_grad():
            for part in parts:
                sub = _slice_rows(data, part)
                sub["_need_entropy"] = False
                logp = module.forward_train(sub)["logp"].detach()
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
        for mb in range(num_minibatches):
            self._first_minibatch = mb == 0
            rows = torch.nonzero(mb_ids == mb).flatten()
            micro = _token_budget_microbatches(data["attention_mask"][rows], budget)
            if not micro:  # this learner holds no row of the global mini-batch: join the all-reduce
                micro = [None]
            entropy_part = _entropy_sample_part(data["attention_mask"][rows], micro,
                                                self._entropy_generator) if mb == 0 else -1
            for optim in self._optimizer_parameters:
                optim.zero_grad(set_to_none=True)
            for i, part in enumerate(micro):
                sync = i == len(micro) - 1
                ctx = contextlib.nullcontext()
                if self.config.num_learners > 1 and not sync:
                    ctx = module.no_sync()
                with ctx:
                    if part is None:
                        sub = _dummy_rows(data, rows[:0] if len(rows) else torch.arange(1))
                    else:
                        sub = _slice_rows(data, rows[part])
                    sub["_need_entropy"] = entropy_always or i == entropy_part
                    fwd_out = module.forward_train(sub)
                    loss = self.compute_loss_for_module(
                        module_id=module_id, config=config, batch=sub, fwd_out=fwd_out)
                    if part is None:
                        loss = loss * 0.0
                    (loss * ddp_scale).backward()
                    trained_tokens += int(sub["attention_mask"].sum()) if part is not None else 0
                    last_loss = loss.detach()
            grads = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
            grad_norm = _global_norm(grads.values())
            self.metrics.log_value((module_id, "grad_norm"), grad_norm, window=1000)
            post = self.postprocess_gradients(grads)
            self.apply_gradients(post)
        self._first_minibatch = False
        self.metrics.log_value((module_id, "num_optimizer_steps"), num_minibatches, reduce="sum")
        self.metrics.log_value((module_id, "trained_tokens"), trained_tokens, reduce="sum")
        return fwd_out, {module_id: last_loss}, {}


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


def _dummy_rows(data: dict, _: torch.Tensor) -> dict:
    """A one-row, fully masked batch (loss 0) so DDP ranks stay in lockstep."""
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
