"""The env runner's OpenAI endpoint (rllib_spear/env_runners/serving) with the real ``openai`` client against
the HF engine: the captured token ids are the ones the engine sampled, the learner's re-scored
log-probs of them are the engine's, a chat loop stays one context token for token (also where
re-tokenizing the reply's text gives other ids), a missing or wrong key is a 401, a request the
endpoint cannot honour a 400 naming the parameter, and the server keeps serving."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from rllib_spear.core.call_layout import call_segments, calls_chain  # noqa: E402
from rllib_spear.core.trajectory import Trajectory  # noqa: E402
from rllib_spear.env_runners.engines.base import SamplingConfig  # noqa: E402
from rllib_spear.models.factory import tiny_model_path  # noqa: E402
from rllib_spear.models.logprobs import token_logprobs  # noqa: E402
from rllib_spear.env_runners.serving import OpenAIEndpoint  # noqa: E402
from rllib_spear.env_runners.serving.protocol import SamplingPolicy  # noqa: E402
from serving_stubs import ScriptedEngine, non_canonical_pair  # noqa: E402

MAX_LEN = 256


@pytest.fixture(scope="module")
def engine():
    from rllib_spear.env_runners.engines.hf_engine import HFEngine

    eng = HFEngine(tiny_model_path())
    yield eng
    eng.shutdown()


def _sampling(eng, **kw):
    return SamplingConfig(**{"max_new_tokens": 12, "seed": 0, "stop_token_ids": [eng.tokenizer.eos_token_id], **kw})


@pytest.fixture(scope="module")
def endpoint(engine):
    ep = OpenAIEndpoint(engine, engine.tokenizer, _sampling(engine), max_model_len=MAX_LEN).start()
    yield ep
    ep.stop()
    assert not ep.running


def _episode(ep, eng, **kw):
    cap = ep.open_episode(SamplingPolicy(_sampling(eng), max_model_len=MAX_LEN), seed=kw.pop("seed", 3))
    return cap, openai.OpenAI(**ep.client_kwargs(cap))


def _rescore(eng, ids):
    t = torch.tensor([list(ids)])
    return token_logprobs(eng.model, t, torch.ones_like(t))[0].detach().numpy()


def test_captured_tokens_are_the_sampled_ones_and_rescore_to_the_engine_log_probs(endpoint, engine):
    cap, client = _episode(endpoint, engine)
    messages = [{"role": "system", "content": "You answer."}, {"role": "user", "content": "Where is Veloria?"}]
    replies = []
    for turn in range(3):
        r = client.chat.completions.create(model="policy", messages=messages, max_tokens=10, logprobs=True,
                                           extra_body={"return_token_ids": True})
        replies.append(r)
        messages += [r.choices[0].message, {"role": "user", "content": f"and then {turn}?"}]
    records = endpoint.close_episode(cap)
    assert len(records) == 3
    for r, rec in zip(replies, records):
        choice = r.choices[0]
        # what the engine sampled, as the response reported it, is what was recorded
        assert list(rec.call.completion_ids) == choice.model_extra["token_ids"]
        assert list(rec.call.prompt_ids) == r.model_extra["prompt_token_ids"]
        assert np.allclose(rec.call.logprobs, [c.logprob for c in choice.logprobs.content])
        assert r.usage.completion_tokens == len(rec.call.completion_ids)
    calls = [rec.call for rec in records]
    assert calls_chain(calls)  # the chat loop continued from the sampled ids: one context
    segments, prompts = call_segments(calls, [0])
    traj = Trajectory("u", segments, step_prompts=prompts)
    lp = _rescore(engine, traj.input_ids())
    mask = traj.loss_mask() > 0
    np.testing.assert_allclose(lp[mask], traj.behaviour_logprobs()[mask], atol=2e-4)


def test_the_hf_engine_passes_the_endpoint_contract(engine):
    from rllib_spear.testing import check_endpoint_contract

    check_endpoint_contract(engine, engine.tokenizer, rescore=lambda ids: _rescore(engine, ids))


def test_completions_take_text_or_token_ids(endpoint, engine):
    cap, client = _episode(endpoint, engine)
    ids = engine.tokenizer.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    r1 = client.completions.create(model="policy", prompt=ids, max_tokens=6, logprobs=0,
                                   extra_body={"return_token_ids": True})
    r2 = client.completions.create(model="policy", prompt="Alba went to", max_tokens=6)
    rec1, rec2 = endpoint.close_episode(cap)
    assert list(rec1.call.prompt_ids) == ids and list(rec1.call.completion_ids) == r1.choices[0].model_extra["token_ids"]
    assert np.allclose(rec1.call.logprobs, r1.choices[0].logprobs.token_logprobs)
    assert list(rec2.call.prompt_ids) == engine.tokenizer.encode("Alba went to")
    assert r2.choices[0].text == engine.tokenizer.decode(list(rec2.call.completion_ids), skip_special_tokens=True)


def test_a_chat_loop_trains_on_the_sampled_ids_where_retokenizing_gives_others(engine):
    """The reply's ids [a, b] decode to a text that re-encodes to other ids; the next request
    repeats that text; the endpoint continues from [a, b], so the trained ids are the sampled ones."""
    tok = engine.tokenizer
    pair = non_canonical_pair(tok)
    text = tok.decode(pair)
    assert tok.encode(text, add_special_tokens=False) != pair
    scripted = ScriptedEngine(pair, tok.eos_token_id)
    ep = OpenAIEndpoint(scripted, tok, _sampling(engine), max_model_len=MAX_LEN).start()
    try:
        cap, client = _episode(ep, engine)
        messages = [{"role": "user", "content": "Say it."}]
        r = client.chat.completions.create(model="policy", messages=messages)
        assert r.choices[0].message.content == text
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Again."}]  # as plain text
        client.chat.completions.create(model="policy", messages=messages)
        records = ep.close_episode(cap)
    finally:
        ep.stop()
    first, second = (rec.call for rec in records)
    context = [*first.prompt_ids, *pair, tok.eos_token_id]
    assert list(second.prompt_ids[:len(context)]) == context  # the sampled ids, not the re-tokenized text
    retemplated = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert list(second.prompt_ids) != list(retemplated)  # what re-templating would have trained on
    segments, prompts = call_segments([first, second], [0])
    assert prompts is None and [s.token_ids for s in segments if s.kind == "assistant"] == [[*pair, tok.eos_token_id]] * 2


def test_a_missing_or_wrong_key_is_a_401(endpoint, engine):
    cap, _ = _episode(endpoint, engine)
    for key in ("wrong", ""):
        client = openai.OpenAI(base_url=endpoint.base_url(cap), api_key=key or "x", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    r = httpx.get(f"{endpoint.base_url()}/models")  # no Authorization header at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert endpoint.close_episode(cap) == []  # nothing was sampled


@pytest.mark.parametrize("extra, param", [
    ({"n": 2}, "n"), ({"stream": True}, "stream"), ({"temperature": 0.5}, "temperature"), ({"seed": 1}, "seed"),
    ({"top_p": 1.5}, "top_p"), ({"top_logprobs": 3}, "top_logprobs"), ({"tool_choice": "required"}, "tool_choice"),
    ({"presence_penalty": 0.5}, "presence_penalty"), ({"logit_bias": {"5": 1}}, "logit_bias"),
    ({"response_format": {"type": "json_object"}}, "response_format"), ({"guided_json": {}}, "guided_json"),
    ({"max_tokens": 0}, "max_tokens"), ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "word " * 400}]}, "messages"),
])
def test_a_request_it_cannot_honour_is_a_400_naming_the_parameter(endpoint, engine, extra, param):
    body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], **extra}
    r = httpx.post(f"{endpoint.base_url()}/chat/completions", json=body,
                   headers={"Authorization": f"Bearer {endpoint.api_key}"}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
    if "word " in json.dumps(extra):
        assert err["code"] == "context_length_exceeded"


def test_other_refusals_and_the_server_keeps_serving(endpoint, engine):
    headers = {"Authorization": f"Bearer {endpoint.api_key}"}
    r = httpx.post(f"{endpoint.base_url()}/chat/completions", content=b"{not json", headers=headers)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    client = openai.OpenAI(**endpoint.client_kwargs())
    with pytest.raises(openai.NotFoundError, match="serves 'policy'"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError, match="no open episode"):
        openai.OpenAI(base_url=f"{endpoint.url}/episodes/nope/v1", api_key=endpoint.api_key,
                      max_retries=0).chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    # the training temperature itself, top_p and stop strings are honoured
    r = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], temperature=1.0,
                                       top_p=0.9, stop=["\n"], max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 4
    assert [m.id for m in client.models.list().data] == ["policy"]
