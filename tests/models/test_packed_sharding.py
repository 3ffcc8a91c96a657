"""Packed scoring through an FSDP2-sharded LM: ``token_logprobs(packed=True)`` reaches the
sharded root's ``score_tokens`` method (models/sharding.py) and gives the padded log-probs and
gradients (float32, one gloo rank)."""
from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from rllib_spear.models.logprobs import token_logprobs


@pytest.fixture()
def one_rank():
    if dist.is_initialized():
        pytest.skip("a process group is already running in this process")
    store = os.path.join(tempfile.mkdtemp(prefix="packed_fsdp_"), "store")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_sharded_packed_equals_padded(tiny_path, one_rank):
    from transformers import AutoModelForCausalLM

    from rllib_spear.models.sharding import SCORING_METHOD, full_tensor, shard_causal_lm

    lm = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    shard_causal_lm(lm)
    assert hasattr(lm, SCORING_METHOD)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, lm.config.vocab_size, (3, 20), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :7] = 0  # left padded
    mask[2, 11:] = 0  # right padded
    score = mask.bool() & (torch.arange(20) % 4 != 0)
    w = torch.randn(ids.shape, generator=g)
    out = {}
    for packed in (False, True):
        lm.zero_grad()
        lp = token_logprobs(lm, ids, mask, score_mask=score, chunk_size=2, packed=packed)
        (lp * w).sum().backward()
        out[packed] = lp.detach(), {n: full_tensor(p.grad).clone() for n, p in lm.named_parameters()}
    torch.testing.assert_close(out[True][0], out[False][0], atol=1e-5, rtol=0)
    for n, grad in out[False][1].items():
        torch.testing.assert_close(out[True][1][n], grad, atol=1e-5, rtol=0, msg=n)
