"""The watchdogs of docs/design.md "Fault tolerance": an env step past ``step_timeout_s`` ends only
its episode in the turn-synchronous loop (counted, its env never reused); an engine call past
``generation_timeout_s`` raises a ``GenerationTimeout`` naming the knob within the limit instead of
hanging (both loops); healthy runs are unchanged; the config keys and their validation."""
from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from transformers import AutoTokenizer

from agent_loop_stubs import PromptFnEngine, ScriptEnv, StuckEnv
from rllib_spear.env_runners.async_rollout import DEFAULT_TOOL_TIMEOUT_S, AsyncMultiTurnRollout
from rllib_spear.env_runners.engines.base import (
    GenerationTimeout, SamplingConfig, TimedEngine, with_generation_timeout,
)
from rllib_spear.env_runners.rollout import (
    DEFAULT_STEP_TIMEOUT_S, EnvStepTimeout, MultiTurnRollout, RolloutConfig, resolve_step_timeout,
)
from rllib_spear.env_runners.tool_pool import ToolPool
from rllib_spear.models.factory import tiny_model_path

LIMIT_S = 0.3  # the watchdogs' limit in these tests: far below the stubs' 60 s hangs


def _config() -> RolloutConfig:
    return RolloutConfig(max_turns=5, max_model_len=512, max_response_tokens=400)


def _same(t):
    """A trajectory without its random id."""
    return dataclasses.replace(t, traj_id="")


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tiny_model_path())


@pytest.fixture
def release():
    ev = threading.Event()
    yield ev
    ev.set()  # let every abandoned call finish


# ---------------------------------------------------------------- the env-step watchdog (turn_sync)
def test_a_hung_env_step_ends_only_its_episode_and_is_counted(tok, release):
    envs: list[StuckEnv] = []

    def factory():
        envs.append(StuckEnv(release, turns=3))
        return envs[-1]

    ro = MultiTurnRollout(PromptFnEngine(tok.eos_token_id), tok, factory, SamplingConfig(max_new_tokens=16, seed=3),
                          _config(), step_timeout_s=LIMIT_S)
    tasks = [{"uid": "stuck", "question": "q1", "stuck": True}, {"uid": "ok", "question": "q2"}]
    t0 = time.perf_counter()
    trajs, stats = ro.run(tasks, 2)
    assert time.perf_counter() - t0 < 10 * LIMIT_S + 5  # not the 60 s the stuck step would take

    stuck, ok = trajs[:2], trajs[2:]
    for t in stuck:
        assert t.truncated and t.num_steps == 1 and t.rollout.error_stage == "env_step"
        assert t.rollout.error.startswith("EnvStepTimeout") and "step_timeout_s=0.3" in t.rollout.error
        assert not t.stats.success  # its env was never read
    for t in ok:
        assert t.rollout.error is None and not t.truncated and t.num_steps == 3
    assert stats.step_timeouts == 2 and stats.tool_calls_abandoned == 2 and stats.rollout_errors == 2
    assert stats.loop_metrics()["step_timeouts"] == 2.0
    assert stats.tool_timeouts == 0  # that counter is the async loop's (a timeout observation)

    # the stuck envs are dropped: the next call never reuses them, even once their step returned
    stuck_envs = {id(e) for e in envs if e.task.get("stuck")}
    assert len(stuck_envs) == 2 and not stuck_envs & {id(e) for e in ro._env_pool}
    release.set()
    trajs2, stats2 = ro.run([{"uid": "again", "question": "q3"}], 4)
    assert stats2.step_timeouts == 0 and all(t.rollout.error is None for t in trajs2)
    assert not any(e.overlap for e in envs)


def test_the_watchdog_changes_nothing_on_healthy_steps(tok):
    tasks = [{"uid": u, "question": f"question {u}", "turns": n} for u, n in (("a", 1), ("b", 3), ("c", 5))]

    def run(limit):
        ro = MultiTurnRollout(PromptFnEngine(tok.eos_token_id), tok, ScriptEnv,
                              SamplingConfig(max_new_tokens=16, seed=11), _config(), step_timeout_s=limit)
        return ro.run(tasks, 3, policy_version=2)

    (watched, s1), (inline, s2) = run(DEFAULT_STEP_TIMEOUT_S), run(None)
    assert [_same(t) for t in watched] == [_same(t) for t in inline]
    assert s1.step_timeouts == s2.step_timeouts == 0 and s1.rollout_errors == s2.rollout_errors == 0


def test_a_raising_step_on_the_worker_is_an_env_step_error_as_before(tok):
    ro = MultiTurnRollout(PromptFnEngine(tok.eos_token_id), tok, ScriptEnv, SamplingConfig(max_new_tokens=16, seed=1),
                          _config(), step_timeout_s=5.0)
    trajs, stats = ro.run([{"uid": "bad", "question": "q", "turns": 4, "mode": "raise"}], 2)
    assert all(t.rollout.env_error == repr(KeyError("tool crashed")) and t.num_steps == 2 for t in trajs)
    assert stats.step_timeouts == 0 and stats.rollout_errors == 2


def test_tool_pool_call_blocks_for_at_most_the_timeout():
    pool, gate = ToolPool(1, name="test"), threading.Event()
    assert pool.call(lambda x: x + 1, 1, timeout=1.0).result() == 2
    t0 = time.perf_counter()
    call = pool.call(gate.wait, 30, timeout=LIMIT_S)
    assert call.abandoned and time.perf_counter() - t0 < 5
    assert pool.call(lambda: "fresh worker", timeout=1.0).result() == "fresh worker"  # the pool did not shrink
    with pytest.raises(KeyError):
        pool.call({}.__getitem__, "missing", timeout=1.0).result()
    gate.set()
    pool.shutdown()


# ---------------------------------------------------------------- the engine-call watchdog
class _HangingEngine(PromptFnEngine):
    """``generate`` blocks until ``release`` is set once ``hang`` is True."""

    def __init__(self, eos: int, release: threading.Event):
        super().__init__(eos)
        self.release, self.hang = release, False

    def generate(self, prompts, sampling, max_new_tokens=None):
        if self.hang:
            self.release.wait(60)
        return super().generate(prompts, sampling, max_new_tokens)


@pytest.mark.parametrize("loop", ["turn_sync", "async"])
def test_a_hung_engine_call_raises_naming_the_knob_instead_of_hanging(tok, release, loop):
    inner = _HangingEngine(tok.eos_token_id, release)
    seen: list[GenerationTimeout] = []
    eng = with_generation_timeout(inner, LIMIT_S, on_timeout=seen.append)
    cls = MultiTurnRollout if loop == "turn_sync" else AsyncMultiTurnRollout
    ro = cls(eng, tok, ScriptEnv, SamplingConfig(max_new_tokens=16, seed=5), _config())
    tasks = [{"uid": "a", "question": "q", "turns": 2}]
    assert ro.run(tasks, 2)[1].rollout_errors == 0  # healthy first

    inner.hang = True
    t0 = time.perf_counter()
    with pytest.raises(GenerationTimeout, match=r"generation_timeout_s=0\.3"):
        ro.run(tasks, 2)
    assert time.perf_counter() - t0 < 10 * LIMIT_S + 5
    assert len(seen) == 1 and eng.timeouts >= 1 and eng.hung
    # a hung engine is not trusted again: the next call fails at once, on_timeout is not called again
    t0 = time.perf_counter()
    with pytest.raises(GenerationTimeout, match="hung in an earlier call"):
        ro.run(tasks, 1)
    assert time.perf_counter() - t0 < LIMIT_S and len(seen) == 1
    release.set()
    inner.shutdown()


def test_the_engine_wrapper_is_transparent(tok):
    inner = PromptFnEngine(tok.eos_token_id)
    eng = with_generation_timeout(inner, 60.0)
    assert isinstance(eng, TimedEngine) and with_generation_timeout(inner, None) is inner
    eng.version = 7  # written through to the engine (weight syncs, stamps)
    assert inner.version == 7 and eng.version == 7 and eng.update_gate is inner.update_gate
    tasks = [{"uid": u, "question": f"question {u}", "turns": n} for u, n in (("a", 2), ("b", 4))]

    def run(engine):
        ro = MultiTurnRollout(engine, tok, ScriptEnv, SamplingConfig(max_new_tokens=16, seed=9), _config())
        return [_same(t) for t in ro.run(tasks, 2)[0]]

    assert run(eng) == run(PromptFnEngine(tok.eos_token_id))
    assert eng.timeouts == 0 and eng.hung is None
    with pytest.raises(ValueError, match="generation_timeout_s"):
        TimedEngine(inner, 0)
    eng.shutdown()


# ---------------------------------------------------------------- the knobs
def test_step_timeout_and_tool_timeout_are_one_knob():
    d = DEFAULT_STEP_TIMEOUT_S
    assert DEFAULT_TOOL_TIMEOUT_S == d  # the rule below relies on one default for both names
    assert resolve_step_timeout(d, d) == d
    assert resolve_step_timeout(30, d) == 30.0 and resolve_step_timeout(d, 30) == 30.0
    assert resolve_step_timeout(None, d) is None and resolve_step_timeout(d, None) is None
    assert resolve_step_timeout(30, 30) == 30.0
    with pytest.raises(ValueError, match="set only .env_runners.step_timeout_s"):
        resolve_step_timeout(30, 60)
    with pytest.raises(ValueError, match="step_timeout_s must be a number"):
        resolve_step_timeout(0, d)
    with pytest.raises(ValueError, match="step_timeout_s"):
        MultiTurnRollout(None, None, ScriptEnv, SamplingConfig(), step_timeout_s=-1)


def test_config_keys_defaults_and_validation():
    from rllib_spear import GRPOConfig
    from rllib_spear.algorithms.grpo.defaults import SAMPLING_DEFAULTS
    from rllib_spear.env_runners.engines.base import DEFAULT_GENERATION_TIMEOUT_S

    cfg = GRPOConfig()
    assert cfg.step_timeout_s == SAMPLING_DEFAULTS["step_timeout_s"] == DEFAULT_STEP_TIMEOUT_S
    assert cfg.tool_timeout_s == DEFAULT_STEP_TIMEOUT_S
    assert cfg.generation_timeout_s == SAMPLING_DEFAULTS["generation_timeout_s"] == DEFAULT_GENERATION_TIMEOUT_S
    GRPOConfig().env_runners(step_timeout_s=None, generation_timeout_s=None).validate(check_files=False)
    GRPOConfig().env_runners(step_timeout_s=20, generation_timeout_s=60).validate(check_files=False)
    with pytest.raises(ValueError, match="tool_timeout_s is the async loop's older name"):
        GRPOConfig().env_runners(step_timeout_s=20, tool_timeout_s=40).validate(check_files=False)
    with pytest.raises(ValueError, match=r"generation_timeout_s.*generation_timeout_s=\.\.\."):
        GRPOConfig().env_runners(generation_timeout_s=0).validate(check_files=False)
    with pytest.raises(ValueError, match="step_timeout_s"):
        GRPOConfig().env_runners(step_timeout_s="soon").validate(check_files=False)


def test_the_runner_passes_the_watchdogs_and_reports_step_timeouts(release):
    """An in-process LLMEnvRunner (embedded policy, HF engine): its rollout's engine is watched,
    its turn_sync loop bounds env steps, and ``step_timeouts`` reaches the runner's metrics."""
    from rllib_spear import GRPOConfig
    from rllib_spear.env_runners.llm_env_runner import LLMEnvRunner

    _HangOnce.release = release
    cfg = (GRPOConfig().environment(_HangOnce)
           .env_runners(max_new_tokens=8, max_turns=2, max_model_len=512, max_response_tokens=256,
                        step_timeout_s=LIMIT_S, generation_timeout_s=120, rollout_mode="turn_sync")
           .rl_module(model_config={"model_path": "embedded"}).debugging(seed=0))
    runner = LLMEnvRunner(config=cfg)
    try:
        engine = runner._rollout.engine
        assert isinstance(engine, TimedEngine) and engine.timeout_s == 120 and engine.engine is runner.engine
        assert runner._rollout.step_timeout_s == LIMIT_S and runner._eval_rollout.engine is engine
        runner.metrics.reduce()
        out = runner.sample_groups(tasks=[{"uid": "t", "question": "q", "turns": 2, "stuck": True}], group_size=2)
        assert out["stats"]["step_timeouts"] == 2
        assert all(isinstance(t.rollout.error, str) and "EnvStepTimeout" in t.rollout.error
                   for t in out["trajectories"])
        assert runner.get_metrics()["step_timeouts"] == 2
        runner._engine_hung(GenerationTimeout("test"))  # the local runner (index 0) only counts it
        assert runner.get_metrics()["generation_timeouts"] == 1
        # the next sampling call reports 0, not NaN (an unlogged "sum" reads NaN in RLlib)
        runner.sample_groups(tasks=[{"uid": "u", "question": "q", "turns": 1}], group_size=1)
        assert runner.get_metrics()["generation_timeouts"] == 0
    finally:
        release.set()
        runner.stop()


class _HangOnce(ScriptEnv):
    """A registered-by-class env whose first step hangs for ``task["stuck"]``."""

    release: threading.Event | None = None

    def step(self, text):
        if self.task.get("stuck") and self.release is not None:
            self.release.wait(60)
        return super().step(text)


def test_env_step_timeout_is_a_timeout_error():
    assert issubclass(EnvStepTimeout, TimeoutError) and issubclass(GenerationTimeout, TimeoutError)


def test_the_documented_defaults_match_the_config():
    """docs/design.md "Watchdogs and resources": its knob table says what GRPOConfig() holds."""
    import ast
    import re
    from pathlib import Path

    from rllib_spear import GRPOConfig

    doc = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    section = doc.split("### Watchdogs and resources", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| `([^`]+)` \|", section, flags=re.M)
    assert {k for k, _ in rows} == {"step_timeout_s", "generation_timeout_s"}
    cfg = GRPOConfig()
    assert {k: ast.literal_eval(v) for k, v in rows} == {k: getattr(cfg, k) for k, _ in rows}


# ---------------------------------------------------------------- env.reset (both loops)
class _ResetEnv(StuckEnv):
    """``task["reset"]``: "hang" blocks reset until ``release`` is set; "raise" raises."""

    def reset(self, task):
        mode = task.get("reset")
        if mode == "hang":
            self.release.wait(60)
        elif mode == "raise":
            raise ConnectionError("env server unreachable")
        return super().reset(task)


@pytest.mark.parametrize("loop", ["turn_sync", "async"])
def test_a_hung_or_failing_reset_skips_only_its_tasks_group(tok, release, loop):
    """A reset that hangs past the limit or raises used to hang the runner or fail its whole
    sample call; now that task's group is not sampled, it is counted (``reset_failures``, and a
    timeout in ``step_timeouts``), its hung env is never reused, the other tasks are sampled."""
    envs: list[_ResetEnv] = []

    def factory():
        envs.append(_ResetEnv(release, turns=2))
        return envs[-1]

    engine, sampling = PromptFnEngine(tok.eos_token_id), SamplingConfig(max_new_tokens=16, seed=3)
    if loop == "turn_sync":
        ro = MultiTurnRollout(engine, tok, factory, sampling, _config(), step_timeout_s=LIMIT_S)
    else:
        ro = AsyncMultiTurnRollout(engine, tok, factory, sampling, _config(), tool_timeout_s=LIMIT_S)
    tasks = [{"uid": "hang", "question": "q1", "reset": "hang"}, {"uid": "ok", "question": "q2"},
             {"uid": "raise", "question": "q3", "reset": "raise"}]
    t0 = time.perf_counter()
    trajs, stats = ro.run(tasks, 2)
    assert time.perf_counter() - t0 < 10 * LIMIT_S + 5  # not the 60 s the hung reset would take
    assert [t.uid for t in trajs] == ["ok", "ok"] and all(t.rollout.error is None for t in trajs)
    assert stats.reset_failures == 2 and stats.step_timeouts == 1
    assert stats.loop_metrics()["reset_failures"] == 2.0
    assert "ConnectionError" in ro.last_reset_error
    hung = envs[0]  # the first env made: its reset is the one that hangs
    assert not hasattr(hung, "task") and id(hung) not in {id(e) for e in ro._env_pool}, "the hung env is dropped"
    release.set()
    again, stats2 = ro.run([{"uid": "again", "question": "q4"}], 3)
    assert len(again) == 3 and stats2.reset_failures == 0
    assert all(e is not hung for e in ro._env_pool)


def test_a_streamed_group_whose_reset_fails_fails_alone(tok):
    """The async loop's per-group entry (``arun_group``, what a RolloutStream runs): a failed
    reset fails that group with the reset's error, which the stream counts as a failed group."""
    import asyncio

    from rllib_spear.env_runners.async_rollout import _Run
    from rllib_spear.env_runners.rollout import RolloutStats

    ro = AsyncMultiTurnRollout(PromptFnEngine(tok.eos_token_id), tok, lambda: _ResetEnv(threading.Event()),
                               SamplingConfig(max_new_tokens=16, seed=3), _config(), tool_timeout_s=LIMIT_S)

    async def go():
        run = _Run(RolloutStats(), ToolPool(2))
        try:
            with pytest.raises(RuntimeError, match="env.reset failed: task bad: ConnectionError"):
                await ro.arun_group({"uid": "bad", "question": "q", "reset": "raise"}, 2, 0, run)
            return await ro.arun_group({"uid": "good", "question": "q"}, 2, 0, run)
        finally:
            run.pool.shutdown()

    assert [t.uid for t in asyncio.run(go())] == ["good", "good"]
