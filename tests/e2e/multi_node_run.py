"""Helper of test_multi_node.py, run in its own process (its own Ray cluster):

    python tests/e2e/multi_node_run.py {single|multi} OUT_DIR

trains SPEAR for 2 iterations on the tiny model with 1 remote learner and 2 env runners, and
writes OUT_DIR/result.json (per-iteration learner metrics, a digest of every sampled batch's
tokens and rewards and one of its engine log-probs, where each actor ran) and OUT_DIR/weights.pt (the learner's weights after the 2 iterations).

* ``single``: ``ray.init(num_cpus=2)``, nothing pinned;
* ``multi``: a ``ray.cluster_utils.Cluster`` with a head node {"learner_node": 1} and a second
  node {"runner_node": 2}; the learner is pinned to the head with
  ``custom_resources_per_learner``, the 2 runners to the second node with
  ``custom_resources_per_env_runner``.

Both runs use the same seed, the same number of runners (tasks are dealt round-robin over the
runners and each runner seeds its sampling from ``seed`` and its worker index) and one torch
thread per actor (the CPU matmuls' reduction order then does not depend on the actor's CPUs).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ray  # noqa: E402

import rllib_spear  # noqa: E402,F401  (registers the algorithms)
from rllib_spear import SPEARConfig  # noqa: E402
from rllib_spear.models.factory import tiny_model_path  # noqa: E402

from e2e_helpers import recorder, small_config, with_trajectory_hook  # noqa: E402

RUNTIME_ENV = {"env_vars": {"GLOO_SOCKET_IFNAME": "lo", "RAY_AUTH_MODE": "disabled"}}
LEARNER_KEYS = ("total_loss", "policy_loss", "grad_norm", "entropy")


def config(pinned: bool):
    cfg = (small_config(SPEARConfig, tiny_model_path(), torch_num_threads=1)
           .env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)
           .learners(num_learners=1, num_cpus_per_learner=0.5)
           .resources(num_cpus_for_main_process=0.5))
    if pinned:
        cfg = (cfg.env_runners(custom_resources_per_env_runner={"runner_node": 1})
               .learners(custom_resources_per_learner={"learner_node": 1}))
    return cfg


def batch_digest(trajs) -> str:
    """sha256 of every trajectory's uid, tokens and (synthetic) reward, in batch order."""
    h = hashlib.sha256()
    for t in trajs:
        h.update(json.dumps([t.uid, t.outcome_reward, [s.token_ids for s in t.segments]]).encode())
    return h.hexdigest()


def logprob_digest(trajs) -> str:
    """sha256 of every segment's engine (behaviour) log-probs, in batch order."""
    h = hashlib.sha256()
    for t in trajs:
        h.update(json.dumps([s.logprobs for s in t.segments]).encode())
    return h.hexdigest()


def learner_weights(algo) -> dict:
    import torch

    state = algo.learner_group.get_state(components="learner/rl_module")
    mod = state["learner"]["rl_module"]["default_policy"]
    return {k: torch.as_tensor(v).detach().clone() for k, v in mod.items()}


def train(pinned: bool, out: Path) -> dict:
    import torch

    hook, calls = recorder(synthetic_rewards=True)  # seeded rewards: non-zero advantages
    algo = with_trajectory_hook(config(pinned), hook).build_algo()
    try:
        node_of = lambda actor: ray.get_runtime_context().get_node_id()  # noqa: E731
        learners = [r.get() for r in algo.learner_group.foreach_learner(node_of).result_or_errors]
        runners = algo.env_runner_group.foreach_env_runner(node_of, local_env_runner=False)
        init = learner_weights(algo)
        iterations = []
        for _ in range(2):
            r = algo.train()
            lr = r["learners"]["default_policy"]
            iterations.append({k: float(lr[k]) for k in LEARNER_KEYS if k in lr})
        final = learner_weights(algo)
        torch.save(final, out / "weights.pt")
    finally:
        algo.stop()
    moved = max(float((final[k].double() - init[k].double()).abs().max()) for k in init)
    return {"driver_node": ray.get_runtime_context().get_node_id(), "learner_nodes": learners,
            "moved": moved,
            "runner_nodes": runners, "iterations": iterations,
            "batches": [batch_digest(trajs) for trajs, _ in calls],
            "logprob_digests": [logprob_digest(trajs) for trajs, _ in calls],
            "runner_stats": [[s["generated_tokens"] for s in stats] for _, stats in calls]}


def main(mode: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if mode == "single":
        ray.init(num_cpus=2, include_dashboard=False, runtime_env=RUNTIME_ENV)
        try:
            result = train(pinned=False, out=out)
        finally:
            ray.shutdown()
    elif mode == "multi":
        from ray.cluster_utils import Cluster

        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "resources": {"learner_node": 1}, "include_dashboard": False})
        try:
            runner_node = cluster.add_node(num_cpus=1, resources={"runner_node": 2})
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, runtime_env=RUNTIME_ENV)
            try:
                result = train(pinned=True, out=out)
                result["nodes"] = {"head": cluster.head_node.node_id, "runner_node": runner_node.node_id}
            finally:
                ray.shutdown()
        finally:
            cluster.shutdown()  # only this cluster's own nodes
    else:
        raise SystemExit(f"mode must be 'single' or 'multi', got {mode!r}")
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print("MULTI_NODE_RUN_DONE", mode)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
