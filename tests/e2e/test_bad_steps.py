"""Bad steps in every learner layout (docs/design.md "Fault tolerance"), on CPU over gloo: the single
learner in the driver, one remote learner, two DDP learners and two FSDP2 learners.

Each run trains four iterations of sampled groups; a TrajectoryCallback gives them seeded
synthetic rewards (so a finite step moves the weights) and, on iterations 1, 3 and 4, makes the
behaviour log-probs of the first trajectory NaN: one learner's rows, whose loss and gradient are
then NaN (under DDP and FSDP the other rank's own rows are finite). Through the PPO ratio's clamp
the NaN rows get a zero gradient: the loss alone is NaN, on one rank, and only the all-reduced
flag of ``UpdateCore.step_or_skip`` (learner/core.py) makes the other ranks skip. With truncated IS
(``tis_cap``, the "fsdp2_tis" case) the NaN enters the detached IS weight, and the gradients
(reduce-scattered into every rank's shards) are NaN too. Shown for each layout:

* iteration 1: the optimizer step is skipped on every rank (weights and optimizer state equal
  before and after, rank by rank) and counted (``learners/default_policy/skipped_steps`` = 1);
* iteration 2 (finite): the step trains, and the ranks agree;
* iterations 3 and 4: with ``max_consecutive_skipped_steps=2`` the second skipped step in a row
  stops the run with an error naming the knob.
"""
from __future__ import annotations

import pytest
import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig

from e2e_helpers import small_config, with_trajectory_hook

#: name -> (num_learners, sharding, training() extras)
LAYOUTS = {"local": (0, "ddp", {}), "one_remote": (1, "ddp", {}), "ddp2": (2, "ddp", {}),
           "fsdp2": (2, "fsdp", {}), "fsdp2_tis": (2, "fsdp", {"tis_cap": 2.0})}


def _config(tiny_model, num_learners: int, sharding: str, training: dict):
    cfg = (small_config(SPEARConfig, tiny_model, sil_enabled=False, tool_reward_schedule="none",
                        loss_mode="vanilla", entropy_coeff=0.0, max_consecutive_skipped_steps=2, **training)
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.25)
           .resources(num_cpus_for_main_process=0.25)
           .learners(sharding=sharding))
    if num_learners:
        cfg = cfg.learners(num_learners=num_learners, num_cpus_per_learner=0.5)
    return cfg


def _nan_hook(state: dict):
    """Seeded synthetic rewards on every batch; while ``state["nan"]``, the first trajectory's
    behaviour log-probs become NaN (the ratio, the loss and the gradient of its learner follow)."""
    import numpy as np

    def hook(trajs, stats, algorithm):
        rng = np.random.default_rng(123 + state["calls"])
        state["calls"] += 1
        for t in trajs:
            t.outcome_reward = float(rng.choice([0.0, 0.25, 1.0]))
        if state["nan"]:
            for seg in trajs[0].segments:
                if seg.kind == "assistant":
                    seg.logprobs = [float("nan")] * len(seg.logprobs)

    return hook


def _rank_states(algo) -> list[tuple[dict, list]]:
    """Every learner rank's own (weights, optimizer state tensors): FSDP ranks their shards."""
    def own(learner):
        from torch.distributed.tensor import DTensor

        def local(t):
            return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()

        weights = {k: local(v) for k, v in learner.module["default_policy"].state_dict().items()}
        optim = [{k: local(v) for k, v in s.items() if isinstance(v, torch.Tensor)}
                 for o in learner.all_optimizers() for s in o.state.values()]
        return weights, optim

    return [r.get() for r in algo.learner_group.foreach_learner(own).result_or_errors]


def _same(a: tuple[dict, list], b: tuple[dict, list]) -> bool:
    (wa, oa), (wb, ob) = a, b
    return (wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
            and len(oa) == len(ob) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                           for x, y in zip(oa, ob)))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_nan_step_is_skipped_on_every_rank_counted_and_stops_the_run(ray_session, tiny_model, layout):
    num_learners, sharding, training = LAYOUTS[layout]
    state = {"nan": True, "calls": 0}
    algo = with_trajectory_hook(_config(tiny_model, num_learners, sharding, training), _nan_hook(state)).build_algo()
    try:
        before = _rank_states(algo)
        assert len(before) == max(num_learners, 1)
        r1 = algo.train()["learners"]["default_policy"]
        after = _rank_states(algo)
        print(f"\n{layout}: iteration 1 (NaN): skipped_steps {r1.get('skipped_steps')}, "
              f"num_optimizer_steps {r1.get('num_optimizer_steps')}, unchanged per rank "
              f"{[_same(b, a) for b, a in zip(before, after)]}")
        assert all(_same(b, a) for b, a in zip(before, after)), "a rank stepped on the NaN batch"
        assert r1["skipped_steps"] == 1  # one step skipped: counted once, not once per rank

        state["nan"] = False
        r2 = algo.train()["learners"]["default_policy"]
        trained = _rank_states(algo)
        assert r2["skipped_steps"] == 0
        assert r2["num_optimizer_steps"] == 1  # one global step, counted once, not once per rank
        assert not any(_same(a, t) for a, t in zip(after, trained)), "the finite step did not train every rank"
        if sharding == "ddp" and num_learners == 2:  # replicas: the ranks hold the same weights
            assert _same(trained[0], trained[1])

        state["nan"] = True
        assert algo.train()["learners"]["default_policy"]["skipped_steps"] == 1  # 1 in a row
        with pytest.raises(Exception, match="max_consecutive_skipped_steps=2") as err:
            algo.train()  # 2 in a row
        print(f"{layout}: stopped with {type(err.value).__name__}: {str(err.value).splitlines()[-1][:200]}")
    finally:
        algo.stop()
