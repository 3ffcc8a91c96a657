"""Learner -> env-runner weight sync with a version check (docs/design.md, "One training iteration")."""
from __future__ import annotations

from typing import Any

__all__ = ["sync_weights"]


def _learner_weights(learner_group: Any, sharding: str) -> dict[str, Any]:
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE

    if sharding == "fsdp":
        # Every rank gathers its shards one tensor at a time; rank 0 returns the weights.
        results = learner_group.foreach_learner(lambda learner: learner.engine_state())
        errors = [r.get() for r in results.result_or_errors if not r.ok]
        if errors:
            raise errors[0]
        return next(s for s in (r.get() for r in results.result_or_errors) if s is not None)
    return learner_group.get_state(components=COMPONENT_LEARNER + "/" + COMPONENT_RL_MODULE,
                                   inference_only=True)[COMPONENT_LEARNER]


def sync_weights(learner_group: Any, env_runner_group: Any, sharding: str) -> int:
    """Push the learners' weights to every runner, check each runner's version, return it.

    RLlib's ``sync_weights`` is fire-and-forget with a cap on requests in flight, so a sync can
    be silently dropped; here each runner applies the state (torch tensors, never RLlib's
    float32-numpy conversion) synchronously and returns its WEIGHTS_SEQ_NO. A runner that
    reports another version fails the step loudly.
    """
    import ray
    from ray.rllib.core import COMPONENT_RL_MODULE
    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

    state = _learner_weights(learner_group, sharding)
    payload = {COMPONENT_RL_MODULE: state[COMPONENT_RL_MODULE], WEIGHTS_SEQ_NO: int(state.get(WEIGHTS_SEQ_NO, 0))}
    expected = payload[WEIGHTS_SEQ_NO]
    if env_runner_group.num_remote_env_runners() == 0:
        env_runner_group.local_env_runner.set_state(payload)
        versions = [env_runner_group.local_env_runner.weights_version]
    else:
        ref = ray.put(payload)

        def apply(runner, ref=ref):
            runner.set_state(ray.get(ref))
            return runner.weights_version

        versions = env_runner_group.foreach_env_runner(apply, local_env_runner=False)
    if any(v != expected for v in versions):
        raise RuntimeError(f"weight sync: runners report versions {versions}, expected {expected}")
    return expected
