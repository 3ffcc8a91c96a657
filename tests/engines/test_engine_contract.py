"""The engine contract (rllib_spear.testing.check_engine_contract) on every engine: HF always,
vLLM where ``vllm.LLM`` starts (the fixture skips otherwise). A new engine is covered by adding
its fixture name to ENGINES."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from rllib_spear.testing import ContractError, check_engine_contract, check_engine_weight_update

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


def test_the_contract_checks_agenerate_too(hf_engine, chat_prompts):
    """An engine whose batched path is right but whose ``agenerate`` ignores the request's cap,
    or stamps a version it does not serve, fails the contract."""
    from rllib_spear.env_runners.engines.base import GenerationEngine, GenerationOutput

    class Engine(GenerationEngine):
        def __init__(self, fault):
            self.fault = fault

        def generate(self, prompts, sampling, max_new_tokens=None):
            caps = max_new_tokens or [sampling.max_new_tokens] * len(prompts)
            return [GenerationOutput([5] * int(c), [-0.5] * int(c), "length") for c in caps]

        async def agenerate(self, prompt, sampling, max_new_tokens, seed=None):
            (out,) = self.generate([prompt], sampling, [max_new_tokens])
            if self.fault == "cap":
                out = GenerationOutput(out.token_ids * 2, out.logprobs * 2, "length")
            if self.fault == "version":
                out.policy_version = self.version + 1
            return out

        def update_weights(self, state_dict, version):
            self.version = version

    check_engine_contract(Engine(None), chat_prompts[:3])
    with pytest.raises(ContractError, match=r"agenerate\(\): generated"):
        check_engine_contract(Engine("cap"), chat_prompts[:3])
    with pytest.raises(ContractError, match="stamped versions"):
        check_engine_contract(Engine("version"), chat_prompts[:3])
