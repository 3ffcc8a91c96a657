"""``model_config["attn_implementation"]`` picks the learner's attention kernel (docs/design.md
"Packed micro-batches"): the RLModule's model (and the KL reference, its copy) is loaded with it,
and validate() refuses what cannot work, naming the key."""
from __future__ import annotations

import pytest
import torch

from rllib_spear import GRPOConfig
from rllib_spear.learner.module_layout import reference_model
from rllib_spear.models.hf_policy import load_causal_lm
from rllib_spear.models.rl_module import hf_rl_module_spec


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_the_module_loads_the_kernel_it_names(tiny_path, attn):
    module = hf_rl_module_spec(tiny_path, attn_implementation=attn).build()
    assert module.model.config._attn_implementation == attn
    assert reference_model(module.model, None).config._attn_implementation == attn


def test_the_default_is_transformers_own(tiny_path):
    assert hf_rl_module_spec(tiny_path).build().model.config._attn_implementation == "sdpa"


def test_flex_attention_scores_as_sdpa_does(tiny_path):
    """flex_attention forward on CPU (torch has no CPU backward for it): same log-probs as sdpa."""
    from rllib_spear.models.logprobs import token_logprobs

    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    out = {}
    for attn in ("sdpa", "flex_attention"):
        model = load_causal_lm(tiny_path, attn_implementation=attn).eval()
        assert model.config._attn_implementation == attn
        with torch.no_grad():
            out[attn] = token_logprobs(model, ids, mask)
    assert torch.allclose(out["sdpa"], out["flex_attention"], atol=1e-5)


@pytest.mark.parametrize("attn, packed, match", [
    (3, False, r"`model_config\['attn_implementation'\]` must be a transformers attention name"),
    ("", False, r"`model_config\['attn_implementation'\]` must be"),
    ("flash_attention_2", True, r"`packed_microbatches=True`.*'flash_attention_2'.*packed_microbatches=False"),
])
def test_validate_refuses_what_cannot_work(attn, packed, match):
    cfg = (GRPOConfig().rl_module(model_config={"model_path": "embedded", "attn_implementation": attn})
           .learners(packed_microbatches=packed))
    with pytest.raises(ValueError, match=match):
        cfg.validate(check_files=False)


def test_validate_accepts_a_packable_kernel():
    GRPOConfig().rl_module(model_config={"model_path": "embedded", "attn_implementation": "flex_attention"}).learners(
        packed_microbatches=True).validate(check_files=False)
