"""The engine contract (rllib_spear.testing.check_engine_contract) on every engine: HF always,
vLLM where ``vllm.LLM`` starts (the fixture skips otherwise). A new engine is covered by adding
its fixture name to ENGINES."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rllib_spear.testing import check_engine_contract, check_engine_weight_update

ENGINES = ["hf_engine", pytest.param("vllm_engine", marks=pytest.mark.vllm)]


@pytest.mark.parametrize("engine_fixture", ENGINES)
def test_engine_contract(request, engine_fixture, chat_prompts, tiny_path):
    engine = request.getfixturevalue(engine_fixture)
    check_engine_contract(engine, chat_prompts[:3], who=engine_fixture)
    # the same weights again: the version moves, the samples do not change
    state = {k: torch.as_tensor(v) for k, v in load_file(f"{tiny_path}/model.safetensors").items()}
    version = engine.version
    try:
        check_engine_weight_update(engine, state, who=engine_fixture)
    finally:
        engine.update_weights(state, version)  # leave the session fixture as it was
    check_engine_contract(engine, chat_prompts[:3], who=engine_fixture)
