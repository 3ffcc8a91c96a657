"""Env-runner placement (rllib_spear/env_runners/placement.py, docs/design.md "Cluster placement"):
a vLLM runner with tensor_parallel_size k requests k GPUs, in RLlib's actor options and in its
placement-group bundle; a conflicting num_gpus_per_env_runner is refused by validate()."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig
from rllib_spear.env_runners.placement import (
    engine_world_size, required_runner_gpus, runner_bundle, runner_engine_kwargs,
)


def _vllm(tp=None, gpus=None, **ek):
    if tp is not None:
        ek["tensor_parallel_size"] = tp
    cfg = SPEARConfig().env_runners(engine="vllm", engine_kwargs=ek, num_env_runners=2)
    if gpus is not None:
        cfg = cfg.env_runners(num_gpus_per_env_runner=gpus)
    return cfg


def test_world_size_and_required_gpus():
    assert engine_world_size("hf", {"tensor_parallel_size": 4}) == 1
    assert engine_world_size("vllm", {}) == 1
    assert engine_world_size("vllm", {"tensor_parallel_size": 4}) == 4
    assert engine_world_size("vllm", {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}) == 4
    # k = 1: whatever the config says (0 on CPU, 1 for a GPU engine)
    assert required_runner_gpus("vllm", {"tensor_parallel_size": 1}, 0) == 0
    assert required_runner_gpus("vllm", {"tensor_parallel_size": 1}, 1) == 1
    assert required_runner_gpus("hf", {}, 0.5) == 0.5
    # k > 1: 0 becomes k, k stays
    assert required_runner_gpus("vllm", {"tensor_parallel_size": 2}, 0) == 2
    assert required_runner_gpus("vllm", {"tensor_parallel_size": 4}, 4) == 4
    for given in (1, 0.5, 8):
        with pytest.raises(ValueError, match=r"num_gpus_per_env_runner=4\)"):
            required_runner_gpus("vllm", {"tensor_parallel_size": 4}, given)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        engine_world_size("vllm", {"tensor_parallel_size": 0})


def test_validate_gives_a_tp_runner_k_gpus_and_refuses_a_conflict():
    cfg = _vllm(tp=2)
    cfg.validate()
    assert cfg.num_gpus_per_env_runner == 2
    assert runner_bundle(cfg) == {"CPU": 1, "GPU": 2}
    cfg.validate()  # idempotent
    cfg.freeze()
    cfg.validate()  # a frozen, validated config validates again (nothing to set)
    _vllm(tp=2, gpus=2).validate()
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 runs the runner's vLLM engine on 2 GPUs, "
                                         r"but num_gpus_per_env_runner=1: set \.env_runners\(num_gpus_per_env_runner=2\)"):
        _vllm(tp=2, gpus=1).validate()
    with pytest.raises(ValueError, match="pipeline_parallel_size=2"):
        _vllm(tp=2, gpus=2, pipeline_parallel_size=2).validate()


def test_defaults_keep_todays_resources():
    cfg = SPEARConfig()
    cfg.validate()
    assert cfg.num_gpus_per_env_runner == 0 and cfg.engine_kwargs == {}
    for gpus in (0, 1):
        cfg = _vllm(tp=1, gpus=gpus)
        cfg.validate()
        assert cfg.num_gpus_per_env_runner == gpus
    assert runner_engine_kwargs("vllm", {"tensor_parallel_size": 1}) == {"tensor_parallel_size": 1}
    assert runner_engine_kwargs("hf", {}) == {}


def test_tp_engine_runs_its_workers_as_processes_on_the_runner_gpus():
    assert runner_engine_kwargs("vllm", {"tensor_parallel_size": 2}) == {
        "tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
    ek = {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"}
    assert runner_engine_kwargs("vllm", ek) == ek  # an explicit choice is kept


def test_tune_resource_request_has_a_k_gpu_bundle_per_runner():
    """Algorithm.default_resource_request (what Tune reserves): main process, then one bundle per
    env runner with the runner's GPUs and custom resources, then the learners."""
    cfg = _vllm(tp=4).env_runners(custom_resources_per_env_runner={"runner_node": 1}).learners(
        num_learners=2, num_gpus_per_learner=1)
    pgf = cfg.algo_class.default_resource_request(cfg.to_dict())
    bundles = pgf.bundles
    runners = [b for b in bundles if b.get("runner_node")]
    assert len(runners) == 2 and all(b["GPU"] == 4 for b in runners), bundles
    assert sum(b.get("GPU", 0) for b in bundles) == 2 * 4 + 2


PROBE = textwrap.dedent("""
    import json, os, sys
    import ray
    from ray.rllib.env.env_runner import EnvRunner
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    import rllib_spear
    from rllib_spear import SPEARConfig

    class Probe(EnvRunner):  # RLlib's env-runner actor, without an engine
        def assert_healthy(self): pass
        def sample(self, **kw): return []
        def get_spaces(self): return {}
        def get_metrics(self): return {}
        def get_state(self, *a, **kw): return {}
        def set_state(self, state): pass
        def stop(self): pass
        def where(self):
            return {"gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                    "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}

    ray.init(num_cpus=1, num_gpus=2, include_dashboard=False)
    cfg = SPEARConfig().env_runners(engine="vllm", engine_kwargs={"tensor_parallel_size": 2},
                                    num_env_runners=1, num_cpus_per_env_runner=0.5)
    cfg.validate()
    cfg.env_runner_cls = Probe
    group = EnvRunnerGroup(config=cfg, local_env_runner=False)
    print("PROBE " + json.dumps(group.foreach_env_runner(lambda r: r.where(), local_env_runner=False)))
    group.stop()
    ray.shutdown()
""")


def test_a_tp_runner_actor_holds_k_gpus(tmp_path):
    """A Ray instance with 2 fake GPUs (its own, in a subprocess): the env runner RLlib creates
    from the validated config holds both GPUs (CUDA_VISIBLE_DEVICES lists them for vLLM's
    tensor-parallel workers)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONWARNINGS": "ignore"}
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                         env=env, cwd=str(tmp_path))
    assert "PROBE " in res.stdout, res.stdout[-2000:] + res.stderr[-4000:]
    (where,) = json.loads(res.stdout.split("PROBE ", 1)[1].splitlines()[0])
    assert sorted(where["gpu_ids"]) == ["0", "1"], where
    assert sorted(where["visible"].split(",")) == ["0", "1"], where
