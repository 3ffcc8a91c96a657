"""Masks and log-probs on a real chat template: a SmolLM2-135M-Instruct search rollout, re-scored
by the trainer side.

A short multi-turn rollout of the search task (embedded corpus, 2 tasks x 2 samples, HF engine,
SmolLM2's own ChatML template) is turned into learner rows exactly as the recipe does
(``LearnerRow`` -> ``build_learner_batches``) and scored with the learner's log-prob path
(``token_logprobs`` on the float32 model loaded from the same folder). Checked:

- the engine's sampled log-probs equal the trainer's within 2e-3 nats per token (float32; the
  engine decodes left-padded with a KV cache, the trainer runs one right-padded forward);
- the loss mask is 1 exactly on the assistant tokens and the ``<|im_end|>`` that closes a
  turn, never on the system/user prompt, the observation or the next assistant header;
- decoding each run of loss-masked tokens gives exactly the assistant text of that turn.

The first turn of every episode is scripted (a well-formed ``<search>`` call closed by
``<|im_end|>``), so that every episode has a real search observation; the later turns are
sampled. The scripted turn's log-probs come from the engine's scorer, so only the sampled turns
test the engine against the trainer.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_spear.env_runners.engines.base import GenerationEngine, GenerationOutput, SamplingConfig

TOL = 2e-3  # nats per token, float32 (measured: max |diff| 3.2e-5 over 136 tokens on CPU)


class FirstTurnScripted(GenerationEngine):
    """The first ``generate`` call returns a scripted completion for every prompt; later calls
    are sampled by ``inner``."""

    def __init__(self, inner, completions: list[list[int]]):
        self.inner, self.completions, self.calls = inner, completions, 0

    def generate(self, prompts, sampling, max_new_tokens=None):
        self.calls += 1
        if self.calls > 1:
            return self.inner.generate(prompts, sampling, max_new_tokens)
        outs = []
        for prompt, done in zip(prompts, self.completions):
            scores = self.inner.score([list(prompt) + done])[0]
            outs.append(GenerationOutput(list(done), scores[len(prompt):], "stop"))
        return outs

    def update_weights(self, state_dict, version):  # pragma: no cover - not used here
        raise NotImplementedError


@pytest.fixture(scope="module")
def rollout(smollm2_folder):
    import rllib_spear.envs as envs
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig

    eng = HFEngine(smollm2_folder)
    tok = eng.tokenizer
    tasks = envs.load_tasks("search_qa")[:2]
    calls = [f"<search>{t['queries'][0]}</search>" for t in tasks for _ in range(2)]
    scripted = [tok.encode(c, add_special_tokens=False) + [tok.eos_token_id] for c in calls]
    runner = MultiTurnRollout(
        FirstTurnScripted(eng, scripted), tok, lambda: envs.make_env("search_qa", top_k=2),
        SamplingConfig(max_new_tokens=12, seed=0),
        RolloutConfig(max_turns=3, max_model_len=1024, max_response_tokens=700, max_observation_tokens=256),
    )
    trajs, _ = runner.run(tasks, group_size=2)
    return tok, trajs, calls


def _learner_columns(trajs, pad):
    from rllib_spear.recipe.batching import LearnerRow, build_learner_batches

    rows = [LearnerRow(t, t.token_advantages(1.0), t.loss_mask()) for t in trajs]
    (cols,) = build_learner_batches(rows, num_learners=1, minibatch_size=None, t_norm=700.0, pad_token_id=pad)
    # the learner keeps groups together but may reorder them: map rows back by their tokens
    order = []
    for t in trajs:
        ids = t.input_ids()
        order.append(next(k for k in range(len(cols["input_ids"]))
                          if k not in order and np.array_equal(cols["input_ids"][k, : len(ids)], ids)
                          and cols["attention_mask"][k].sum() == len(ids)))
    return cols, order


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of every run of 1s."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


@pytest.mark.slow
def test_every_episode_has_an_observation_and_a_sampled_turn(rollout):
    tok, trajs, calls = rollout
    assert len(trajs) == 4
    for t, call in zip(trajs, calls):
        kinds = [s.kind for s in t.segments]
        assert kinds[:4] == ["prompt", "assistant", "observation", "assistant"], kinds
        assert tok.decode(t.segments[1].token_ids) == call + "<|im_end|>"
        assert "<information>" in tok.decode(t.segments[2].token_ids)


@pytest.mark.slow
def test_loss_mask_covers_assistant_tokens_and_im_end_only(rollout):
    tok, trajs, _ = rollout
    cols, order = _learner_columns(trajs, tok.pad_token_id)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    for t, k in zip(trajs, order):
        L = t.length
        mask, ids = cols["loss_mask"][k], cols["input_ids"][k]
        assert not mask[L:].any()  # padding
        prompt = t.segments[0].token_ids
        assert not mask[: len(prompt)].any()
        # the prompt is the system + user turns and the first assistant header, all unmasked
        text = tok.decode(prompt)
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
        runs = _runs(mask[:L])
        assistant = [s for s in t.segments if s.kind == "assistant"]
        assert len(runs) == len(assistant)
        pos = 0
        for seg in t.segments:
            n = len(seg.token_ids)
            assert (mask[pos: pos + n] == (1.0 if seg.kind == "assistant" else 0.0)).all(), seg.kind
            if seg.kind == "observation":
                obs = tok.decode(seg.token_ids)
                assert obs.startswith("\n<|im_start|>user\n<information>"), obs[:40]
                # the next assistant header closes the observation and is unmasked
                assert list(ids[pos + n - len(header): pos + n]) == header
            pos += n
        for (a, b), seg in zip(runs, assistant):
            assert list(ids[a:b]) == seg.token_ids
            if seg.token_ids[-1] == im_end:  # a turn that ended by itself: its <|im_end|> is trained on
                assert mask[b - 1] == 1.0
            assert im_end not in seg.token_ids[:-1]  # nothing sampled after the end of turn


@pytest.mark.slow
def test_masked_tokens_decode_to_the_assistant_texts(rollout):
    tok, trajs, _ = rollout
    cols, order = _learner_columns(trajs, tok.pad_token_id)
    for t, k in zip(trajs, order):
        runs = _runs(cols["loss_mask"][k][: t.length])
        texts = [tok.decode(cols["input_ids"][k][a:b], skip_special_tokens=True) for a, b in runs]
        assert texts == t.rollout.assistant_texts


@pytest.mark.slow
def test_engine_logprobs_equal_the_trainers(rollout, smollm2_folder):
    from transformers import AutoModelForCausalLM

    from rllib_spear.models.logprobs import token_logprobs

    tok, trajs, _ = rollout
    cols, order = _learner_columns(trajs, tok.pad_token_id)
    model = AutoModelForCausalLM.from_pretrained(smollm2_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = token_logprobs(model, torch.from_numpy(cols["input_ids"]),
                              torch.from_numpy(cols["attention_mask"])).numpy()
    mask = cols["loss_mask"] > 0
    assert np.array_equal(cols["old_logp"], cols["engine_logp"])  # no recomputed old log-probs
    diff = np.abs(logp - cols["engine_logp"])[mask]
    assert diff.max() < TOL, f"max |engine - trainer| = {diff.max():.2e} nats"
    # the sampled turns (not the scripted first one) are what tests the engine's log-probs
    sampled = 0
    for t, k in zip(trajs, order):
        pos = 0
        for seg in t.segments:
            if seg.kind == "assistant" and seg.step > 0:
                got = logp[k, pos: pos + len(seg.token_ids)]
                np.testing.assert_allclose(got, seg.logprobs, atol=TOL, rtol=0)
                sampled += len(seg.token_ids)
            pos += len(seg.token_ids)
    assert sampled >= 4  # at least one sampled token per episode
    assert (logp[cols["attention_mask"] == 0] == 0).all()  # padding scores 0
