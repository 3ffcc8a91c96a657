"""Bad steps in the update core (learner/core.py, learner/steps.py): a non-finite loss or gradient
skips the optimizer step (no weight and no optimizer state changes), the skip is counted
(``skipped_steps``), the next finite step trains as if the bad batch never came, and
``max_consecutive_skipped_steps`` skipped steps in a row stop the run. One rank's NaN makes every
rank skip (two gloo ranks). The layouts of the RLlib learner: tests/e2e/test_bad_steps.py."""
from __future__ import annotations

import copy
import os
import socket

import numpy as np
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_spear import GRPOConfig
from rllib_spear.learner import core as update_core
from rllib_spear.learner.optim import build_adamw
from rllib_spear.learner.steps import StepGuard, TooManySkippedStepsError
from rllib_spear.core.trajectory import Segment, Trajectory
from rllib_spear.recipe.batching import LearnerRow, build_learner_batches

from test_update_core import _learner_update as _rllib_update  # one RLlib learner update -> its metrics

NAN = float("nan")
TRAINING = dict(lr=1e-3, micro_batch_token_budget=48, loss_mode="vanilla", entropy_metric_tokens=0)


@pytest.fixture(scope="module")
def path():
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path()


def _batch(seed: int, *, nan_row: int | None = None, minibatch_size: int | None = None) -> dict:
    """A learner batch of 4 two-turn trajectories in 2 groups (one mini-batch unless
    ``minibatch_size``); ``nan_row``: that row's behaviour log-probs are NaN (a NaN loss and NaN
    gradients, as a broken engine or reward would give)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(4):
        tok = lambda k: rng.integers(3, 500, k).tolist()  # noqa: E731
        segs = [Segment("prompt", tok(6)), Segment("assistant", tok(5), [-1.0] * 5, 0),
                Segment("observation", tok(4)), Segment("assistant", tok(4), [-1.0] * 4, 1)]
        t = Trajectory(uid=f"g{i // 2}", segments=segs, outcome_reward=float(i % 2), step_rewards=[0.0, 0.0],
                       traj_id=f"t{i}")
        rows.append(LearnerRow(t, t.token_advantages(0.5 if i % 2 else -0.5), t.loss_mask()))
    batch = build_learner_batches(rows, num_learners=0, minibatch_size=minibatch_size, t_norm=32.0,
                                  pad_token_id=0, seed=0)[0]
    if nan_row is not None:
        batch["old_logp"][nan_row] = NAN
    return batch


def _config():
    return GRPOConfig().training(**TRAINING)


def _local(model, **kw) -> update_core.LocalUpdate:
    config = _config()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = build_adamw(params, lr=config.lr, betas=tuple(config.adam_betas), weight_decay=config.weight_decay)
    return update_core.LocalUpdate(model, opt, loss_config=config.policy_loss_config(),
                                   settings=update_core.UpdateSettings.of(config), device="cpu",
                                   grad_clip=config.grad_clip, seed=0, **kw)


def _snapshot(update: update_core.LocalUpdate) -> tuple[dict, list]:
    """(weights, optimizer state tensors) of ``update``, copied."""
    weights = {k: v.detach().clone() for k, v in update.model.state_dict().items()}
    state = [copy.deepcopy(s) for s in update.optimizer.state_dict()["state"].values()]
    return weights, state


def _same(a: tuple[dict, list], b: tuple[dict, list]) -> bool:
    (wa, sa), (wb, sb) = a, b
    weights = wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    state = len(sa) == len(sb) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                        for x, y in zip(sa, sb))
    return weights and state


@pytest.fixture
def model(path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)


# ------------------------------------------------------------------------------ one process
def test_a_nan_batch_changes_nothing_and_the_next_step_trains_as_without_it(model):
    ours, ref = _local(model), _local(copy.deepcopy(model))
    for update in (ours, ref):  # a first step: the optimizer holds state the skip must not touch
        assert update.update(_batch(0))["skipped_steps"] == 0
    before = _snapshot(ours)
    out = ours.update(_batch(1, nan_row=2))
    assert out["skipped_steps"] == 1 and out["num_optimizer_steps"] == 0
    assert ours.guard.skipped == 1 and ours.guard.consecutive == 1
    assert _same(before, _snapshot(ours)), "the skipped step changed the weights or the optimizer state"
    # the next finite batch trains exactly as on a run that never saw the bad one
    out = ours.update(_batch(2))
    ref.update(_batch(2))
    assert out["skipped_steps"] == 0 and out["num_optimizer_steps"] == 1 and ours.guard.consecutive == 0
    assert not _same(before, _snapshot(ours))
    assert _same(_snapshot(ref), _snapshot(ours))


def test_a_nan_loss_with_finite_gradients_is_skipped(model, monkeypatch):
    """A non-finite loss whose gradient is finite (a NaN in a term without gradient) is skipped
    too: the loss is what the run reports, and a NaN there means the batch is broken."""
    update = _local(model)
    real = update_core.UpdateCore.loss

    def nan_loss(self, batch, fwd_out):
        loss, parts = real(self, batch, fwd_out)
        return loss + torch.tensor(NAN), parts

    monkeypatch.setattr(update_core.UpdateCore, "loss", nan_loss)
    before = _snapshot(update)
    out = update.update(_batch(0))
    assert out["skipped_steps"] == 1 and _same(before, _snapshot(update))


@pytest.mark.parametrize("bad", [NAN, float("inf")])
def test_a_non_finite_gradient_is_skipped(model, monkeypatch, bad):
    update = _local(model)
    update.update(_batch(0))
    real = update_core.UpdateCore.backward

    def poisoned(self, loss):
        real(self, loss)
        first = next(p for p in update.model.parameters() if p.grad is not None)
        first.grad.view(-1)[0] = bad  # one element of one accumulated gradient

    monkeypatch.setattr(update_core.UpdateCore, "backward", poisoned)
    before = _snapshot(update)
    assert update.update(_batch(1))["skipped_steps"] == 1
    assert _same(before, _snapshot(update))


def test_only_the_bad_minibatch_of_an_update_is_skipped(model):
    update = _local(model)
    # 2 mini-batches of 2 rows; row 0 is NaN: one step skipped, the other applied
    out = update.update(_batch(0, nan_row=0, minibatch_size=2))
    assert out["skipped_steps"] == 1 and out["num_optimizer_steps"] == 1


def test_consecutive_skipped_steps_stop_the_run(model):
    update = _local(model, max_consecutive_skipped_steps=2)
    update.update(_batch(0, nan_row=1))  # 1 in a row
    update.update(_batch(1))  # a finite step resets the run of skips
    update.update(_batch(2, nan_row=1))  # 1 in a row
    with pytest.raises(TooManySkippedStepsError, match="max_consecutive_skipped_steps=2"):
        update.update(_batch(3, nan_row=0))
    assert update.guard.skipped == 3


@pytest.mark.parametrize("limit", [0, None])
def test_a_guard_without_limit_never_stops(limit):
    guard = StepGuard(limit)
    for _ in range(100):
        guard.record(False)
    assert guard.skipped == guard.consecutive == 100


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_validate_names_the_key(bad):
    cfg = (GRPOConfig().environment("search_qa").rl_module(model_config={"model_path": "embedded"})
           .training(max_consecutive_skipped_steps=bad))
    with pytest.raises(ValueError, match="max_consecutive_skipped_steps"):
        cfg.validate(check_files=False)


def test_the_default_stops_after_ten():
    assert GRPOConfig().max_consecutive_skipped_steps == 10
    for ok in (0, None, 3):
        (GRPOConfig().environment("search_qa").rl_module(model_config={"model_path": "embedded"})
         .training(max_consecutive_skipped_steps=ok).validate(check_files=False))


# ------------------------------------------------------------------------------ RLlib learner
def _learner_snapshot(learner) -> tuple[dict, list]:
    weights = {k: v.detach().clone() for k, v in learner.module[DEFAULT_MODULE_ID].state_dict().items()}
    state = [copy.deepcopy(s) for optim in learner.all_optimizers() for s in optim.state_dict()["state"].values()]
    return weights, state


def test_the_rllib_learner_skips_counts_and_stops(path):
    """The single learner in the driver: RLlib's own step would zero the NaN gradients and step
    anyway (weight decay, Adam moments and step count move); the core skips it."""
    cfg = (GRPOConfig().environment("search_qa").env_runners(num_env_runners=0)
           .training(**TRAINING, max_consecutive_skipped_steps=2)
           .rl_module(model_config={"model_path": path}).debugging(seed=0))
    learner = cfg.build_learner(env=None)
    assert _rllib_update(learner, _batch(0))["skipped_steps"] == 0
    before = _learner_snapshot(learner)
    res = _rllib_update(learner, _batch(1, nan_row=3))
    assert res["skipped_steps"] == 1 and res["num_optimizer_steps"] == 0
    assert _same(before, _learner_snapshot(learner))
    assert _rllib_update(learner, _batch(2))["skipped_steps"] == 0
    assert not _same(before, _learner_snapshot(learner))
    _rllib_update(learner, _batch(3, nan_row=0))
    with pytest.raises(TooManySkippedStepsError, match="max_consecutive_skipped_steps"):
        _rllib_update(learner, _batch(4, nan_row=0))



def test_the_skip_counters_are_in_the_learners_checkpoint(path):
    """A run of skipped steps that spans a restore still stops at the limit: the learner's state
    carries the guard's counters (before, a restored learner started again from 0)."""
    cfg = (GRPOConfig().environment("search_qa").env_runners(num_env_runners=0)
           .training(**TRAINING, max_consecutive_skipped_steps=2)
           .rl_module(model_config={"model_path": path}).debugging(seed=0))
    learner = cfg.build_learner(env=None)
    _rllib_update(learner, _batch(0, nan_row=0))  # 1 skipped, 1 in a row
    state = learner.get_state()
    fresh = cfg.build_learner(env=None)
    fresh.set_state(state)
    assert fresh.step_guard.get_state() == {"skipped": 1, "consecutive": 1}
    with pytest.raises(TooManySkippedStepsError, match="2 optimizer steps in a row"):
        _rllib_update(fresh, _batch(1, nan_row=0))


# ------------------------------------------------------------------------------ two gloo ranks
def _rank(rank: int, port: int, model_path: str, out_dir: str) -> None:
    """One of two ranks (torch.multiprocessing.spawn): rank 1's loss is NaN (its gradient
    finite), rank 0's is finite. Writes (weights and optimizer state unchanged?, skipped)."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        update = _local(AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32))
        update.update(_batch(rank))
        if rank == 1:
            real = update.core.loss

            def nan_loss(batch, fwd_out):
                loss, parts = real(batch, fwd_out)
                return loss + torch.tensor(NAN), parts

            update.core.loss = nan_loss
        before = _snapshot(update)
        out = update.update(_batch(10 + rank))
        torch.save({"unchanged": _same(before, _snapshot(update)), "skipped": out["skipped_steps"]},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_one_ranks_nan_loss_skips_the_step_on_every_rank(path, tmp_path):
    """Without the all-reduced flag rank 0 (finite loss and gradient) would step while rank 1
    skipped: the ranks' weights would differ from then on."""
    import torch.multiprocessing as mp

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_rank, args=(_free_port(), str(path), str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert results == [{"unchanged": True, "skipped": 1.0}] * 2, results
