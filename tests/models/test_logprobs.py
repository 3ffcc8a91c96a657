"""Chunked token log-probs equal the naive full-logits computation, values and gradients."""
from __future__ import annotations

import pytest
import torch

from rllib_spear.models.logprobs import naive_token_logprobs, token_logprobs


@pytest.fixture(scope="module")
def model(tiny_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)


def _batch(vocab, B=3, T=29, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, T), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :6] = 0  # left padded
    mask[2, 21:] = 0  # right padded
    return ids, mask


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("chunk_size,temperature", [(1, 1.0), (7, 1.0), (8, 0.7), (1000, 1.3)])
def test_chunked_equals_naive_values_and_grads(model, chunk_size, temperature):
    ids, mask = _batch(model.config.vocab_size)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    model.zero_grad()
    lp, ent = token_logprobs(model, ids, mask, temperature=temperature, chunk_size=chunk_size, return_entropy=True)
    ((lp * w).sum() + 0.5 * (ent * w).sum()).backward()
    g_chunk = _grads(model)
    model.zero_grad()
    lp_n, ent_n = naive_token_logprobs(model, ids, mask, temperature=temperature, return_entropy=True)
    ((lp_n * w).sum() + 0.5 * (ent_n * w).sum()).backward()
    g_naive = _grads(model)
    model.zero_grad()
    assert lp.shape == ids.shape and ent.shape == ids.shape and lp.dtype == torch.float32
    torch.testing.assert_close(lp, lp_n, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent_n, atol=1e-5, rtol=0)
    assert g_chunk.keys() == g_naive.keys() and len(g_chunk) > 0
    for n in g_naive:
        torch.testing.assert_close(g_chunk[n], g_naive[n], atol=1e-5, rtol=1e-4, msg=n)


def test_alignment_and_zeros(model):
    ids, mask = _batch(model.config.vocab_size)
    lp = token_logprobs(model, ids, mask, chunk_size=5)
    assert torch.all(lp[:, 0] == 0)
    assert torch.all(lp[0, :7] == 0)  # padding and the first real token of a left-padded row
    assert torch.all(lp[2, 21:] == 0)
    assert torch.all(lp[1, 1:] < 0)
    # position t is log p(x_t | x_<t): check one entry by hand
    with torch.no_grad():
        logits = model(input_ids=ids[1:2, :10]).logits[0, 8]
    torch.testing.assert_close(lp[1, 9], torch.log_softmax(logits.float(), -1)[ids[1, 9]], atol=1e-5, rtol=0)


def test_left_padding_does_not_change_logprobs(model):
    ids, mask = _batch(model.config.vocab_size)
    lp = token_logprobs(model, ids, mask)
    alone = token_logprobs(model, ids[0:1, 6:], torch.ones_like(ids[0:1, 6:]))
    torch.testing.assert_close(lp[0, 6:], alone[0], atol=1e-5, rtol=0)


def test_no_grad_path_matches(model):
    ids, mask = _batch(model.config.vocab_size)
    with torch.no_grad():
        a = token_logprobs(model, ids, mask, chunk_size=4)
    b = token_logprobs(model, ids, mask, chunk_size=4)
    assert not a.requires_grad and b.requires_grad
    torch.testing.assert_close(a, b.detach(), atol=0, rtol=0)


def test_lora_wrapped_model_grads(tiny_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    ids, mask = _batch(base.config.vocab_size)
    token_logprobs(pm, ids, mask, chunk_size=6).sum().backward()
    g1 = _grads(pm)
    pm.zero_grad()
    naive_token_logprobs(pm, ids, mask).sum().backward()
    g2 = _grads(pm)
    assert g1 and all("lora_" in n for n in g1)
    for n in g2:
        torch.testing.assert_close(g1[n], g2[n], atol=1e-5, rtol=1e-4)
