"""Hostile text and failing turns in the multi-turn rollout loop (issue "Part 9").

Lone UTF-16 surrogates in model text or tool output are sanitized before tokenization, and any
exception while building a turn (env step, observation formatting, tokenization) ends only that
episode as a truncated trajectory flagged ``info["rollout_error"]``, counted by
``RolloutStats.rollout_errors`` and ``rollout_metrics``'s ``rollout_error_rate``; the rest of the
batch completes. Runs the full loop on the project's tiny HF model.
"""
from __future__ import annotations

import numpy as np
import pytest

from rllib_spear.core.trajectory import collate_trajectories
from rllib_spear.env_runners.engines.base import SamplingConfig
from rllib_spear.env_runners.engines.hf_engine import HFEngine
from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig
from rllib_spear.env_runners.text_safety import safe_text
from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.metrics import rollout_metrics
from rllib_spear.models.factory import tiny_model_path

TURNS = 3
BOOM = "BOOM-TOKENIZER"


class _Unformattable:
    """A tool output whose string conversion raises (a broken observation object)."""

    def __str__(self) -> str:
        raise RuntimeError("cannot render observation")

    __format__ = lambda self, spec: self.__str__()  # noqa: E731


class ModeEnv(ToolEnv):
    """Behaves by ``task["mode"]``; misbehaves on the second step (after one good observation).

    ok: fixed observation. echo: echoes the assistant text into the observation (as retrieval
    echoes the query). surrogate_obs: tool output with a lone surrogate. tokenize_fail: an
    observation the tokenizer rejects. format_fail: an observation that cannot be rendered.
    step_fail: step raises.
    """

    def reset(self, task):
        self.mode, self.n = task["mode"], 0
        return [{"role": "system", "content": "You search."}, {"role": "user", "content": task["question"]}]

    def step(self, text):
        self.n += 1
        if self.n >= TURNS:
            return StepResult(None, 1.0, True)
        if self.n == 2:
            if self.mode == "tokenize_fail":
                return StepResult(f"<information>{BOOM}</information>", 0.0, False)
            if self.mode == "format_fail":
                return StepResult(_Unformattable(), 0.0, False)  # type: ignore[arg-type]
            if self.mode == "step_fail":
                raise KeyError("tool crashed")
        if self.mode == "echo":
            return StepResult(f"<information>you searched: {text}</information>", 0.0, False)
        if self.mode == "surrogate_obs":
            return StepResult("<information>bad \ud800 bytes \udfff</information>", 0.0, False)
        return StepResult("<information>the answer is blue</information>", 0.0, False)

    def episode_stats(self):
        return {"tool_calls": self.n - 1, "queries_per_step": [1] * self.n, "success": False,
                "format_ok": True, "has_answer": True, "outcome_reward": 0.0}


class HostileTokenizer:
    """The real tokenizer, except: decoded model text carries a lone surrogate (when
    ``surrogate_decode``), and encoding text with ``BOOM`` raises (a tokenizer failure)."""

    def __init__(self, tok, surrogate_decode: bool = False):
        self._tok, self.surrogate_decode = tok, surrogate_decode

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def decode(self, ids, **kw):
        text = self._tok.decode(ids, **kw)
        return f"\ud800{text}\udfff" if self.surrogate_decode else text

    def encode(self, text, **kw):
        if BOOM in text:
            raise ValueError("tokenizer exploded")
        return self._tok.encode(text, **kw)


@pytest.fixture(scope="module")
def engine_and_tok():
    eng = HFEngine(tiny_model_path())
    return eng, eng.tokenizer


def _rollout(engine, tok):
    return MultiTurnRollout(engine, tok, ModeEnv, SamplingConfig(max_new_tokens=8, seed=5),
                            RolloutConfig(max_turns=5, max_model_len=512, max_response_tokens=400))


def _tasks(*modes):
    return [{"uid": m, "question": f"q {m}", "mode": m} for m in modes]


def _assert_complete(t):
    assert t.rollout.error is None and not t.truncated
    assert t.num_steps == TURNS
    assert [s.kind for s in t.segments[1:]] == ["assistant", "observation"] * (TURNS - 1) + ["assistant"]


def test_safe_text_replaces_lone_surrogates():
    assert safe_text("a\ud800b") == "a\ufffdb"
    assert safe_text("\udfff\ud800") == "\ufffd\ufffd"
    assert safe_text("\ud83d\ude00") == "\U0001F600"  # a well-formed pair becomes its character
    assert safe_text("plain é 中") == "plain é 中"
    assert safe_text(b"\xffok") == "\ufffdok" and safe_text(None) == ""
    for s in ("a\ud800b", "\udfff", "x\ud83dy"):
        safe_text(s).encode("utf-8")  # never raises


def test_surrogate_in_model_text_echoed_into_observation(engine_and_tok):
    """The engine's decoded text holds lone surrogates; the env echoes it into the observation."""
    eng, tok = engine_and_tok
    ro = _rollout(eng, HostileTokenizer(tok, surrogate_decode=True))
    trajs, stats = ro.run(_tasks("echo", "ok"), 2)
    assert len(trajs) == 4 and stats.rollout_errors == 0
    for t in trajs:
        _assert_complete(t)
        for text in t.rollout.assistant_texts:
            assert "\ufffd" in text
            text.encode("utf-8")
    # the echoed (sanitized) text was tokenized into the observation
    obs = [s for s in trajs[0].segments if s.kind == "observation"][0]
    assert "\ufffd" in tok.decode(obs.token_ids) and "you searched" in tok.decode(obs.token_ids)


def test_surrogate_in_tool_output(engine_and_tok):
    eng, tok = engine_and_tok
    trajs, stats = _rollout(eng, tok).run(_tasks("surrogate_obs"), 2)
    assert stats.rollout_errors == 0
    for t in trajs:
        _assert_complete(t)
        obs = [s for s in t.segments if s.kind == "observation"][0]
        assert "bad \ufffd bytes \ufffd" in tok.decode(obs.token_ids)


@pytest.mark.parametrize("mode, exc_type, stage", [
    ("tokenize_fail", "ValueError", "observation"),
    ("format_fail", "RuntimeError", "observation"),
    ("step_fail", "KeyError", "env_step"),
])
def test_failing_turn_becomes_errored_trajectory(engine_and_tok, mode, exc_type, stage):
    eng, tok = engine_and_tok
    trajs, stats = _rollout(eng, HostileTokenizer(tok)).run(_tasks("ok", mode, "echo"), 2)
    assert [t.uid for t in trajs] == ["ok"] * 2 + [mode] * 2 + ["echo"] * 2
    bad = [t for t in trajs if t.uid == mode]
    for t in trajs:
        if t.uid != mode:
            _assert_complete(t)
    for t in bad:
        assert t.truncated
        assert t.rollout.error.startswith(f"{exc_type}: ")
        assert t.rollout.error_stage == stage
        # ended after the second assistant turn; the first observation is kept
        assert [s.kind for s in t.segments[1:]] == ["assistant", "observation", "assistant"]
        assert t.num_steps == 2 and len(t.step_rewards) == 2
        assert t.rollout.turns == 2
    assert stats.rollout_errors == 2
    # errored trajectories still collate like any truncated one
    batch = collate_trajectories(trajs, pad_token_id=0)
    assert batch is not None
    m = rollout_metrics(trajs, [{"rollout_errors": stats.rollout_errors}])
    assert m["rollout_error_rate"] == pytest.approx(2 / 6)
    assert m["rollout_errors"] == 2.0
    assert m["truncation_rate"] == pytest.approx(2 / 6)


def test_rollout_error_metric_zero_on_clean_batch(engine_and_tok):
    eng, tok = engine_and_tok
    trajs, stats = _rollout(eng, tok).run(_tasks("ok"), 2)
    assert stats.rollout_errors == 0
    m = rollout_metrics(trajs)
    assert m["rollout_error_rate"] == 0.0 and m["rollout_errors"] == 0.0
    assert np.isfinite(m["reward_total_mean"])
