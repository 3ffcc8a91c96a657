"""Shared fixtures: every test of tests/envs uses a private cache directory (generated data and BM25
index), so the suite is independent of ~/.cache and of other test runs."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

_CACHE = tempfile.mkdtemp(prefix="rllib_spear_test_cache_")
os.environ["RLLIB_SPEAR_CACHE"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)
os.environ.pop("RLLIB_SPEAR_DATA_DIR", None)


@pytest.fixture(scope="session")
def data_paths():
    from rllib_spear.data import default_paths

    return default_paths()


@pytest.fixture(scope="session")
def sqa_tasks(data_paths):
    from rllib_spear.envs import load_tasks

    return load_tasks("search_qa", "train") + load_tasks("search_qa", "test")


@pytest.fixture(scope="session")
def multi_tasks(data_paths):
    from rllib_spear.envs import load_tasks

    return load_tasks("multi_answer_search", "train") + load_tasks("multi_answer_search", "test")
