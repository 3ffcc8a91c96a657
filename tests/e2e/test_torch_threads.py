"""``torch_num_threads``: Ray starts actors with one torch thread; the option lifts the learner and
the env runners to the configured count (sampling and learning alternate, so a CPU machine can
give each phase every core)."""
from __future__ import annotations

import pytest
import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig

from e2e_helpers import small_config


def _runner_threads(algo) -> list[int]:
    return algo.env_runner_group.foreach_env_runner(lambda r: __import__("torch").get_num_threads(),
                                                    local_env_runner=False)


def test_torch_threads_reach_learner_and_runners(ray_session, tiny_model):
    before = torch.get_num_threads()
    algo = small_config(SPEARConfig, tiny_model, torch_num_threads=3).build_algo()
    try:
        assert _runner_threads(algo) == [3]
        assert torch.get_num_threads() == 3  # the local learner lives in this process
    finally:
        algo.stop()
        torch.set_num_threads(before)
    algo = small_config(SPEARConfig, tiny_model).build_algo()
    try:
        assert _runner_threads(algo) == [1]  # Ray's OMP_NUM_THREADS for a one-CPU actor
    finally:
        algo.stop()


def test_torch_threads_validated():
    with pytest.raises(ValueError, match="torch_num_threads"):
        SPEARConfig().training(torch_num_threads=0).validate()
