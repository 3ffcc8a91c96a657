"""``LLMEnvRunner.evaluate_groups`` (in this process, HF engine, the embedded policy): per-call
sampling parameters for evaluation that leave the runner's training state as it was."""
from __future__ import annotations

import dataclasses

import pytest

import rllib_spear  # noqa: F401
from rllib_spear import GRPOConfig


@pytest.fixture(scope="module")
def runner():
    from rllib_spear.env_runners.llm_env_runner import LLMEnvRunner

    cfg = (GRPOConfig().environment("search_qa")
           .env_runners(max_new_tokens=24, max_turns=2, max_model_len=512, max_response_tokens=256)
           .rl_module(model_config={"model_path": "embedded"}).debugging(seed=0))
    r = LLMEnvRunner(config=cfg)
    yield r
    r.stop()


@pytest.fixture(scope="module")
def tasks():
    from rllib_spear.envs import load_tasks

    return load_tasks("search_qa", "test")[:2]


def _tokens(out):
    return [t.assistant_token_ids() for t in out["trajectories"]]


def test_evaluation_leaves_training_state_alone(runner, tasks):
    runner.metrics.reduce()  # start from empty counters
    runner.sample_groups(tasks=tasks, group_size=2)
    calls, sampling = runner._sample_calls, dataclasses.replace(runner._rollout.sampling)
    pool = list(runner._rollout._env_pool)
    runner.evaluate_groups(tasks=tasks, group_size=3, sampling={"temperature": 1.0, "top_p": 0.6})
    runner.evaluate_groups(tasks=tasks, group_size=1, sampling={"temperature": 0.0, "max_new_tokens": 4})
    assert runner._sample_calls == calls, "the training seed sequence did not move"
    assert runner._rollout.sampling == sampling, "training samples with its own parameters"
    assert runner._rollout._env_pool == pool, "evaluation uses its own environments"
    assert runner.metrics.reduce()["num_episodes"].peek() == 4, "only the 2 x 2 training episodes are counted"


def test_greedy_evaluation_repeats_and_respects_the_overrides(runner, tasks):
    a = runner.evaluate_groups(tasks=tasks, group_size=2, sampling={"temperature": 0.0})
    b = runner.evaluate_groups(tasks=tasks, group_size=2, sampling={"temperature": 0.0, "top_k": 5})
    assert _tokens(a) == _tokens(b), "greedy: the same episodes on every call"
    for ta, tb in zip(a["trajectories"][0::2], a["trajectories"][1::2]):
        assert ta.uid == tb.uid and ta.assistant_token_ids() == tb.assistant_token_ids()
    short = runner.evaluate_groups(tasks=tasks, group_size=1, sampling={"temperature": 0.0, "max_new_tokens": 3})
    assert all(len(turn) <= 3 for traj in _tokens(short) for turn in traj)
    assert {t.task["data_source"] for t in a["trajectories"]} <= {"fictional_1hop", "fictional_2hop"}


def test_unknown_or_bad_sampling_is_refused(runner, tasks):
    with pytest.raises(ValueError, match="unknown sampling keys"):
        runner.evaluate_groups(tasks=tasks, group_size=1, sampling={"temprature": 0.0})
    with pytest.raises(ValueError, match="top_p"):
        runner.evaluate_groups(tasks=tasks, group_size=1, sampling={"top_p": 0.0})


def test_a_given_sampling_seed_repeats_whatever_the_call_count(runner, tasks):
    """The driver's per-draw seed (``rollouts.sampling_seed``) fixes the episodes: a restarted
    runner, whose call counter starts again at 0, samples a draw as the original did."""
    a = runner.sample_groups(tasks=tasks, group_size=2, seed=1234)
    runner.sample_groups(tasks=tasks, group_size=2)  # the call counter moves on
    b = runner.sample_groups(tasks=tasks, group_size=2, seed=1234)
    c = runner.sample_groups(tasks=tasks, group_size=2, seed=99)
    assert _tokens(a) == _tokens(b)
    assert _tokens(a) != _tokens(c)
