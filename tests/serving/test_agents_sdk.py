"""An OpenAI Agents SDK agent (``openai-agents``; skipped when it is not installed) through the
endpoint: its loop of model call, tool call, model call is captured as one context token for
token, and the tool calls it made are counted."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed (pip install openai-agents)")
pytest.importorskip("fastapi")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "openai_agent"))

import agents_sdk_agent as ex  # noqa: E402
from rllib_spear.env_runners.agent_program_rollout import AgentProgramRollout  # noqa: E402
from rllib_spear.env_runners.engines.base import SamplingConfig  # noqa: E402
from rllib_spear.env_runners.rollout import RolloutConfig  # noqa: E402
from rllib_spear.envs.agent_program import AgentProgramEnv  # noqa: E402
from rllib_spear.models.factory import tiny_model_path  # noqa: E402
from serving_stubs import ScriptedEngine  # noqa: E402


def test_an_agents_sdk_loop_is_one_context_with_its_tool_calls_counted():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>'
    engine = ScriptedEngine(tok.encode(call, add_special_tokens=False), tok.eos_token_id)
    ro = AgentProgramRollout(engine, tok, lambda: AgentProgramEnv(ex.solve, episode_timeout_s=300),
                             SamplingConfig(max_new_tokens=200, seed=0), RolloutConfig(max_model_len=4096))
    try:
        (t,), stats = ro.run(ex.tasks(1), 1)
        refused = ro.endpoint.service.refused
    finally:
        ro.shutdown()
    assert refused == 0 and t.rollout.error is None  # every parameter the SDK sends is served
    assert t.num_steps == 3 and t.layout == "full" and t.stats.tool_calls == 3  # max_turns=3, all tool calls
    assert "<tool_response>\n42\n</tool_response>" in tok.decode(engine.prompts[1])
