"""Tiny-model factory and cold-start SFT (assistant-only loss, deterministic, cached)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from rllib_spear.models.factory import build_tiny_model, conversation_texts, synthetic_conversations
from rllib_spear.models.sft import cold_start_sft, sft_examples


@pytest.mark.parametrize("arch,heads", [("qwen2", 4), ("llama", 2)])
def test_build_tiny_model_loads_and_sizes(tmp_path, arch, heads):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    texts = conversation_texts(synthetic_conversations(60, seed=1))
    p = build_tiny_model(tmp_path / arch, texts, arch=arch, heads=heads, vocab_size=700, seed=3)
    cfg = json.loads((Path(p) / "config.json").read_text())
    assert cfg["model_type"] == arch and cfg["tie_word_embeddings"] is True
    assert cfg["head_dim"] == 128 // heads >= 32
    m = AutoModelForCausalLM.from_pretrained(p)
    tok = AutoTokenizer.from_pretrained(p)
    n = sum(x.numel() for x in m.parameters())
    assert 0.5e6 < n < 5e6
    assert m.config.vocab_size == len(tok) and tok.eos_token == "<|im_end|>"
    assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    # deterministic for a seed
    p2 = build_tiny_model(tmp_path / (arch + "2"), texts, arch=arch, heads=heads, vocab_size=700, seed=3)
    m2 = AutoModelForCausalLM.from_pretrained(p2)
    assert all(torch.equal(a, b) for a, b in zip(m.state_dict().values(), m2.state_dict().values()))


def test_head_dim_guard(tmp_path):
    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_model(tmp_path, ["a b c"] * 10, hidden=64, heads=4, vocab_size=300)


@pytest.fixture(scope="module")
def sft_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    convs = synthetic_conversations(24, seed=2)
    base = build_tiny_model(root / "base", conversation_texts(synthetic_conversations(200)), layers=2, vocab_size=512)
    return root, base, convs


def test_sft_examples_mask_only_assistant(sft_setup):
    from transformers import AutoTokenizer

    _, base, convs = sft_setup
    tok = AutoTokenizer.from_pretrained(base)
    ex = sft_examples(tok, convs, max_len=512)
    assert len(ex) == len(convs)
    for (ids, mask), conv in zip(ex, convs):
        want = "".join(m["content"] + "<|im_end|>" for m in conv if m["role"] == "assistant")
        assert tok.decode([i for i, k in zip(ids, mask) if k]) == want
    short = sft_examples(tok, convs, max_len=20)  # truncation removes every assistant token
    assert short == []


def _mean_nll(model, examples, assistant: bool = True) -> float:
    """Mean next-token NLL over the assistant tokens (or, ``assistant=False``, all the others)."""
    tot, n = 0.0, 0
    with torch.no_grad():
        for ids, mask in examples:
            x = torch.tensor([ids])
            lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
            lp = lp.gather(-1, x[0, 1:, None])[:, 0]
            m = torch.tensor(mask[1:], dtype=torch.bool)
            m = m if assistant else ~m
            tot += -lp[m].sum().item()
            n += int(m.sum())
    return tot / n


def test_sft_learns_deterministic_and_cached(sft_setup, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, base, convs = sft_setup
    kw = dict(epochs=1, lr=5e-3, seed=0, max_len=256, batch_size=8)
    a = cold_start_sft(base, convs, root / "a", **kw)
    b = cold_start_sft(base, convs, root / "b", **kw)
    assert Path(a).name == Path(b).name  # hash of inputs + params
    ma = AutoModelForCausalLM.from_pretrained(a)
    mb = AutoModelForCausalLM.from_pretrained(b)
    assert all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values()))
    # cached: same call returns the same folder without training again
    mtime = (Path(a) / "model.safetensors").stat().st_mtime
    assert cold_start_sft(base, convs, root / "a", **kw) == a
    assert (Path(a) / "model.safetensors").stat().st_mtime == mtime
    # it learned: assistant-token loss went down vs the base model
    tok = AutoTokenizer.from_pretrained(base)
    ex = sft_examples(tok, convs, 256)
    mbase = AutoModelForCausalLM.from_pretrained(base)
    assert _mean_nll(ma, ex) < _mean_nll(mbase, ex) - 1.0
    meta = json.loads((Path(a) / "sft_meta.json").read_text())
    assert meta["examples"] == len(convs) and meta["steps"] == 3


def test_sft_train_on_all_tokens(sft_setup):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, base, convs = sft_setup
    kw = dict(epochs=1, lr=5e-3, seed=0, max_len=256, batch_size=8)
    a = cold_start_sft(base, convs, root / "a", **kw)
    b = cold_start_sft(base, convs, root / "all", train_on="all", **kw)
    assert Path(a).name != Path(b).name  # part of the cache key
    tok = AutoTokenizer.from_pretrained(base)
    ex = sft_examples(tok, convs, 256)

    def nll_non_assistant(path):
        return _mean_nll(AutoModelForCausalLM.from_pretrained(path), ex, assistant=False)

    # only the all-token run learns the system/user/tool text
    assert nll_non_assistant(b) < nll_non_assistant(a) - 0.5
    with pytest.raises(ValueError, match="train_on"):
        cold_start_sft(base, convs, root / "x", train_on="user", **kw)


def test_reading_conversations_search_other_worlds(tmp_path):
    from rllib_spear.envs import load_tasks
    from rllib_spear.coldstart import DEFAULT_POLICY_RECIPE, reading_conversations

    recipe = dict(DEFAULT_POLICY_RECIPE, reading=dict(DEFAULT_POLICY_RECIPE["reading"], worlds=1))
    convs = reading_conversations(recipe, tmp_path)
    assert (tmp_path / "reading-worlds" / f"corpus-{recipe['reading']['world_seed']}.parquet").exists()
    assert len(convs) > 500
    assert all("<search>" in c[2]["content"] for c in convs)  # every demo searches
    # another world: same kind of questions, different facts
    own = {t["question"]: t["golden_answers"][0] for t in load_tasks("search_qa")}
    answers = {c[1]["content"].removeprefix("Question: "): c[-1]["content"] for c in convs}
    shared = [q for q in answers if q in own]
    assert shared and sum(f"<answer>{own[q]}</answer>" in answers[q] for q in shared) < 0.3 * len(shared)
    assert reading_conversations(dict(recipe, task="code_math"), tmp_path) == []
    assert reading_conversations(dict(recipe, reading=None), tmp_path) == []


def _labelled_batch(base, convs):
    """A right-padded batch of ``convs`` with labels on the assistant tokens (-100 elsewhere)."""
    from transformers import AutoTokenizer

    ex = sft_examples(AutoTokenizer.from_pretrained(base), convs, max_len=512)
    T = max(len(ids) for ids, _ in ex)
    ids = torch.zeros((len(ex), T), dtype=torch.long)
    att = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for r, (x, m) in enumerate(ex):
        ids[r, :len(x)] = torch.tensor(x)
        att[r, :len(x)] = 1
        labels[r, :len(x)] = torch.where(torch.tensor(m, dtype=torch.bool), torch.tensor(x), -100)
    return ids, att, labels


def test_sft_loss_equals_full_logits_cross_entropy_without_full_logits(sft_setup):
    """``sft_loss`` (the head on labelled positions only, 7 rows a chunk) equals the full-logits
    cross-entropy with ignore_index in value and every gradient (float32, 1e-6), and autograd
    saves no logits of more than one chunk's rows (the full-logits loss saves all of them)."""
    from transformers import AutoModelForCausalLM

    from rllib_spear.models.sft import sft_loss

    _, base, convs = sft_setup
    ids, att, labels = _labelled_batch(base, convs[:6])
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    vocab = model.config.vocab_size
    full_saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: full_saved.append(t.shape) or t, lambda t: t):
        logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits
        want = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1),
                                                 ignore_index=-100)
    want.backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        got = sft_loss(model, ids, att, labels, chunk_rows=7)
    got.backward()
    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want_grads[n], rtol=1e-5, atol=1e-6, msg=n)
    assert int((labels[:, 1:] != -100).sum()) > 7 * 3  # several chunks

    def logit_rows(shapes):  # the most positions of any saved tensor over the vocabulary
        return max((math.prod(s[:-1]) for s in shapes if len(s) and s[-1] == vocab), default=0)

    assert logit_rows(saved) <= 7 < logit_rows(full_saved), (logit_rows(saved), logit_rows(full_saved))


def test_sft_loss_refuses_a_batch_without_labels(sft_setup):
    from transformers import AutoModelForCausalLM

    from rllib_spear.models.sft import sft_loss

    _, base, convs = sft_setup
    ids, att, labels = _labelled_batch(base, convs[:2])
    with pytest.raises(ValueError, match="no labelled position"):
        sft_loss(AutoModelForCausalLM.from_pretrained(base), ids, att, torch.full_like(labels, -100))
