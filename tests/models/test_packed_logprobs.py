"""Packed scoring (``token_logprobs(packed=True)``, models/packing.py) equals the padded one.

A tiny random Qwen2 in float32 scores ragged rows (left- or right-padded, one row of a single
token) with score masks that skip the prompt and an observation segment: the packed log-probs,
entropies and the gradient of every parameter equal the padded ones within 1e-5. Two checks
that the equality comes from the block-diagonal mask transformers builds from the restarting
positions: without those positions, or with transformers' packed-sequence detection switched
off, the numbers differ (cross-row attention leaks)."""
from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from rllib_spear.models import packing, varlen_attention
from rllib_spear.models.logprobs import token_logprobs

LENGTHS = (23, 17, 1, 9, 12)  # real tokens per row; one row of a single token
T = 24


def _load(tiny_path, attn):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, attn_implementation=attn)


@pytest.fixture(scope="module", params=["sdpa", "eager", "sdpa_varlen"])
def model(request, tiny_path):
    return _load(tiny_path, request.param)


def _batch(vocab: int, side: str, seed: int = 0):
    """ids, attention mask, score mask [B, T]: the score mask skips each row's first 4 real
    tokens (the prompt) and real tokens 8..10 (an observation), as a learner's loss mask does."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (len(LENGTHS), T), generator=g)
    mask = torch.zeros_like(ids)
    score = torch.zeros_like(ids, dtype=torch.bool)
    for b, L in enumerate(LENGTHS):
        cols = torch.arange(T - L, T) if side == "left" else torch.arange(L)
        mask[b, cols] = 1
        k = torch.arange(L)
        score[b, cols] = (k >= 4) & ~((k >= 8) & (k <= 10))
    ids = ids.masked_fill(mask == 0, 0)  # the pad id
    return ids, mask, score


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _score(model, ids, mask, score, w, *, packed, **kw):
    model.zero_grad()
    lp, ent = token_logprobs(model, ids, mask, score_mask=score, return_entropy=True, packed=packed, **kw)
    ((lp * w).sum() + 0.3 * (ent * w).sum()).backward()
    out = (lp.detach(), ent.detach(), _grads(model))
    model.zero_grad()
    return out


# ---------------------------------------------------------------------------- the tensor helpers
def test_pack_rows_restarts_positions_and_unpack_inverts_it():
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 0, 0, 0], [4, 0, 0, 0, 0]])
    mask = (ids > 0).long()
    rows = packing.pack_rows(ids, mask)
    assert rows.input_ids.tolist() == [[5, 6, 7, 8, 9, 4]]
    assert rows.position_ids.tolist() == [[0, 1, 2, 0, 1, 0]]
    assert rows.num_tokens == 6
    back = packing.unpack_rows(rows.input_ids.unsqueeze(-1).float(), rows.real)
    assert back.shape == (3, 5, 1)
    assert torch.equal(back[..., 0].long(), ids)
    with pytest.raises(ValueError, match="one packed row"):
        packing.unpack_rows(torch.zeros(1, 5, 2), rows.real)


# ---------------------------------------------------------------------------- packed == padded
@pytest.mark.parametrize("side", ["left", "right"])
def test_packed_equals_padded_values_and_gradients(model, side):
    ids, mask, score = _batch(model.config.vocab_size, side)
    w = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    lp, ent, g = _score(model, ids, mask, score, w, packed=False, chunk_size=3)
    lp_p, ent_p, g_p = _score(model, ids, mask, score, w, packed=True, chunk_size=3)
    assert int((lp != 0).sum()) == int(score.sum())  # every scored position holds a log-prob
    torch.testing.assert_close(lp_p, lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_p, ent, atol=1e-5, rtol=0)
    assert g_p.keys() == g.keys() == {n for n, _ in model.named_parameters()}
    for n in g:
        torch.testing.assert_close(g_p[n], g[n], atol=1e-5, rtol=0, msg=n)


def test_packed_entropy_sample_and_no_grad_scoring_equal_padded(model):
    """The learner's other two calls: the entropy metric's detached sample, and logp_old under
    no_grad (a sample off the scored positions takes its own head pass)."""
    ids, mask, score = _batch(model.config.vocab_size, "right", seed=2)
    sample = torch.zeros_like(score)
    sample[:, ::3] = True
    with torch.no_grad():
        for kw in (dict(entropy_mask=sample & score), dict(entropy_mask=sample)):
            lp, ent = token_logprobs(model, ids, mask, score_mask=score, **kw)
            lp_p, ent_p = token_logprobs(model, ids, mask, score_mask=score, packed=True, **kw)
            torch.testing.assert_close(lp_p, lp, atol=1e-5, rtol=0)
            torch.testing.assert_close(ent_p, ent, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------- the mask is real
def _max_diff_to_padded(model, side="right") -> float:
    ids, mask, score = _batch(model.config.vocab_size, side)
    with torch.no_grad():
        lp = token_logprobs(model, ids, mask, score_mask=score)
        lp_p = token_logprobs(model, ids, mask, score_mask=score, packed=True)
    return float((lp_p - lp).abs().max())


def test_packing_without_restarting_positions_leaks(model, monkeypatch):
    """One position range over the whole packed row: transformers sees one document, rows attend
    to the rows before them (and RoPE shifts), and the log-probs move."""
    assert _max_diff_to_padded(model) < 1e-5
    real_pack = packing.pack_rows

    def one_document(input_ids, attention_mask):
        rows = real_pack(input_ids, attention_mask)
        return packing.PackedRows(rows.input_ids, torch.arange(rows.num_tokens).unsqueeze(0), rows.real)

    monkeypatch.setattr(packing, "pack_rows", one_document)
    assert _max_diff_to_padded(model) > 1e-2


def test_the_block_diagonal_mask_comes_from_transformers(model, monkeypatch):
    """Right positions, but transformers' packed-sequence detection switched off: a plain causal
    mask over the packed row lets later rows attend to earlier ones, and the log-probs move. So
    the equality above is the document mask's, not a coincidence of the positions."""
    from transformers import masking_utils

    if model.config._attn_implementation == varlen_attention.VARLEN_ATTENTION:
        # sdpa_varlen builds no mask: its own split is what to switch off (one document)
        monkeypatch.setattr(varlen_attention, "document_bounds", lambda position_ids: [0, position_ids.shape[-1]])
    else:
        monkeypatch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    assert _max_diff_to_padded(model) > 1e-2


def test_varlen_attention_splits_the_documents(tiny_path, monkeypatch):
    """sdpa_varlen: every attention call of a packed forward is one document's causal SDPA, with
    no mask tensor (5 rows x 2 layers = 10 calls); treated as one document, the rows attend to
    each other and the log-probs move (so the equality above is the split's)."""
    import torch.nn.functional as F

    model = _load(tiny_path, varlen_attention.VARLEN_ATTENTION)
    real_sdpa, calls = F.scaled_dot_product_attention, []

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((q.shape[2], attn_mask is None, kw.get("is_causal")))
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    assert _max_diff_to_padded(model) < 1e-5
    packed_calls = [c for c in calls if c[1] and c[2]]
    layers = model.config.num_hidden_layers
    assert sorted(n for n, _, _ in packed_calls) == sorted(list(LENGTHS) * layers)  # one call per row and layer
    monkeypatch.setattr(varlen_attention, "document_bounds", lambda position_ids: [0, position_ids.shape[-1]])
    assert _max_diff_to_padded(model) > 1e-2


def test_document_bounds_follow_restarting_positions():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1, 2, 3]])
    assert varlen_attention.document_bounds(pos) == [0, 3, 5, 6, 10]
    assert varlen_attention.document_bounds(torch.arange(7).unsqueeze(0)) == [0, 7]
    assert varlen_attention.document_bounds(torch.tensor([[5, 6, 9, 10]])) == [0, 2, 4]  # a jump also starts one


@pytest.mark.slow
def test_flex_attention_packed_forward_equals_padded_sdpa(tiny_path):
    """flex_attention (a BlockMask from the packed positions; CPU: forward only, torch has no
    CPU backward for it, and its first call compiles for about half a minute)."""
    flex, sdpa = _load(tiny_path, "flex_attention"), _load(tiny_path, "sdpa")
    ids, mask, score = _batch(sdpa.config.vocab_size, "left")
    with torch.no_grad():
        lp = token_logprobs(sdpa, ids, mask, score_mask=score)
        lp_p = token_logprobs(flex, ids, mask, score_mask=score, packed=True)
    torch.testing.assert_close(lp_p, lp, atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------- refusals
class _Body(nn.Module):
    pass


def _fake_lm(attn: str) -> nn.Module:
    lm = nn.Module()
    lm.config = types.SimpleNamespace(_attn_implementation=attn)
    lm.base_model_prefix = "model"
    lm.model = _Body()
    return lm


def test_check_packable_refuses_other_attention_and_custom_masks(model):
    packing.check_packable(model)
    with pytest.raises(ValueError, match=r"packed_microbatches.*'flash_attention_2'"):
        packing.check_packable(_fake_lm("flash_attention_2"))
    with pytest.raises(ValueError, match=r"packed_microbatches.*create_causal_mask.*_Body"):
        packing.check_packable(_fake_lm("sdpa"))


def test_packed_scoring_refuses_explicit_positions(model):
    ids, mask, _ = _batch(model.config.vocab_size, "right")
    with pytest.raises(ValueError, match="position_ids=None"):
        token_logprobs(model, ids, mask, packed=True, position_ids=torch.zeros_like(ids))


def _fake_jagged_sdpa(real_sdpa):
    """A stand-in for torch's CUDA jagged kernel (CPU has no causal jagged SDPA): each component
    of the jagged inputs through the dense kernel, re-nested at the same offsets."""
    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        if not q.is_nested:
            return real_sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)
        outs = [real_sdpa(a[None], b[None], c[None], is_causal=is_causal, scale=scale)[0]  # [H, L, d]
                for a, b, c in zip(q.unbind(), k.unbind(), v.unbind())]
        values = torch.cat([o.transpose(0, 1) for o in outs])  # [N, H, d]
        return torch.nested.nested_tensor_from_jagged(values, q.offsets()).transpose(1, 2)
    return sdpa


def test_nested_path_places_each_document(monkeypatch):
    """The GPU path's plumbing (jagged tensors from the packed row's offsets and back), checked on
    CPU with the jagged kernel stood in for: the same output as one SDPA call per document."""
    g = torch.Generator().manual_seed(0)
    bounds = [0, 5, 6, 13, 20]
    q, k, v = (torch.randn(1, 4, 20, 8, generator=g, requires_grad=True) for _ in range(3))
    w = torch.randn(1, 20, 4, 8, generator=g)
    loop = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True) for s, e in zip(bounds[:-1], bounds[1:])], 2)
    loop_grads = torch.autograd.grad((loop.transpose(1, 2) * w).sum(), (q, k, v))
    monkeypatch.setattr(varlen_attention.F, "scaled_dot_product_attention",
                        _fake_jagged_sdpa(torch.nn.functional.scaled_dot_product_attention))
    out = varlen_attention.nested_causal_sdpa(q, k, v, bounds)
    assert out.shape == (1, 20, 4, 8)
    torch.testing.assert_close(out, loop.transpose(1, 2), atol=1e-6, rtol=0)
    for a, b in zip(torch.autograd.grad((out * w).sum(), (q, k, v)), loop_grads):  # gradients flow back too
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert not varlen_attention.use_nested(q)  # CPU float32: one call per document


def test_a_failing_nested_kernel_falls_back_to_the_exact_loop(tiny_path, monkeypatch, caplog):
    model = _load(tiny_path, varlen_attention.VARLEN_ATTENTION)
    monkeypatch.setattr(varlen_attention, "use_nested", lambda query: not varlen_attention._nested_failed)
    monkeypatch.setattr(varlen_attention, "_nested_failed", False)

    def no_kernel(*a, **kw):
        raise RuntimeError("No viable backend for scaled_dot_product_attention was found.")

    monkeypatch.setattr(varlen_attention, "nested_causal_sdpa", no_kernel)
    assert _max_diff_to_padded(model) < 1e-5
    assert varlen_attention._nested_failed and "one SDPA call per document" in caplog.text


def test_a_varlen_model_generates_as_sdpa_does(tiny_path):
    """Generation (a KV cache: keys longer than queries, one-token steps) falls through to
    transformers' sdpa, so a model loaded with sdpa_varlen samples what an sdpa one does."""
    varlen, sdpa = _load(tiny_path, varlen_attention.VARLEN_ATTENTION), _load(tiny_path, "sdpa")
    ids = torch.randint(3, sdpa.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a = varlen.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
        b = sdpa.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(a, b)
