"""The multi-turn rollout loop on a real tiny HF model: token-in/token-out, masks, log-probs,
context budget. The environment here is a scripted stand-in (the envs have their own tests)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_spear.env_runners.engines.base import SamplingConfig
from rllib_spear.env_runners.engines.hf_engine import HFEngine
from rllib_spear.env_runners.rollout import MultiTurnRollout, ObservationTemplate, RolloutConfig
from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.models.factory import tiny_model_path
from rllib_spear.models.logprobs import token_logprobs


class EchoToolEnv(ToolEnv):
    """Answers every assistant turn with a fixed observation until `turns` turns were made."""

    def __init__(self, turns: int = 3, observation: str = "<information>the answer is blue</information>"):
        self.turns, self.observation = turns, observation

    def reset(self, task):
        self.n = 0
        return [{"role": "system", "content": "You search."}, {"role": "user", "content": task["question"]}]

    def step(self, text):
        self.n += 1
        if self.n >= self.turns:
            return StepResult(None, 1.0 if "blue" in text else 0.0, True)
        return StepResult(self.observation, 0.0, False)

    def episode_stats(self):
        return {"tool_calls": self.n - 1, "queries_per_step": [1] * self.n, "success": False,
                "format_ok": True, "has_answer": True, "outcome_reward": 0.0}


@pytest.fixture(scope="module")
def engine_and_tok():
    path = tiny_model_path()
    eng = HFEngine(path)
    return eng, eng.tokenizer


def _rollout(engine, tok, turns=3, **cfg):
    return MultiTurnRollout(engine, tok, lambda: EchoToolEnv(turns), SamplingConfig(max_new_tokens=12, seed=3),
                            RolloutConfig(**{"max_turns": 5, "max_model_len": 512, "max_response_tokens": 400, **cfg}))


def test_groups_share_uid_and_have_prompt_first(engine_and_tok):
    eng, tok = engine_and_tok
    trajs, stats = _rollout(eng, tok).run([{"uid": "a", "question": "q1"}, {"uid": "b", "question": "q2"}], 3)
    assert [t.uid for t in trajs] == ["a"] * 3 + ["b"] * 3
    assert len({t.traj_id for t in trajs}) == 6
    assert stats.engine_calls == 3 and stats.generated_tokens == sum(t.num_generated_tokens for t in trajs)
    for t in trajs:
        assert t.segments[0].kind == "prompt" and t.num_steps == 3
        assert [s.kind for s in t.segments[1:]] == ["assistant", "observation", "assistant", "observation", "assistant"]


def test_masks_token_by_token(engine_and_tok):
    eng, tok = engine_and_tok
    traj = _rollout(eng, tok).run([{"uid": "a", "question": "q"}], 1)[0][0]
    ids, mask = traj.input_ids(), traj.loss_mask()
    prompt = tok.apply_chat_template([{"role": "system", "content": "You search."}, {"role": "user", "content": "q"}],
                                     add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    assert list(ids[: len(prompt)]) == list(prompt) and not mask[: len(prompt)].any()
    obs_ids = tok.encode(ObservationTemplate.named("chatml").render("<information>the answer is blue</information>"),
                         add_special_tokens=False)
    pos = len(prompt)
    for seg in traj.segments[1:]:
        n = len(seg.token_ids)
        want = 1.0 if seg.kind == "assistant" else 0.0
        assert (mask[pos: pos + n] == want).all(), seg.kind
        if seg.kind == "observation":
            assert list(ids[pos: pos + n]) == obs_ids  # tokenized once, exactly the template
        pos += n
    assert pos == len(ids)
    # the end-of-turn token, when sampled, ends an assistant span and carries mask 1
    eos = tok.eos_token_id
    for seg in traj.segments:
        if seg.kind == "assistant" and eos in seg.token_ids:
            assert seg.token_ids[-1] == eos


def test_engine_logprobs_match_trainer_rescoring(engine_and_tok):
    eng, tok = engine_and_tok
    trajs, _ = _rollout(eng, tok).run([{"uid": "a", "question": "q"}], 4)
    for t in trajs:
        ids = torch.tensor(t.input_ids())[None]
        lp = token_logprobs(eng.model, ids, torch.ones_like(ids))[0].detach().numpy()
        m = t.loss_mask() > 0
        np.testing.assert_allclose(lp[m], t.behaviour_logprobs()[m], atol=2e-4)
        # token ids are exactly what the engine sampled: re-tokenizing the decoded text is not used
        for seg in t.segments:
            if seg.kind == "assistant":
                assert all(isinstance(x, int) for x in seg.token_ids)


def test_context_budget_truncates_cleanly(engine_and_tok):
    eng, tok = engine_and_tok
    trajs, _ = _rollout(eng, tok, turns=50, max_turns=50, max_model_len=160, max_response_tokens=150).run(
        [{"uid": "a", "question": "q"}], 2)
    for t in trajs:
        assert t.truncated and t.length <= 160
        assert t.segments[-1].kind == "assistant"


def test_max_turns_truncates(engine_and_tok):
    eng, tok = engine_and_tok
    trajs, _ = _rollout(eng, tok, turns=10, max_turns=2).run([{"uid": "a", "question": "q"}], 2)
    assert all(t.truncated and t.num_steps == 2 for t in trajs)


def test_bad_group_size(engine_and_tok):
    eng, tok = engine_and_tok
    with pytest.raises(ValueError, match="group_size"):
        _rollout(eng, tok).run([{"uid": "a", "question": "q"}], 0)
