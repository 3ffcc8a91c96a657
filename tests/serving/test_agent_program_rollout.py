"""``rollout_mode="agent_program"`` (env_runners/agent_program_rollout.py): agent programs as
episodes. A program that raises, hangs or returns no number is a counted failed episode (reward
0) and the others go on; 32 concurrent episodes batch in the engine; tool calls are counted from
the captured replies; a program that rewrites its history gives one sample per call; evaluation
samples with its own parameters; the fully asynchronous pipeline's stream runs it."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

import agent_programs as programs  # noqa: E402
from rllib_spear.env_runners.agent_program_rollout import AgentProgramRollout  # noqa: E402
from rllib_spear.env_runners.engines.base import SamplingConfig  # noqa: E402
from rllib_spear.env_runners.rollout import RolloutConfig  # noqa: E402
from rllib_spear.envs.agent_program import AgentProgramEnv  # noqa: E402
from rllib_spear.models.factory import tiny_model_path  # noqa: E402
from serving_stubs import ScriptedEngine  # noqa: E402


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path())


@pytest.fixture(scope="module")
def hf_engine():
    from rllib_spear.env_runners.engines.hf_engine import HFEngine

    eng = HFEngine(tiny_model_path())
    yield eng
    eng.shutdown()


def _rollout(engine, tok, program, timeout=30.0, max_model_len=256, **sampling):
    ro = AgentProgramRollout(engine, tok, lambda: AgentProgramEnv(program, episode_timeout_s=timeout),
                             SamplingConfig(**{"max_new_tokens": 8, "seed": 0, **sampling}),
                             RolloutConfig(max_model_len=max_model_len, max_response_tokens=200))
    return ro


@pytest.mark.parametrize("program", [programs.misbehaving, programs.amisbehaving])
def test_a_program_that_raises_or_hangs_is_a_counted_failed_episode(tok, program):
    engine = ScriptedEngine(tok.encode("ok", add_special_tokens=False), tok.eos_token_id)
    ro = _rollout(engine, tok, program, timeout=3.0)
    tasks = [{"uid": "ok", "question": "a"}, {"uid": "raise", "question": "b", "mode": "raise"},
             {"uid": "hang", "question": "c", "mode": "hang"}]
    if program is programs.misbehaving:
        tasks.append({"uid": "text", "question": "d", "mode": "text"})
    try:
        trajs, stats = ro.run(tasks, 2, policy_version=4)
    finally:
        ro.shutdown()
    by = {t.uid: t for t in trajs}
    assert len(trajs) == 2 * len(tasks) and [t.uid for t in trajs][::2] == [t["uid"] for t in tasks]
    assert by["ok"].outcome_reward == 1.0 and by["ok"].rollout.error is None and by["ok"].stats.success
    assert "the agent's tool crashed" in by["raise"].rollout.error and by["raise"].outcome_reward == 0.0
    assert by["hang"].rollout.error_stage == "agent_program_timeout" and by["hang"].outcome_reward == 0.0
    errors = 2 + (2 if "text" in by else 0)
    assert stats.extra == {"agent_program_errors": errors, "agent_program_timeouts": 2}
    assert stats.loop_metrics()["agent_program_timeouts"] == 2 and stats.rollout_errors == errors + 2
    for t in trajs:  # the calls made before the failure are kept, reward 0, and stamped
        assert t.num_steps == 1 and t.policy_version == 4
        assert t.truncated == (t.uid != "ok") and t.stats.has_answer == (t.uid == "ok")
    if "text" in by:
        assert "must return the episode's reward" in by["text"].rollout.error


@pytest.mark.parametrize("program", [programs.chat_twice, programs.achat_twice])
def test_32_concurrent_episodes_batch_in_the_engine(hf_engine, program):
    sched = hf_engine.batching_scheduler()
    before = sched.batches, sched.requests
    ro = _rollout(hf_engine, hf_engine.tokenizer, program, timeout=600.0)
    try:
        trajs, stats = ro.run([{"uid": f"t{i}", "question": f"question {i}"} for i in range(16)], 2)
    finally:
        ro.shutdown()
    batches, requests = sched.batches - before[0], sched.requests - before[1]
    assert requests == 64 == stats.engine_calls and all(t.rollout.error is None for t in trajs)
    assert batches < requests and sched.max_batch > 1, (batches, requests, sched.max_batch)
    assert stats.concurrent_episodes_max == 32
    assert all(t.layout == "full" and t.num_steps == 2 for t in trajs)  # chat loops: one context each
    assert stats.generated_tokens == sum(t.num_generated_tokens for t in trajs)


def test_tool_calls_are_counted_from_the_captured_replies(tok):
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    engine = ScriptedEngine(tok.encode(call, add_special_tokens=False), tok.eos_token_id)
    ro = _rollout(engine, tok, programs.uses_calculator, max_model_len=2048, max_new_tokens=64)
    try:
        (t,), _ = ro.run([{"uid": "c", "question": "6*7?"}], 1)
    finally:
        ro.shutdown()
    assert t.stats.tool_calls == 2 and t.stats.queries_per_step == [1, 1] and t.stats.format_ok
    assert t.layout == "full"  # the tool result continued the sampled ids
    # the second prompt holds the Hermes tool block, the sampled call and the tool's result
    text = tok.decode(engine.prompts[1])
    assert "# Tools" in text and "<tool_response>\n42\n</tool_response>" in text


def test_a_program_that_rewrites_its_history_gives_one_sample_per_call(tok):
    engine = ScriptedEngine(tok.encode("fine", add_special_tokens=False), tok.eos_token_id)
    ro = _rollout(engine, tok, "agent_programs:rewrites_history")  # a program given by import path
    try:
        (t,), _ = ro.run([{"uid": "r", "question": "long story"}], 1)
    finally:
        ro.shutdown()
    assert t.layout == "window" and [list(p) for p in t.step_prompts] == engine.prompts


def test_evaluation_samples_with_its_own_parameters(tok):
    engine = ScriptedEngine(tok.encode("x", add_special_tokens=False), tok.eos_token_id)
    seen = []
    engine.generate_ = engine.generate

    def generate(prompts, sampling, max_new_tokens=None):
        seen.append(sampling.temperature)
        return engine.generate_(prompts, sampling, max_new_tokens)

    engine.generate = generate
    ro = _rollout(engine, tok, programs.passes_temperature)
    try:
        ro.sampling = SamplingConfig(temperature=0.0, max_new_tokens=8, seed=1)  # the runner's evaluation
        (t,), _ = ro.run([{"uid": "e", "question": "q"}], 1)
    finally:
        ro.shutdown()
    assert t.rollout.error is None and seen == [0.0]  # temperature=1.0 (the trained one) accepted, greedy used


def test_the_async_pipeline_stream_runs_agent_programs(tok):
    from rllib_spear.env_runners.rollout_stream import GroupRequest, RolloutStream

    engine = ScriptedEngine(tok.encode("ok", add_special_tokens=False), tok.eos_token_id)
    engine.version = 7  # the stream keeps the version the engine stamped on each call
    ro = _rollout(engine, tok, programs.achat_twice)
    stream = RolloutStream(ro, 8, version=lambda: 6)
    try:
        stream.submit([GroupRequest(1, {"uid": "a", "question": "q"}, 2, 5), GroupRequest(2, {"uid": "b", "question": "r"}, 2, 6)])
        done, stats = stream.take(2, timeout_s=120)
        _, empty = stream.take(0, timeout_s=0)  # a window where nothing finished still reports the counters
    finally:
        stream.stop()
        ro.shutdown()
    assert sorted(g.key for g in done) == [1, 2] and all(g.error is None for g in done)
    assert all(len(g.trajectories) == 2 and g.trajectories[0].policy_version == 7 for g in done)
    assert stats.engine_calls == 8 and json.dumps(stats.extra)
    assert empty.extra == {"agent_program_errors": 0, "agent_program_timeouts": 0} and empty.engine_calls == 0
