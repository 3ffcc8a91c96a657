"""Engine-test fixtures: one tiny model, one HF engine and (if vLLM works) one vLLM engine per
session."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path(tmp_path_factory.mktemp("engines_tiny"))


@pytest.fixture(scope="session")
def hf_engine(tiny_path):
    from rllib_spear.env_runners.engines.hf_engine import HFEngine

    return HFEngine(tiny_path)


@pytest.fixture(scope="session")
def chat_prompts(hf_engine):
    from rllib_spear.models.factory import synthetic_conversations

    tok = hf_engine.tokenizer
    convs = synthetic_conversations(6, seed=11)
    prompts = []
    for i, c in enumerate(convs):
        msgs = c[:2] if i % 2 == 0 else c[1:2]  # different lengths -> left padding in the batch
        prompts.append(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
    return [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]


@pytest.fixture(scope="session")
def vllm_engine(tiny_path):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from rllib_spear.env_runners.engines.vllm_engine import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(f"vLLM tests skipped: {why}")
    from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine

    try:  # the BM25 retriever imports numba/llvmlite, which broke vLLM-cpu's LLM() (worked around)
        import llvmlite.binding  # noqa: F401
    except Exception:
        pass
    try:
        eng = VLLMEngine(tiny_path, dtype="float32", seed=0, max_model_len=1024)
    except Exception as e:  # pragma: no cover - depends on the machine
        if os.environ.get("RLLIB_SPEAR_REQUIRE_VLLM") == "1":
            raise  # CI on a machine where vLLM must work: a start-up failure is a test failure
        pytest.skip(f"vLLM tests skipped: vllm.LLM could not start here: {type(e).__name__}: {e}")
    yield eng
    eng.shutdown()
