"""The weight-sync transport contract (``rllib_spear.testing.check_transport_contract``) over
every registered transport: one Ray cluster, one algorithm per engine kind (HF runners holding
bf16 weights beside fp32 learners, so that the dtype check bites; a vLLM runner for the
transports that need vLLM). A new transport is covered by registering it."""
from __future__ import annotations

import os

import pytest

from rllib_spear.testing import check_transport_contract
from rllib_spear.weight_streaming import TRANSPORTS

_RAY_INIT = dict(num_cpus=2, include_dashboard=False,
                 runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": "lo", "RAY_AUTH_MODE": "disabled"}})


def _names(engine: str) -> list[str]:
    return [n for n, cls in TRANSPORTS.items() if (cls.requires_engine or "hf") == engine]


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(**_RAY_INIT)
    yield ray
    ray.shutdown()


def _build(engine: str, engine_kwargs: dict):
    from rllib_spear import GRPOConfig
    from rllib_spear.models.factory import tiny_model_path

    cfg = (GRPOConfig().environment("search_qa")
           .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5, max_new_tokens=16, max_turns=2,
                        max_model_len=512, max_response_tokens=256, engine=engine, engine_kwargs=engine_kwargs)
           .training(group_size=4, tasks_per_iteration=2, response_filters=(), group_filter_keep_fraction=None)
           .rl_module(model_config={"model_path": tiny_model_path()})
           .fault_tolerance(restart_failed_env_runners=True, delay_between_env_runner_restarts_s=0)
           .debugging(seed=0))
    return cfg.build_algo()


@pytest.fixture(scope="module")
def hf_algo(ray_cluster):
    algo = _build("hf", {"dtype": "bfloat16"})
    yield algo
    algo.stop()


@pytest.fixture(scope="module")
def vllm_algo(ray_cluster):
    from rllib_spear.env_runners.engines.vllm_engine import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    try:
        algo = _build("vllm", {"dtype": "float32"})
    except Exception as e:  # pragma: no cover - depends on the machine
        if os.environ.get("RLLIB_SPEAR_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(f"vLLM runner could not start here: {type(e).__name__}: {e}")
    yield algo
    algo.stop()


@pytest.mark.parametrize("name", _names("hf"))
def test_transport_contract(hf_algo, name):
    check_transport_contract(name, hf_algo)


@pytest.mark.vllm
@pytest.mark.parametrize("name", _names("vllm"))
def test_vllm_transport_contract(vllm_algo, name):
    check_transport_contract(name, vllm_algo)
