"""The Ray-free model loader and forward pass of the learner's module (models/hf_policy.py)."""
from __future__ import annotations

import pytest
import torch

from rllib_spear.models.hf_policy import load_causal_lm, score_batch
from rllib_spear.models.logprobs import naive_token_logprobs


def _config():
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                       max_position_embeddings=64)


def test_random_init_from_a_config_with_checkpointing_and_dtype():
    model = load_causal_lm(config=_config(), dtype="bf16", gradient_checkpointing=True)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.is_gradient_checkpointing and model.config.use_cache is False


def test_empty_builds_on_the_meta_device_and_lora_wraps():
    assert next(load_causal_lm(config=_config(), empty=True).parameters()).device.type == "meta"
    lora = load_causal_lm(config=_config(), lora={"r": 4, "target_modules": ["q_proj"]}, gradient_checkpointing=True)
    trainable = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)


def test_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one"):
        load_causal_lm()
    with pytest.raises(ValueError, match="exactly one"):
        load_causal_lm("some/folder", config=_config())


def test_score_batch_outputs_follow_the_batch_switches():
    torch.manual_seed(0)
    model = load_causal_lm(config=_config()).eval()
    ids = torch.randint(0, 64, (2, 9))
    mask = torch.ones_like(ids)
    loss = torch.zeros(2, 9)
    loss[:, 4:] = 1
    ref = naive_token_logprobs(model, ids, mask)
    full = score_batch(model, {"input_ids": ids, "attention_mask": mask}, device=torch.device("cpu"))
    assert set(full) == {"logp", "entropy"} and torch.allclose(full["logp"], ref, atol=1e-5)
    only_loss = score_batch(model, {"input_ids": ids, "attention_mask": mask, "_score_mask": loss > 0,
                                    "_need_entropy": False}, device=torch.device("cpu"))
    assert set(only_loss) == {"logp"}
    assert torch.allclose(only_loss["logp"][:, 4:], ref[:, 4:], atol=1e-5) and not only_loss["logp"][:, :4].any()
    pick = torch.zeros(2, 9, dtype=torch.bool)
    pick[0, 5] = True
    sampled = score_batch(model, {"input_ids": ids, "_need_entropy": False, "_entropy_mask": pick},
                          device=torch.device("cpu"))
    assert set(sampled) == {"logp", "entropy_sample"}
