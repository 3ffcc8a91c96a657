"""The learner's AdamW: fused on CPU, and numerically the default (for-loop) AdamW."""
from __future__ import annotations

import torch

from rllib_spear.learner.optim import adamw_implementation, build_adamw


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 32), (32,), (7, 5, 3), (1,)]
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _run(make, steps=20):
    params = _params()
    opt = make(params)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return [p.detach() for p in params], opt


def test_fused_on_cpu_equals_default_adamw_within_1e_6():
    kw = dict(lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01)
    ours, opt = _run(lambda ps: build_adamw(ps, **kw))
    ref, _ = _run(lambda ps: torch.optim.AdamW(ps, foreach=False, **kw))
    assert adamw_implementation(opt) == "fused"  # torch >= 2.4 has the CPU kernel
    moved = max(float((a - b).abs().max()) for a, b in zip(ours, _params()))
    assert moved > 1e-2  # 20 steps of lr 1e-3 move the weights: the comparison is not vacuous
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_sharded_takes_the_fused_kernel_too():
    # FSDP2 shards (CPU-offloaded ones above all) step with the fused kernel; two gloo ranks
    # against one default AdamW: tests/models/test_cpu_offload.py
    opt = build_adamw(_params(), lr=1.0, betas=(0.9, 0.999), weight_decay=0.0, sharded=True)
    assert adamw_implementation(opt) == "fused"


def test_a_refused_fused_kernel_falls_back_to_foreach(monkeypatch):
    real = torch.optim.AdamW

    def refusing(params, **kw):  # what torch raises for a device without the fused kernel
        if kw.get("fused"):
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return real(params, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", refusing)
    opt = build_adamw(_params(), lr=1.0, betas=(0.9, 0.999), weight_decay=0.0)
    assert adamw_implementation(opt) == "foreach"
