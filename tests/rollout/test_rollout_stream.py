"""A runner's sampling stream (env_runners/rollout_stream.py) and the engine's update gate
(engines/update_gate.py), without Ray: groups sampled in the background come back whole and equal
to the batch loop's on a deterministic engine; a weight update lands between two batches while
episodes are in flight, and each segment records the version that sampled it (partial rollouts);
stop drops what is in flight; a failing group fails alone."""
from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from transformers import AutoTokenizer

from agent_loop_stubs import PromptFnEngine, ScriptEnv
from rllib_spear.env_runners.async_rollout import AsyncMultiTurnRollout
from rllib_spear.env_runners.engines.base import SamplingConfig
from rllib_spear.env_runners.engines.update_gate import WeightUpdateGate
from rllib_spear.env_runners.rollout import RolloutConfig
from rllib_spear.env_runners.rollout_stream import GroupRequest, RolloutStream
from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.models.factory import tiny_model_path


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(tiny_model_path())


def _rollout(tok, engine, env_factory=ScriptEnv):
    return AsyncMultiTurnRollout(engine, tok, env_factory, SamplingConfig(max_new_tokens=16, seed=3),
                                 RolloutConfig(max_turns=5, max_model_len=512, max_response_tokens=400))


def _take_all(stream, n, timeout=60.0):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        done, _ = stream.take(min_groups=n - len(got), timeout_s=1.0)
        got += done
    return got


def _tasks():
    return [{"uid": f"u{k}", "question": f"question {k}", "turns": 1 + k % 4} for k in range(5)]


def test_stream_groups_equal_the_batch_loop_on_a_deterministic_engine(tok):
    engine = PromptFnEngine(tok.eos_token_id)
    batch, _ = _rollout(tok, engine).run(_tasks(), 3, policy_version=0)
    stream = RolloutStream(_rollout(tok, engine), tool_concurrency=4)
    try:
        assert stream.submit([GroupRequest(k, t, 3, seed=k) for k, t in enumerate(_tasks())]) == 5
        got = sorted(_take_all(stream, 5), key=lambda g: g.key)
        assert [g.key for g in got] == list(range(5)) and all(g.error is None for g in got)
        streamed = [t for g in got for t in g.trajectories]
        same = lambda t: dataclasses.replace(t, traj_id="")  # noqa: E731
        assert [same(t) for t in streamed] == [same(t) for t in batch]
        assert stream.in_flight == 0
        _, stats = stream.take(min_groups=0)
        assert stats.generated_tokens == 0, "every token was counted in an earlier window"
    finally:
        stream.stop()
        engine.shutdown()


class GatedEnv(ToolEnv):
    """Two steps; the first step of every episode waits for ``release`` (the test updates the
    weights meanwhile)."""

    def __init__(self, release: threading.Event, arrived: list):
        self.release, self.arrived = release, arrived

    def reset(self, task):
        self.n = 0
        return [{"role": "user", "content": task["question"]}]

    def step(self, text):
        self.n += 1
        if self.n == 1:
            self.arrived.append(1)
            self.release.wait(30)
            return StepResult("<information>after the update</information>", 0.0, False)
        return StepResult(None, 1.0, True)

    def episode_stats(self):
        return {"tool_calls": self.n, "queries_per_step": [1] * self.n, "success": True,
                "format_ok": True, "has_answer": True, "outcome_reward": 1.0}


def test_partial_rollouts_record_one_version_per_segment(tok):
    """Episodes in flight when the weights change finish on the new ones: turn 0 on version 0,
    turn 1 on version 1; the trajectory's version is the oldest."""
    engine = PromptFnEngine(tok.eos_token_id)
    release, arrived = threading.Event(), []
    stream = RolloutStream(_rollout(tok, engine, lambda: GatedEnv(release, arrived)), tool_concurrency=8,
                           version=lambda: engine.version)
    try:
        stream.submit([GroupRequest(0, {"uid": "a", "question": "qa"}, 2, seed=1),
                       GroupRequest(1, {"uid": "b", "question": "qb"}, 2, seed=2)])
        deadline = time.monotonic() + 30
        while len(arrived) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(arrived) == 4, "every episode sampled its first turn"
        engine.update_gate.begin()  # as the runner does around every transport
        engine.update_weights({}, version=1)
        engine.update_gate.end()
        release.set()
        got = _take_all(stream, 2)
        trajs = [t for g in got for t in g.trajectories]
        assert len(trajs) == 4
        for t in trajs:
            assert t.segment_versions == [0, 1] and t.policy_version == 0
            assert t.to_dict()["segments"][1]["policy_version"] == 0
    finally:
        release.set()
        stream.stop()
        engine.shutdown()


def test_the_gate_waits_for_the_running_batch_and_holds_the_next():
    gate = WeightUpdateGate()
    in_batch, leave, events = threading.Event(), threading.Event(), []

    def batch(name, hold):
        with gate.generating():
            events.append(f"{name} start")
            if hold:
                in_batch.set()
                leave.wait(10)
            events.append(f"{name} end")

    first = threading.Thread(target=batch, args=("b1", True))
    first.start()
    assert in_batch.wait(10)
    updater = threading.Thread(target=lambda: (gate.begin(), events.append("update")))
    updater.start()
    time.sleep(0.1)
    assert events == ["b1 start"] and updater.is_alive(), "the update waits for the running batch"
    leave.set()
    updater.join(10)
    assert events == ["b1 start", "b1 end", "update"] and gate.updating
    second = threading.Thread(target=batch, args=("b2", False))
    second.start()
    time.sleep(0.1)
    assert events[-1] == "update", "no batch starts while the update is open"
    gate.end()
    second.join(10)
    assert events[-2:] == ["b2 start", "b2 end"]
    gate.end()  # closing a closed gate does nothing
    first.join(10)


def test_stop_drops_the_groups_in_flight(tok):
    engine = PromptFnEngine(tok.eos_token_id)
    release, arrived = threading.Event(), []
    stream = RolloutStream(_rollout(tok, engine, lambda: GatedEnv(release, arrived)), tool_concurrency=8)
    try:
        stream.submit([GroupRequest(k, {"uid": f"s{k}", "question": f"q{k}"}, 2, seed=k) for k in range(3)])
        done, _ = stream.take(min_groups=1, timeout_s=0.3)
        assert done == [] and stream.in_flight == 3 and stream.in_flight_keys() == [0, 1, 2]
        assert stream.stop() == 3
        with pytest.raises(RuntimeError, match="after stop"):
            stream.submit([GroupRequest(9, {"uid": "x", "question": "q"}, 1)])
    finally:
        release.set()
        engine.shutdown()


def test_a_failing_group_fails_alone(tok):
    class FailOn(PromptFnEngine):
        def generate(self, prompts, sampling, max_new_tokens=None):
            if any(tok.decode(p).count("poison") for p in prompts):
                raise RuntimeError("engine fault")
            return super().generate(prompts, sampling, max_new_tokens)

    engine = FailOn(tok.eos_token_id)
    engine.max_batch_size = 1  # the poisoned request alone in its batch
    stream = RolloutStream(_rollout(tok, engine), tool_concurrency=4)
    try:
        stream.submit([GroupRequest(0, {"uid": "bad", "question": "poison", "turns": 2}, 2, seed=0),
                       GroupRequest(1, {"uid": "ok", "question": "fine", "turns": 2}, 2, seed=1)])
        got = {g.key: g for g in _take_all(stream, 2)}
        assert "engine fault" in got[0].error and got[0].trajectories == []
        assert got[1].error is None and len(got[1].trajectories) == 2
    finally:
        stream.stop()
        engine.shutdown()
