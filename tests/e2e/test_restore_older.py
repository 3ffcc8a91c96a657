"""Restoring an older checkpoint into a live algorithm restores its weights (docs/design.md
"Restoring an older checkpoint"). RLlib's Learner.set_state keeps the live weights when the state's
weights version is lower, and only ever raises the version (never to 0): without the learner's own
set_state, an older state set into a live algorithm left the newer weights under the old optimizer
state, and a restored version-0 checkpoint kept the runners on the newer weights."""
from __future__ import annotations

import copy

import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import GRPOConfig

from e2e_helpers import recorder, small_config, with_trajectory_hook


def _learner_state(algo, component: str) -> dict:
    from ray.rllib.core import COMPONENT_LEARNER

    state = algo.learner_group.get_state(components=f"{COMPONENT_LEARNER}/{component}")
    return state[COMPONENT_LEARNER][component]


def _weights(algo) -> dict[str, torch.Tensor]:
    from ray.rllib.core import COMPONENT_RL_MODULE

    (sd,) = _learner_state(algo, COMPONENT_RL_MODULE).values()
    return {k: torch.as_tensor(v).clone() for k, v in sd.items()}


def _flat(tree, prefix="") -> dict:
    """Every leaf of a nested state (the optimizer's), by its path, as a tensor where it is one."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}/{key}").items()}
    return {prefix: torch.as_tensor(tree) if hasattr(tree, "shape") else tree}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def _runner_engines(algo) -> list[tuple[int, dict]]:
    """(weights version, the HF engine's weights) of every runner."""
    def read(runner):
        return runner.weights_version, {k: v.detach().clone() for k, v in runner.engine.model.state_dict().items()}

    return algo.env_runner_group.foreach_env_runner(read, local_env_runner=False)


def _check_restored(algo, version: int, weights: dict, optimizer: dict | None) -> None:
    """The learner holds ``weights`` (and ``optimizer``) at ``version``; every runner's engine too."""
    from ray.rllib.core import COMPONENT_OPTIMIZER

    from rllib_spear.env_runners.llm_env_runner import hf_state_dict_from_module_state

    assert algo.policy_version == version and algo.algo_step == version
    restored = _weights(algo)
    assert restored.keys() == weights.keys()
    changed = [k for k in weights if not torch.equal(weights[k], restored[k])]
    assert not changed, f"the learner kept the newer weights of {len(changed)} tensors, e.g. {changed[:3]}"
    if optimizer is not None:
        assert _same(_flat(_learner_state(algo, COMPONENT_OPTIMIZER)), optimizer), "the checkpoint's optimizer state"
    learner_version = next(r.get() for r in algo.learner_group.foreach_learner(
        lambda learner: learner.weight_senders.weights.version()).result_or_errors)
    assert learner_version == version, "the learner's weights version is the checkpoint's"
    want = hf_state_dict_from_module_state(weights)
    for runner_version, engine in _runner_engines(algo):
        assert runner_version == version
        common = want.keys() & engine.keys()
        assert common, "the engine's weights are named as the HF model's"
        stale = [k for k in sorted(common) if not torch.equal(engine[k].to(want[k].dtype), want[k])]
        assert not stale, f"the runner's engine kept other weights for {len(stale)} tensors, e.g. {stale[:3]}"


def test_restoring_an_older_checkpoint_restores_its_weights(ray_session, tiny_model, tmp_path):
    from ray.rllib.core import COMPONENT_OPTIMIZER

    hook, _ = recorder(synthetic_rewards=True)  # rewards that differ: the weights move every update
    algo = with_trajectory_hook(small_config(GRPOConfig, tiny_model), hook).build_algo()
    try:
        w0 = _weights(algo)
        ckpt_0 = algo.save_to_path(str(tmp_path / "ckpt_0"))  # before any update: version 0
        algo.train()
        w1, opt1 = _weights(algo), _flat(_learner_state(algo, COMPONENT_OPTIMIZER))
        ckpt_1 = algo.save_to_path(str(tmp_path / "ckpt_1"))
        state_1 = algo.get_state()
        for _ in range(2):
            algo.train()
        assert algo.policy_version == 3
        assert any(not torch.equal(w1[k], v) for k, v in _weights(algo).items()), "the learner trained on"

        algo.restore_from_path(ckpt_1)  # from the folder: RLlib restores the module as a component
        _check_restored(algo, 1, w1, opt1)
        algo.train()
        assert algo.policy_version == 2, "training goes on from the restored state"

        algo.set_state(state_1)  # in memory: RLlib's Learner.set_state kept the version-2 weights
        _check_restored(algo, 1, w1, opt1)

        algo.restore_from_path(ckpt_0)  # version 0: RLlib kept the learner's version 1, the runners theirs
        _check_restored(algo, 0, w0, None)
        algo.train()
        assert algo.policy_version == 1

        # the same version, other weights (another run's checkpoint of that iteration): the
        # runners' version check alone would skip them and sample on the old weights
        from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_LEARNER_GROUP, COMPONENT_RL_MODULE

        other = copy.deepcopy(state_1)
        (module,) = other[COMPONENT_LEARNER_GROUP][COMPONENT_LEARNER][COMPONENT_RL_MODULE].values()
        name = sorted(module)[0]
        module[name] = module[name] + 0.125
        w_other = {k: torch.as_tensor(v).clone() for k, v in module.items()}
        algo.set_state(other)
        _check_restored(algo, 1, w_other, None)
    finally:
        algo.stop()
