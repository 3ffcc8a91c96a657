"""The async agent loop (``rollout_mode="async"``, env_runners/async_rollout.py): the same
trajectories as the turn-synchronous loop on a deterministic engine, tool timeouts, a raising env,
concurrent tool calls, per-request seeds, engine failures, and the real HF engine through its
batching scheduler."""
from __future__ import annotations

import dataclasses
import gc
import threading

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from agent_loop_stubs import ConcurrencyEnv, PromptFnEngine, ScriptEnv, StuckEnv, new_counter
from rllib_spear.env_runners.async_rollout import AsyncMultiTurnRollout, request_seed, timeout_observation
from rllib_spear.env_runners.engines.base import GenerationOutput, SamplingConfig
from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig
from rllib_spear.env_runners.rollout_modes import make_rollout
from rllib_spear.models.factory import tiny_model_path


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tiny_model_path())


def _config(**kw):
    return RolloutConfig(**{"max_turns": 5, "max_model_len": 512, "max_response_tokens": 400, **kw})


def _same(t):
    """A trajectory without its random id (everything else must match)."""
    return dataclasses.replace(t, traj_id="")


def _tasks():
    modes = [("a", 1, None), ("b", 3, None), ("c", 5, None), ("d", 4, "raise"), ("e", 2, None)]
    return [{"uid": u, "question": f"question {u}", "turns": n, **({"mode": m} if m else {})} for u, n, m in modes]


@pytest.mark.parametrize("budget", [400, 90])
def test_same_trajectories_as_turn_sync_on_a_deterministic_engine(tok, budget):
    """Same prompts, an engine whose output is a function of the prompt: both modes give the same
    segments, log-probs, rewards, records, errors and truncations (budget 90 cuts some short)."""
    def run(mode):
        eng = PromptFnEngine(tok.eos_token_id)
        ro = make_rollout(mode, engine=eng, tokenizer=tok, env_factory=ScriptEnv,
                          sampling=SamplingConfig(max_new_tokens=16, seed=11),
                          config=_config(max_response_tokens=budget))
        trajs, stats = ro.run(_tasks(), 3, policy_version=4)
        eng.shutdown()
        return trajs, stats

    sync, s_sync = run("turn_sync")
    asy, s_async = run("async")
    assert [_same(t) for t in asy] == [_same(t) for t in sync]
    assert s_async.generated_tokens == s_sync.generated_tokens
    assert s_async.rollout_errors == s_sync.rollout_errors == 3  # the "raise" task's group only
    assert s_async.engine_calls == sum(t.num_steps for t in asy)  # one request per turn
    # the test is not vacuous: one task failed; the episodes differ in length, or budgets truncate
    assert {t.uid for t in sync if t.rollout.error} == {"d"}
    assert all(t.rollout.error_stage == "env_step" and "KeyError" in t.rollout.error for t in sync if t.uid == "d")
    if budget == 400:
        assert len({t.num_steps for t in sync}) > 2 and not any(t.rollout.reached_max_length for t in sync)
    else:
        assert any(t.rollout.reached_max_length for t in sync) and not all(t.truncated for t in sync)


def test_a_raising_env_ends_only_its_episode(tok):
    eng = PromptFnEngine(tok.eos_token_id)
    ro = AsyncMultiTurnRollout(eng, tok, ScriptEnv, SamplingConfig(max_new_tokens=16, seed=1), _config())
    tasks = [{"uid": "bad", "question": "q", "turns": 4, "mode": "raise"},
             {"uid": "ok", "question": "q2", "turns": 3}]
    trajs, stats = ro.run(tasks, 2)
    bad, ok = trajs[:2], trajs[2:]
    for t in bad:
        assert t.truncated and t.num_steps == 2 and t.rollout.error_stage == "env_step"
        assert t.rollout.env_error == repr(KeyError("tool crashed"))
    for t in ok:
        assert t.rollout.error is None and not t.truncated and t.num_steps == 3
    assert stats.rollout_errors == 2
    eng.shutdown()


def _decoded_observations(tok, traj):
    return [tok.decode(s.token_ids) for s in traj.segments if s.kind == "observation"]


def test_a_timed_out_tool_call_becomes_an_observation_and_the_episode_goes_on(tok):
    """The stuck call is abandoned; the model reads the timeout, generates its next turn; the next
    step waits for the stuck call (never two calls on one env) and records its late reward."""
    release = threading.Event()
    eng = PromptFnEngine(tok.eos_token_id)
    envs = []

    def factory():
        envs.append(StuckEnv(release, turns=3, late_reward=0.5))
        return envs[-1]

    # the model "reads" the timeout observation: the stuck call may return now
    eng.on_generate = lambda prompts: [release.set() for p in prompts if "timed out" in tok.decode(p)]
    ro = AsyncMultiTurnRollout(eng, tok, factory, SamplingConfig(max_new_tokens=8, seed=2), _config(),
                               tool_timeout_s=0.5)
    try:
        trajs, stats = ro.run([{"uid": "s", "question": "q", "stuck": True}, {"uid": "f", "question": "q"}], 1)
    finally:
        release.set()
    stuck, fine = trajs
    obs = _decoded_observations(tok, stuck)
    assert timeout_observation(0.5) == "tool call timed out after 0.5 s"
    assert "tool call timed out after 0.5 s" in obs[0] and "fast" in obs[1]
    assert stuck.num_steps == 3 and not stuck.truncated and stuck.rollout.error is None
    # the late call's reward replaces the timeout's 0 (the env counted it); outcome taken off the last
    assert stuck.step_rewards == [0.5, 0.0, 0.0] and stuck.outcome_reward == 1.0
    assert fine.rollout.error is None and "timed out" not in " ".join(_decoded_observations(tok, fine))
    assert stats.tool_timeouts == 1 and stats.tool_calls_abandoned == 1
    assert not any(e.overlap for e in envs)
    assert len(ro._env_pool) == 2  # both envs are trusted again and reused
    eng.shutdown()


def test_an_episode_ending_with_its_call_still_stuck_drops_its_env(tok):
    release = threading.Event()
    eng = PromptFnEngine(tok.eos_token_id)
    envs = []

    def factory():
        envs.append(StuckEnv(release, turns=5))
        return envs[-1]

    ro = AsyncMultiTurnRollout(eng, tok, factory, SamplingConfig(max_new_tokens=8, seed=2),
                               _config(max_turns=2), tool_timeout_s=0.5)
    try:
        trajs, stats = ro.run([{"uid": "s", "question": "q", "stuck": True}, {"uid": "f", "question": "q"}], 1)
        stuck, fine = trajs
        # turn 2 waited for the stuck call and timed out too: its text never reached the env
        assert [o.count("timed out after 0.5 s") for o in _decoded_observations(tok, stuck)] == [1]
        assert stuck.num_steps == 2 and stuck.truncated
        assert stuck.rollout.error_stage == "episode_stats" and "ToolCallStillRunning" in stuck.rollout.error
        assert stuck.stats.success is False
        assert stats.tool_timeouts == 2 and stats.tool_calls_abandoned == 1
        assert envs[0].entered == 1 and fine.rollout.error is None
        assert ro._env_pool == [envs[1]]  # the stuck env is never reused
    finally:
        release.set()
    eng.shutdown()


@pytest.mark.parametrize("concurrency", [None, 1])
def test_tool_calls_of_different_episodes_overlap(tok, concurrency):
    counter = new_counter()
    eng = PromptFnEngine(tok.eos_token_id)
    loop_threads = set()

    class Env(ConcurrencyEnv):
        def step(self, text):
            loop_threads.add(threading.current_thread().name)
            return super().step(text)

    ro = AsyncMultiTurnRollout(eng, tok, lambda: Env(counter, delay=0.15), SamplingConfig(max_new_tokens=8, seed=3),
                               _config(), tool_concurrency=concurrency)
    trajs, stats = ro.run([{"uid": "a", "question": "q"}, {"uid": "b", "question": "r"}], 2)
    assert all(t.rollout.error is None and t.num_steps == 2 for t in trajs)
    assert not any(name.startswith("rllib-spear-agent-loop") for name in loop_threads)  # never on the loop
    if concurrency is None:
        assert counter["max"] >= 2 and stats.tool_calls_concurrent_max >= 2
    else:
        assert counter["max"] == 1 and stats.tool_calls_concurrent_max == 1
    assert stats.concurrent_episodes_max == 4 and 0 < stats.concurrent_episodes_mean <= 4
    assert len(stats.tool_latencies_s) == 8  # 4 episodes x 2 steps
    eng.shutdown()


def test_every_turn_is_one_batch_and_the_tool_pool_is_kept_across_calls(tok):
    """The episodes are members of the engine's batching scheduler: with instant tools and a
    gather window far longer than a turn, each turn of every episode still goes in one batch,
    closed because every running episode waited (engines/batching.py). The env steps' pool is
    the rollout's: the second call starts no thread, its counters are its own, and the pool shuts
    down with the rollout."""
    counter = new_counter()
    eng = PromptFnEngine(tok.eos_token_id)
    eng.gather_window_s, eng.max_gather_s = 30.0, 60.0
    ro = AsyncMultiTurnRollout(eng, tok, lambda: ConcurrencyEnv(counter, delay=0.0, turns=3),
                               SamplingConfig(max_new_tokens=8, seed=3), _config())
    tasks = [{"uid": u, "question": u} for u in "abc"]
    trajs, stats = ro.run(tasks, 2)
    sched = eng.batching_scheduler()
    assert all(t.rollout.error is None and t.num_steps == 3 for t in trajs)
    assert sched.batches == 3 and sched.batches_of_all_members == 3 and sched.max_batch == 6

    pool = ro._pool
    assert stats.tool_calls_concurrent_max >= 1 and pool.size == pool._workers == 6
    trajs, stats = ro.run(tasks[:1], 1)
    assert ro._pool is pool and pool._workers == 6 and stats.tool_calls_concurrent_max == 1
    assert trajs[0].num_steps == 3 and sched.batches == 6
    del ro, trajs
    gc.collect()
    assert pool._closed  # the rollout's finalizer shut it down
    eng.shutdown()


class SeedRecordingEngine(PromptFnEngine):
    """Overrides ``agenerate`` (as an async engine does) and records each request's seed."""

    def __init__(self, eos):
        super().__init__(eos)
        self.seeds = []

    async def agenerate(self, prompt, sampling, max_new_tokens, seed=None):
        self.seeds.append(seed)
        return self.generate([prompt], sampling, [max_new_tokens])[0]


def test_request_seeds_come_from_call_seed_episode_and_turn(tok):
    def seeds(call_seed):
        eng = SeedRecordingEngine(tok.eos_token_id)
        ro = AsyncMultiTurnRollout(eng, tok, ScriptEnv, SamplingConfig(max_new_tokens=8, seed=call_seed), _config())
        trajs, _ = ro.run([{"uid": "a", "question": "q", "turns": 2}, {"uid": "b", "question": "r", "turns": 3}], 2)
        want = {request_seed(call_seed, i, turn) for i, t in enumerate(trajs) for turn in range(t.num_steps)}
        assert set(eng.seeds) == want and len(want) == len(eng.seeds) == 10
        return set(eng.seeds)

    assert seeds(5) == seeds(5)
    assert seeds(5).isdisjoint(seeds(6))
    assert request_seed(None, 0, 0) is None
    assert 0 <= request_seed(2**70, 3, 1) < 2**63


class FailingEngine(PromptFnEngine):
    def generate(self, prompts, sampling, max_new_tokens=None):
        if len(self.batches) >= 1:
            self.batches.append(len(prompts))
            raise RuntimeError("engine died")
        return super().generate(prompts, sampling, max_new_tokens)


def test_an_engine_failure_ends_the_call_as_in_turn_sync(tok):
    for mode in ("turn_sync", "async"):
        eng = FailingEngine(tok.eos_token_id)
        ro = make_rollout(mode, engine=eng, tokenizer=tok, env_factory=ScriptEnv,
                          sampling=SamplingConfig(max_new_tokens=8, seed=3), config=_config())
        with pytest.raises(RuntimeError, match="engine died"):
            ro.run([{"uid": "a", "question": "q", "turns": 3}], 2)
        eng.shutdown()
    # the agent loop is still usable after a failed call
    eng = PromptFnEngine(tok.eos_token_id)
    ro = AsyncMultiTurnRollout(eng, tok, ScriptEnv, SamplingConfig(max_new_tokens=8, seed=3), _config())
    assert len(ro.run([{"uid": "a", "question": "q", "turns": 2}], 2)[0]) == 2
    eng.shutdown()


def test_bad_loop_arguments_name_the_knob(tok):
    eng = PromptFnEngine(tok.eos_token_id)
    for kw, name in [({"tool_concurrency": 0}, "tool_concurrency"), ({"tool_concurrency": True}, "tool_concurrency"),
                     ({"tool_timeout_s": 0}, "tool_timeout_s"), ({"tool_timeout_s": -1.0}, "tool_timeout_s")]:
        with pytest.raises(ValueError, match=name):
            AsyncMultiTurnRollout(eng, tok, ScriptEnv, SamplingConfig(), _config(), **kw)
    with pytest.raises(ValueError, match="unknown rollout mode 'fast'"):
        make_rollout("fast", engine=eng, tokenizer=tok, env_factory=ScriptEnv, sampling=SamplingConfig())
    assert type(make_rollout("turn_sync", engine=eng, tokenizer=tok, env_factory=ScriptEnv,
                             sampling=SamplingConfig())) is MultiTurnRollout


def test_hf_engine_async_logprobs_match_trainer_rescoring():
    """Token-in/token-out through the HF engine's batching scheduler: the behaviour log-probs of
    every assistant token are the model's, the masks as in turn_sync."""
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.models.logprobs import token_logprobs

    eng = HFEngine(tiny_model_path())
    ro = AsyncMultiTurnRollout(eng, eng.tokenizer, ScriptEnv, SamplingConfig(max_new_tokens=12, seed=3), _config())
    trajs, stats = ro.run([{"uid": "a", "question": "q", "turns": 3}, {"uid": "b", "question": "r", "turns": 2}], 2)
    assert stats.generated_tokens == sum(t.num_generated_tokens for t in trajs) > 0
    for t in trajs:
        ids = torch.tensor(t.input_ids())[None]
        lp = token_logprobs(eng.model, ids, torch.ones_like(ids))[0].detach().numpy()
        m = t.loss_mask() > 0
        np.testing.assert_allclose(lp[m], t.behaviour_logprobs()[m], atol=2e-4)
    sched = eng.batching_scheduler()
    assert sched.requests == stats.engine_calls and sched.batches <= sched.requests
    eng.shutdown()
    assert not sched.running


def test_outputs_of_an_async_engine_may_be_any_generation_output(tok):
    """An engine overriding agenerate returns GenerationOutput objects the loop records as is."""
    class Fixed(PromptFnEngine):
        async def agenerate(self, prompt, sampling, max_new_tokens, seed=None):
            return GenerationOutput([20, 21, self.eos], [-0.5, -0.25, -0.125], "stop")

    eng = Fixed(tok.eos_token_id)
    ro = AsyncMultiTurnRollout(eng, tok, ScriptEnv, SamplingConfig(max_new_tokens=8, seed=3), _config())
    (t,), _ = ro.run([{"uid": "a", "question": "q", "turns": 1}], 1)
    assert t.segments[1].token_ids == [20, 21, tok.eos_token_id] and t.segments[1].logprobs == [-0.5, -0.25, -0.125]
