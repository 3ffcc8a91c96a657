"""HFCausalLMRLModule: built from an RLModuleSpec, trains a step, ships torch tensors (bf16 too)."""
from __future__ import annotations

import pytest
import torch

from rllib_spear.models.logprobs import naive_token_logprobs
from rllib_spear.models.rl_module import HFCausalLMRLModule, hf_rl_module_spec


def _batch(vocab, B=2, T=16):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (B, T), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.fixture(scope="module")
def module(tiny_path):
    return hf_rl_module_spec(tiny_path, logprob_chunk_size=5).build()


def test_builds_from_spec_and_forward_train(module, tiny_path):
    assert isinstance(module, HFCausalLMRLModule)
    batch = _batch(module.model.config.vocab_size)
    out = module.forward_train(batch)
    assert set(out) == {"logp", "entropy"}
    assert out["logp"].shape == (2, 16) and out["entropy"].shape == (2, 16)
    assert out["logp"].requires_grad
    ref = naive_token_logprobs(module.model, batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(out["logp"], ref, atol=1e-5, rtol=0)
    assert torch.all(out["entropy"][:, 1:][batch["attention_mask"][:, 1:].bool() & batch["attention_mask"][:, :-1].bool()] > 0)


def test_trains_a_step(tiny_path):
    m = hf_rl_module_spec(tiny_path).build()
    batch = _batch(m.model.config.vocab_size)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    before = m.forward_train(batch)["logp"].detach()
    loss = -m.forward_train(batch)["logp"].sum()
    loss.backward()
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)
    opt.step()
    after = m.forward_inference(batch)["logp"]
    assert after[:, 1:].sum() > before[:, 1:].sum()  # the sequences became more likely


def test_state_roundtrip_bf16_torch_tensors(tiny_path):
    src = hf_rl_module_spec(tiny_path, dtype="bfloat16").build()
    with torch.no_grad():
        for p in src.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    state = src.get_state()
    assert state and all(isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 for v in state.values())
    assert all(v.device.type == "cpu" for v in state.values())
    assert "lm_head.weight" not in state  # tied: shipped once
    assert "model.embed_tokens.weight" in state  # HF names, no module prefix
    inf = src.get_state(inference_only=True)
    assert inf.keys() == state.keys()
    dst = hf_rl_module_spec(tiny_path, dtype="bfloat16", inference_only=True).build()
    dst.set_state(state)
    for (k, a), (k2, b) in zip(src.model.state_dict().items(), dst.model.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    # the state feeds an engine directly
    from rllib_spear.env_runners.engines.hf_engine import HFEngine

    eng = HFEngine(tiny_path)
    eng.update_weights(inf, version=3)
    assert eng.version == 3
    torch.testing.assert_close(eng.model.model.embed_tokens.weight, src.model.model.embed_tokens.weight.float())
    with pytest.raises(ValueError):
        dst.set_state({"nonexistent.weight": torch.zeros(1)})


def test_checkpoint_roundtrip(tiny_path, tmp_path):
    src = hf_rl_module_spec(tiny_path, dtype="bfloat16").build()
    with torch.no_grad():
        src.model.model.norm.weight.add_(0.5)
    src.save_to_path(tmp_path / "ckpt")
    dst = HFCausalLMRLModule.from_checkpoint(tmp_path / "ckpt")
    assert torch.equal(dst.model.model.norm.weight, src.model.model.norm.weight)
    assert dst.model.dtype == torch.bfloat16


def test_lora_trains_adapters_and_ships_merged_weights(tiny_path):
    lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "init_lora_weights": False}
    m = hf_rl_module_spec(tiny_path, lora=lora, gradient_checkpointing=True).build()
    trainable = [n for n, p in m.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    batch = _batch(m.model.config.vocab_size)
    m.forward_train(batch)["logp"].sum().backward()
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)
    merged = m.get_state(inference_only=True)
    assert not any("lora_" in k or "base_layer" in k for k in merged)
    inf = hf_rl_module_spec(tiny_path, lora=lora, inference_only=True).build()
    inf.set_state(merged)
    with torch.no_grad():
        a = m.forward_inference(batch)["logp"]
        b = inf.forward_inference(batch)["logp"]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    full = m.get_state()
    m2 = hf_rl_module_spec(tiny_path, lora=lora).build()
    m2.set_state(full)
    with torch.no_grad():
        torch.testing.assert_close(m2.forward_inference(batch)["logp"], a, atol=0, rtol=0)


def test_rllibs_own_rl_module_config_notice_is_filtered(caplog):
    """RLlib's RLModule.__init__ builds the deprecated RLModuleConfig itself: its notice (printed
    by every learner and runner) is dropped; other deprecation notices still show."""
    import logging

    import rllib_spear.models.rl_module  # noqa: F401  (installs the filter)
    from ray._common.deprecation import deprecation_warning

    with caplog.at_level(logging.WARNING, logger="ray._common.deprecation"):
        deprecation_warning(old="RLModule(config=[RLModuleConfig object])", new="RLModule(observation_space=..)")
        deprecation_warning(old="something_else()", new="other()")
    assert "RLModuleConfig" not in caplog.text and "something_else" in caplog.text
