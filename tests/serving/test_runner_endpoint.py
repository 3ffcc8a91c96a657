"""The endpoint in an ``LLMEnvRunner`` (in this process, HF engine, the tiny model): with
``serve_openai=True`` a ToolEnv run serves its engine on localhost with the run's key; with
``rollout_mode="agent_program"`` the runner samples agent programs through it; evaluation works;
when the runner stops, the port is closed."""
from __future__ import annotations

import socket

import httpx
import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

import rllib_spear  # noqa: E402,F401
from rllib_spear import GRPOConfig  # noqa: E402
from rllib_spear.models.factory import tiny_model_path  # noqa: E402


def _closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _program(task, client):
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task["question"]}])
    return float(len(reply.choices[0].message.content or "") % 2)


def test_serve_openai_on_a_tool_env_run_and_closed_with_the_runner():
    from rllib_spear.env_runners.llm_env_runner import LLMEnvRunner

    cfg = (GRPOConfig().environment("search_qa")
           .env_runners(max_new_tokens=8, max_turns=2, max_model_len=512, max_response_tokens=256,
                        serve_openai={"model_name": "my-policy"})
           .rl_module(model_config={"model_path": tiny_model_path()}).debugging(seed=0))
    runner = LLMEnvRunner(config=cfg)
    ep = runner.openai_endpoint
    try:
        assert ep.running and ep.host == "127.0.0.1"
        r = httpx.post(f"{ep.base_url()}/chat/completions", json={"model": "my-policy", "messages": [
            {"role": "user", "content": "hi"}]}, headers={"Authorization": f"Bearer {ep.api_key}"}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 8
    finally:
        runner.stop()
    assert not ep.running and _closed(ep.port)  # no endpoint outlives its runner


def test_an_agent_program_runner_samples_and_evaluates_through_its_endpoint():
    from rllib_spear.env_runners.llm_env_runner import LLMEnvRunner

    cfg = (GRPOConfig().environment("agent_program", env_config={"program": _program, "episode_timeout_s": 300},
                                    dataset=[{"uid": "a", "question": "q"}])
           .env_runners(rollout_mode="agent_program", max_new_tokens=8, max_model_len=512, max_response_tokens=256)
           .rl_module(model_config={"model_path": tiny_model_path()}).debugging(seed=0))
    cfg.validate(check_files=False)
    runner = LLMEnvRunner(config=cfg)
    ep = runner.openai_endpoint
    try:
        assert runner._rollout.endpoint is ep is runner._eval_rollout.endpoint  # one server, both rollouts
        tasks = [{"uid": "a", "question": "Where?"}, {"uid": "b", "question": "When?"}]
        out = runner.sample_groups(tasks=tasks, group_size=2)
        trajs = out["trajectories"]
        assert [t.uid for t in trajs] == ["a", "a", "b", "b"] and all(t.num_steps == 1 for t in trajs)
        assert out["stats"]["agent_program_errors"] == 0 and out["stats"]["engine_calls"] == 4
        ev = runner.evaluate_groups(tasks=tasks[:1], group_size=1, sampling={"temperature": 0.0})
        assert len(ev["trajectories"]) == 1 and ev["trajectories"][0].rollout.error is None
        metrics = runner.get_metrics()
        assert metrics["agent_program_errors"] == 0 and metrics["agent_program_timeouts"] == 0
    finally:
        runner.stop()
    assert _closed(ep.port)
