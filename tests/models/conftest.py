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
