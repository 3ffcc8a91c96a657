"""A fixed seed reproduces an async run (Part 22): the HF engine samples each row of a batch from
its own seeded stream (``SamplingConfig.row_seeds``, ``hf_engine.RowStreams``), so which requests
share a batch (timing) no longer changes their tokens."""
from __future__ import annotations

import dataclasses
import random
import time

import pytest

from agent_loop_stubs import ScriptEnv
from rllib_spear.env_runners.async_rollout import AsyncMultiTurnRollout
from rllib_spear.env_runners.engines.base import SamplingConfig
from rllib_spear.env_runners.engines.hf_engine import HFEngine, RowStreams
from rllib_spear.env_runners.rollout import RolloutConfig
from rllib_spear.models.factory import tiny_model_path


@pytest.fixture(scope="module")
def engine():
    eng = HFEngine(tiny_model_path())
    yield eng
    eng.shutdown()


def test_row_stream_is_splitmix64():
    # SplitMix64's published first output from state 0 is 0xE220A8397B1DCDAF; a row's step 1 with
    # seed 0 is that draw, its uniform the top 53 bits.
    assert RowStreams._splitmix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    s = RowStreams([0, 0, 5])
    u = s.uniforms([0, 2])
    assert u[0] == (0xE220A8397B1DCDAF >> 11) / 2**53
    assert s.uniforms([1]) == [u[0]]  # row 1 starts its own stream: the same seed, the same draw
    assert s.uniforms([0])[0] != u[0] and all(0 <= x < 1 for x in u)


def test_a_row_samples_the_same_tokens_alone_or_in_any_batch(engine):
    tok = engine.tokenizer
    prompts = [tok.encode(t) for t in ("a short prompt", "another, longer prompt with more words in it",
                                       "third", "a short prompt")]
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0)
    seeds = (11, 22, 33, 44)
    together = engine.generate(prompts, dataclasses.replace(sampling, row_seeds=seeds, seed=1))
    for i in range(len(prompts)):
        alone = engine.generate([prompts[i]], dataclasses.replace(sampling, row_seeds=(seeds[i],), seed=99))[0]
        assert alone.token_ids == together[i].token_ids
    swapped = engine.generate(prompts[::-1], dataclasses.replace(sampling, row_seeds=seeds[::-1], seed=7))
    assert [o.token_ids for o in swapped[::-1]] == [o.token_ids for o in together]
    # identical prompts with other seeds still differ (a GRPO group's samples)
    assert together[0].token_ids != together[3].token_ids


def test_row_seeds_must_match_the_prompts(engine):
    with pytest.raises(ValueError, match="row_seeds has 1 seeds for 2 prompts"):
        engine.generate([[1, 2], [3]], SamplingConfig(max_new_tokens=2, row_seeds=(1,)))


class _SlowEnv(ScriptEnv):
    """ScriptEnv whose steps take a random time: other timings, so other batches of requests."""

    delays: random.Random = random.Random(0)

    def step(self, text):
        time.sleep(self.delays.random() * 0.05)
        return super().step(text)


def test_a_fixed_seed_reproduces_an_async_run_under_other_timings(engine):
    tasks = [{"uid": u, "question": f"question {u}", "turns": n} for u, n in (("a", 3), ("b", 2), ("c", 3))]
    cfg = RolloutConfig(max_turns=4, max_model_len=512, max_response_tokens=200)
    sampling = SamplingConfig(max_new_tokens=10, seed=5)
    runs = []
    for timing in (0, 1, 2):
        _SlowEnv.delays = random.Random(timing)
        trajs, _ = AsyncMultiTurnRollout(engine, engine.tokenizer, _SlowEnv, sampling, cfg).run(tasks, 2)
        runs.append(sorted((t.uid, list(t.input_ids()), t.outcome_reward) for t in trajs))
    assert runs[0] == runs[1] == runs[2]


def test_a_rows_logprobs_match_alone_or_batched_to_float32_rounding(engine):
    """The tokens do not depend on the batch, the behaviour log-probs only to float32 rounding
    (the forward runs over the batch's padding; docs/design.md "The agent loop", Seeds): the
    reason two seeded async runs train to rounding, not bitwise, without recompute_old_logprobs."""
    tok = engine.tokenizer
    prompts = [tok.encode("a short prompt"), tok.encode("another, longer prompt with many more words in it")]
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0)
    together = engine.generate(prompts, dataclasses.replace(sampling, row_seeds=(11, 22), seed=1))
    alone = engine.generate([prompts[0]], dataclasses.replace(sampling, row_seeds=(11,), seed=1))[0]
    assert alone.token_ids == together[0].token_ids
    assert alone.logprobs == pytest.approx(together[0].logprobs, abs=1e-5)
