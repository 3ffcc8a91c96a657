"""The single-process parts of models.sharding (the collectives are exercised by
tests/e2e/test_fsdp_learner.py on gloo)."""
from __future__ import annotations

import torch

from rllib_spear.models import sharding


def test_transformer_blocks_are_the_decoder_layers(tiny_path):
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(tiny_path)
    blocks = sharding.transformer_blocks(lm)
    assert blocks == list(lm.model.layers) and len(blocks) == lm.config.num_hidden_layers


def test_transformer_blocks_fallback_to_the_longest_module_list():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.short = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])
            self.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(3)])

    net = Net()
    assert sharding.transformer_blocks(net) == list(net.layers)


def test_global_norm_and_clip_by_hand():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    norm = sharding.global_grad_norm([a.grad, b.grad])
    assert float(norm) == 5.0  # sqrt(3^2 + 4^2)
    sharding.clip_grads_([a, b], 1.0, norm)  # g * 1 / (5 + 1e-6)
    assert torch.allclose(a.grad, torch.tensor([0.6, 0.0]), atol=1e-6)
    assert torch.allclose(b.grad, torch.tensor([0.8]), atol=1e-6)
    sharding.clip_grads_([a, b], 10.0, sharding.global_grad_norm([a.grad, b.grad]))  # under the cap
    assert torch.allclose(b.grad, torch.tensor([0.8]), atol=1e-6)


def test_iter_full_state_and_local_bytes():
    state = {"w": torch.ones(2, 3), "b": torch.zeros(3, dtype=torch.float64)}
    kept = dict(sharding.iter_full_state(state, keep=True, dtype=torch.bfloat16))
    assert kept["w"].dtype == torch.bfloat16 and kept["w"].data_ptr() != state["w"].data_ptr()
    assert dict(sharding.iter_full_state(state, keep=False)) == {"w": None, "b": None}
    assert sharding.local_bytes([state["w"], state["b"], None]) == 6 * 4 + 3 * 8
    assert not sharding.is_sharded(torch.nn.Linear(2, 2))
