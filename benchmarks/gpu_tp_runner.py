"""The tensor-parallel env-runner step of ``benchmarks/gpu_check.py`` (``--tp-runner-only``,
step 7 of its docstring; docs/design.md "Cluster placement").

A SPEAR algorithm with one vLLM env runner whose engine has ``tensor_parallel_size`` k
(``--tp-size``, default 1: fits one GPU), through the path a cluster run takes: ``validate()``
resolves the runner's GPUs (k; with k = 1 the step sets ``num_gpus_per_env_runner=1`` itself),
Tune's resource request has a runner bundle of k GPUs, RLlib creates the runner actor holding k
GPUs, the runner builds ``VLLMEngine`` with the placement kwargs (``runner_engine_kwargs``:
``distributed_executor_backend="mp"`` when k > 1), and one training iteration samples, updates
the (CPU, local) learner and syncs the weights into the engine. Checks: the bundle, the actor's
GPU ids, the engine's tensor-parallel size, the sampled tokens, the synced version, the learner's
log-prob mismatch with the engine. On a machine without a GPU it runs the same path with vLLM's
CPU backend (k = 1, no GPU requested): a smoke test of this script.
"""
from __future__ import annotations

import os
import time

import torch


def _say(msg: str) -> None:
    print(f"[tp-runner] {msg}", flush=True)


def _engine_report(runner) -> dict:
    import ray

    eng = runner.engine
    pc = eng.llm.llm_engine.vllm_config.parallel_config
    return {"gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "tensor_parallel_size": int(pc.tensor_parallel_size),
            "executor_backend": str(pc.distributed_executor_backend),
            "engine_version": int(eng.version)}


def run_tp_runner(a, result: dict, checks: dict, work: str) -> None:
    import ray

    import rllib_spear  # noqa: F401  (registers the algorithms)
    from rllib_spear import SPEARConfig
    from rllib_spear.env_runners.placement import runner_bundle
    from rllib_spear.models.factory import tiny_model_path

    on_gpu = torch.cuda.is_available()
    k = int(a.tp_size)
    if not on_gpu and k != 1:
        raise ValueError("--tp-size > 1 needs GPUs (vLLM's CPU backend has no tensor parallelism)")
    n_gpus = torch.cuda.device_count() if on_gpu else 0
    if k > n_gpus and on_gpu:
        raise ValueError(f"--tp-size {k} needs {k} GPUs, this machine has {n_gpus}")
    out = result.setdefault("tp_runner", {"tp_size": k, "on_gpu": on_gpu})
    # gpu_check's model shape (head_dim 64; --heads must be divisible by --tp-size)
    path = tiny_model_path(os.path.join(work, "tp_runner_model"), hidden=a.hidden, layers=a.layers, heads=a.heads)
    ek = {"tensor_parallel_size": k, "dtype": "float32", "enforce_eager": True}
    if on_gpu:
        ek["gpu_memory_utilization"] = a.gpu_mem
    cfg = (SPEARConfig().environment("search_qa")
           .env_runners(engine="vllm", engine_kwargs=ek, num_env_runners=1, num_cpus_per_env_runner=1,
                        max_new_tokens=16, max_turns=2, max_model_len=512, max_response_tokens=256)
           .training(group_size=4, tasks_per_iteration=2, lr=1e-4, response_filters=(),
                     group_filter_keep_fraction=None)
           .rl_module(model_config={"model_path": path})
           .resources(num_cpus_for_main_process=1)
           .debugging(seed=0))
    if on_gpu and k == 1:
        cfg = cfg.env_runners(num_gpus_per_env_runner=1)  # k = 1: one GPU is the config's to ask for
    cfg.validate()
    want = k if on_gpu else 0
    checks["tp_runner_num_gpus_per_env_runner"] = (cfg.num_gpus_per_env_runner, cfg.num_gpus_per_env_runner == want)
    bundles = cfg.algo_class.default_resource_request(cfg.to_dict()).bundles
    out["tune_bundles"] = bundles
    checks["tp_runner_bundle"] = (runner_bundle(cfg), bundles[1].get("GPU", 0) == want)

    if not ray.is_initialized():
        ray.init(num_cpus=max(4, os.cpu_count() or 4) if on_gpu else 2, num_gpus=n_gpus, include_dashboard=False,
                 runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
                                           "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}})
    t = time.time()
    algo = cfg.build_algo()
    try:
        out["build_s"] = round(time.time() - t, 1)
        (rep,) = algo.env_runner_group.foreach_env_runner(_engine_report, local_env_runner=False)
        out["runner"] = rep
        _say(f"runner: {rep}")
        checks["tp_runner_actor_gpus"] = (rep["gpu_ids"], len(rep["gpu_ids"]) == want)
        checks["tp_runner_engine_tp"] = (rep["tensor_parallel_size"], rep["tensor_parallel_size"] == k)
        if k > 1:
            checks["tp_runner_executor"] = (rep["executor_backend"], rep["executor_backend"] == "mp")
        t = time.time()
        r = algo.train()
        out["iteration_s"] = round(time.time() - t, 1)
        (rep2,) = algo.env_runner_group.foreach_env_runner(_engine_report, local_env_runner=False)
        learner = r["learners"]["default_policy"]
        runners = r["env_runners"]
        out.update(gen_tokens_per_s=runners.get("gen_tokens_per_s"),
                   logp_mismatch_mean=learner.get("logp_mismatch_mean"))
        checks["tp_runner_sampled"] = (runners.get("generated_tokens"), (runners.get("generated_tokens") or 0) > 0)
        checks["tp_runner_weights_synced"] = (rep2["engine_version"], rep2["engine_version"] >= 1)
        mm = learner.get("logp_mismatch_mean")
        checks["tp_runner_logp_mismatch"] = (mm, mm is not None and mm < a.tol * 10)
    finally:
        algo.stop()
        ray.shutdown()
