"""Evaluation seeds after a runner restart (LLMEnvRunner.evaluate_groups on a model-free runner,
evaluation.sample_for_evaluation on a fake group): the seed key is the driver's evaluation
counter, so a restarted runner, whose own call counter starts again at 0, does not repeat the
seeds of earlier evaluations (docs/design.md "Validation")."""
from __future__ import annotations

from types import SimpleNamespace

from rllib_spear.pipelines.runner_requests import sample_for_evaluation
from rllib_spear.env_runners.engines.base import SamplingConfig
from rllib_spear.env_runners.llm_env_runner import LLMEnvRunner
from rllib_spear.weight_streaming import EngineWeights, WeightReceivers


class _EvalRollout:
    def __init__(self):
        self.sampling, self.seeds = None, []

    def run(self, tasks, group_size, policy_version):
        self.seeds.append(self.sampling.seed)
        return [], None


def _runner(worker_index=1):
    """A runner as built, without an engine: its evaluation rollout records each call's seed."""
    r = object.__new__(LLMEnvRunner)
    r.config, r.worker_index = SimpleNamespace(seed=7), worker_index
    r.weight_receivers, r._eval_calls = WeightReceivers(EngineWeights(None)), 0
    r._rollout = SimpleNamespace(sampling=SamplingConfig(max_new_tokens=4, seed=0))
    r._eval_rollout = _EvalRollout()
    r._result = lambda trajs, stats: {"trajectories": trajs, "stats": {}}
    return r


class _Group:
    def __init__(self):
        self.runner = _runner()

    def num_remote_env_runners(self):
        return 1

    def healthy_env_runner_ids(self):
        return [1]

    def foreach_env_runner(self, funcs, *, local_env_runner, remote_worker_ids):
        return [f(self.runner) for f in funcs]


def test_a_restarted_runner_does_not_repeat_evaluation_seeds():
    group, seeds = _Group(), []
    tasks = [{"uid": "a", "question": "q"}]
    for key in (1, 2):  # the driver's evaluation counter
        sample_for_evaluation(group, tasks, 1, {}, resync=lambda: 0, eval_key=key)
    seeds += group.runner._eval_rollout.seeds
    group.runner = _runner()  # fault tolerance restarted it: its own counter is 0 again
    sample_for_evaluation(group, tasks, 1, {}, resync=lambda: 0, eval_key=3)
    seeds += group.runner._eval_rollout.seeds
    assert len(seeds) == 3 and len(set(seeds)) == 3, seeds
    # the same key on the same runner index gives the same seed (a restored run repeats its own)
    again = _runner()
    again.evaluate_groups(tasks=tasks, group_size=1, eval_key=2)
    assert again._eval_rollout.seeds == [seeds[1]]


def test_the_local_runner_gets_the_key_too():
    runner = _runner(worker_index=0)
    group = SimpleNamespace(num_remote_env_runners=lambda: 0, local_env_runner=runner)
    sample_for_evaluation(group, [{"uid": "a"}], 1, {}, resync=lambda: 0, eval_key=5)
    fresh = _runner(worker_index=0)
    fresh.evaluate_groups(tasks=[{"uid": "a"}], group_size=1, eval_key=5)
    assert runner._eval_rollout.seeds == fresh._eval_rollout.seeds
    fresh.evaluate_groups(tasks=[{"uid": "a"}], group_size=1, eval_key=6)
    assert fresh._eval_rollout.seeds[0] != fresh._eval_rollout.seeds[1]
