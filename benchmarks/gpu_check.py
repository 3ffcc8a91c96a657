"""GPU check for the model/engine layer (run on an NVIDIA machine with the regular vllm wheel).
On a GPU machine without Ray and vLLM run benchmarks/gpu_learner_check.py instead (the learner's
update core, FSDP2, the weight-sync sender and the HF engine, torch and transformers only).

1. builds a small Qwen2-architecture model (no downloads) and an HF fp32 reference copy;
2. generates with VLLMEngine (fp32 by default) and checks the sampled tokens' log-probs against
   the HF model (teacher-forced, same temperature);
3. perturbs the weights in the HF copy, pushes them with VLLMEngine.update_weights, and proves the
   update took: vLLM's log-probs of a fixed continuation move away from the old values and match
   the updated HF model; sampling log-probs match too (prefix cache reset);
4. prints generation throughput (tokens/s) for the engine(s);
5. [placeholder] the multi-turn rollout runner: see ``run_multi_turn`` below;
6. with ``--sharded`` / ``--sharded-only``: the sharded learner step (``run_sharded_step``). A
   random-init Qwen2 model of the Qwen2.5-0.5B shape (hidden 896, MLP 4864, 24 layers, 14 heads,
   2 KV heads, vocab 151936, tied; ~494M parameters; the project's own small tokenizer, whose ids
   the vocabulary covers; no download) takes one optimizer step through the project's learner: an
   RLlib learner group of 2 ``GRPOTorchLearner`` ranks with ``sharding="fsdp"`` and
   ``mixed_precision="bf16"`` (fp32 master shards). With 2+ GPUs each rank gets a GPU
   (``num_gpus_per_learner=1``, NCCL). On a 1-GPU machine both ranks share it through fractional
   GPUs (``num_gpus_per_learner=0.4`` each) and the process group is gloo: NCCL refuses two ranks
   on one device ("Duplicate GPU detected"), while gloo runs the FSDP2 all-gather / reduce-scatter
   on CUDA tensors through host copies (slow, but the same learner code). Checks: each rank holds
   about half of the parameters / gradients / AdamW state (``learner.state_bytes()``); the step's
   gradient norm equals a 1-rank FSDP learner's on the same batch; the gathered weights
   (``learner.weight_senders.weights.state()``, what the algorithm ships) load into the vLLM engine
   (``VLLMEngine.update_weights``), whose parameters then equal the learner's (cast to the engine
   dtype; fused qkv / gate-up projections compared against the concatenated HF tensors) and whose
   log-probs move and match an HF fp32 reference with the learner's weights. Prints each rank's
   peak GPU memory (``torch.cuda.max_memory_allocated``) while building (every rank loads the whole
   fp32 model onto its GPU before sharding) and during the step.
   ``--cpu-smoke`` runs the same code on CPU (gloo) with a small model of the same architecture and
   the HF engine in place of vLLM: no GPU, no vLLM needed.
7. with ``--tp-runner-only [--tp-size K]``: a vLLM env runner with ``tensor_parallel_size`` K
   (default 1) built by RLlib from the config, as in a cluster run (``run_tp_runner`` in
   benchmarks/gpu_tp_runner.py, docs/design.md "Cluster placement"): its placement-group bundle
   and actor hold K GPUs, one training iteration samples and syncs weights into the engine.

Prints one JSON summary line at the end ("GPU_CHECK_RESULT {...}") and exits non-zero on failure.

    python benchmarks/gpu_check.py [--hidden 256 --layers 4 --dtype float32 --prompts 64 --max-new 128]
    python benchmarks/gpu_check.py --sharded-only        # GPU: the sharded learner step alone
    python benchmarks/gpu_check.py --cpu-smoke           # CPU: the same code path, small model
    python benchmarks/gpu_check.py --tp-runner-only      # GPU: the tensor-parallel runner step (K=1)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the sharded step's Ray learners (no dashboard auth; gloo over loopback)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rllib_spear.env_runners.engines.base import SamplingConfig  # noqa: E402
from rllib_spear.env_runners.engines.hf_engine import HFEngine  # noqa: E402
from rllib_spear.models.factory import build_tiny_model, conversation_texts, synthetic_conversations  # noqa: E402


def run_multi_turn(engine, tokenizer, result: dict) -> None:
    """PLACE FOR THE LEAD: run the multi-turn rollout runner on ``engine`` here, e.g.

        from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig
        ...
        result["multi_turn_tokens_per_s"] = ...

    It is called after the weight-update check with the (updated) VLLMEngine.
    """
    result["multi_turn"] = "not wired yet"


from gpu_sharded_step import _gap, run_sharded_step  # noqa: E402


def run_engine_checks(a, result: dict, checks: dict, work: str) -> None:
    """Steps 1-5: generation, log-probs vs HF, weight update, throughput (the original check)."""
    import vllm

    result["vllm"] = vllm.__version__
    result["torch"] = torch.__version__
    if torch.cuda.is_available():
        result["gpu"] = torch.cuda.get_device_name(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    t = time.time()
    convs = synthetic_conversations(300, seed=0)
    path = build_tiny_model(os.path.join(work, "model"), conversation_texts(convs), arch="qwen2",
                            hidden=a.hidden, layers=a.layers, heads=a.heads, vocab_size=2048, seed=0)
    result["model_build_s"] = round(time.time() - t, 2)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    hf = HFEngine(path, device=dev, dtype="float32")
    tok = hf.tokenizer
    result["params"] = sum(p.numel() for p in hf.model.parameters())
    prompts = []
    for i in range(a.prompts):
        c = convs[i % len(convs)]
        prompts.append(tok(tok.apply_chat_template(c[:2], add_generation_prompt=True, tokenize=False),
                           add_special_tokens=False)["input_ids"])

    from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine

    t = time.time()
    try:
        eng = VLLMEngine(path, dtype=a.dtype, seed=0, max_model_len=1024, update_method=a.update_method,
                         gpu_memory_utilization=a.gpu_mem)
    except Exception as e:
        if a.dtype == "bfloat16":
            raise
        # some GPU attention backends have no fp32 kernels: fall back to bf16, looser tolerance
        result["fp32_engine_error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
        a.dtype, a.tol = "bfloat16", max(a.tol, 0.1)
        eng = VLLMEngine(path, dtype="bfloat16", seed=0, max_model_len=1024, update_method=a.update_method,
                         gpu_memory_utilization=a.gpu_mem)
    result["vllm_dtype"], result["tol"] = a.dtype, a.tol
    result["vllm_init_s"] = round(time.time() - t, 2)

    # 1. generation + log-probs vs HF
    sc = SamplingConfig(max_new_tokens=a.max_new, seed=1, temperature=1.0)
    eng.generate(prompts[:4], SamplingConfig(max_new_tokens=8, seed=0))  # warm-up
    t = time.time()
    outs = eng.generate(prompts, sc)
    dt = time.time() - t
    ntok = sum(len(o.token_ids) for o in outs)
    result["vllm_tokens_per_s"] = round(ntok / dt, 1)
    result["vllm_gen_tokens"] = ntok
    gap = max(_gap(o.logprobs, s[len(p):]) for p, o, s in
              zip(prompts, outs, hf.score([list(p) + o.token_ids for p, o in zip(prompts, outs)])))
    checks["gen_logprobs_match_hf"] = (gap, gap < a.tol)
    outs_t = eng.generate(prompts[:16], SamplingConfig(max_new_tokens=32, seed=2, temperature=0.7))
    gap_t = max(_gap(o.logprobs, hf.score([list(p) + o.token_ids], temperature=0.7)[0][len(p):])
                for p, o in zip(prompts[:16], outs_t))
    checks["gen_logprobs_match_hf_T0.7"] = (gap_t, gap_t < a.tol)
    again = eng.generate(prompts, sc)
    checks["seeded_determinism"] = (None, [o.token_ids for o in again] == [o.token_ids for o in outs])

    # HF engine throughput on the same work, for reference
    t = time.time()
    hf_outs = hf.generate(prompts, sc)
    dt = time.time() - t
    result["hf_engine_tokens_per_s"] = round(sum(len(o.token_ids) for o in hf_outs) / dt, 1)

    # 2. weight update
    seqs = [list(p) + list(range(10, 30)) for p in prompts[:8]]
    before = eng.score(seqs)
    ref_before = hf.score(seqs)
    checks["score_matches_hf_before"] = (max(map(_gap, before, ref_before)), max(map(_gap, before, ref_before)) < a.tol)
    torch.manual_seed(0)
    new = {k: (v.detach() + 0.02 * torch.randn_like(v)).cpu() for k, v in hf.model.named_parameters()}
    hf.update_weights(new, version=1)
    t = time.time()
    eng.update_weights(new, version=1)
    result["update_weights_s"] = round(time.time() - t, 3)
    after = eng.score(seqs)
    ref_after = hf.score(seqs)
    moved = min(map(_gap, after, before))
    match = max(map(_gap, after, ref_after))
    checks["update_moves_logprobs"] = (moved, moved > 1e-2)
    checks["update_matches_new_hf"] = (match, match < a.tol)
    outs2 = eng.generate(prompts[:16], SamplingConfig(max_new_tokens=32, seed=3))
    gap2 = max(_gap(o.logprobs, hf.score([list(p) + o.token_ids])[0][len(p):]) for p, o in zip(prompts[:16], outs2))
    checks["gen_after_update_matches_hf"] = (gap2, gap2 < a.tol)
    checks["version"] = (eng.version, eng.version == 1)

    # 3. multi-turn runner (to be wired by the lead)
    run_multi_turn(eng, tok, result)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dtype", default="float32", help="vLLM dtype (float32 for exact comparisons)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--tol", type=float, default=1e-3, help="max |logp vLLM - logp HF| (fp32 on GPU: TF32/kernels)")
    ap.add_argument("--update-method", default="reload", choices=["reload", "load_weights"])
    ap.add_argument("--gpu-mem", type=float, default=0.3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--sharded", action="store_true", help="also run the sharded (FSDP2) learner step")
    ap.add_argument("--sharded-only", action="store_true", help="run only the sharded learner step (GPU)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="only the sharded learner step, on CPU with a small model and the HF engine (no vLLM)")
    ap.add_argument("--sharded-gpu-fraction", type=float, default=0.4,
                    help="num_gpus_per_learner of each of the 2 ranks on a 1-GPU machine")
    ap.add_argument("--sharded-backend", default="auto", choices=["auto", "nccl", "gloo"],
                    help="learner process group (auto: NCCL with a GPU per rank, gloo when ranks share one)")
    ap.add_argument("--sharded-engine-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--sharded-lr", type=float, default=1e-3,
                    help="lr of the sharded step (large enough for one AdamW step to show in bf16 weights)")
    ap.add_argument("--sharded-trajs", type=int, default=8)
    ap.add_argument("--sharded-tokens", type=int, default=256)
    ap.add_argument("--sharded-no-reference", action="store_true", help="skip the 1-rank gradient reference")
    ap.add_argument("--smoke-engine", default="hf", choices=["hf", "vllm"],
                    help="--cpu-smoke: the engine that receives the weights (vllm: vLLM's CPU backend)")
    ap.add_argument("--tp-runner-only", action="store_true",
                    help="run only the tensor-parallel env-runner step (vLLM; benchmarks/gpu_tp_runner.py)")
    ap.add_argument("--tp-size", type=int, default=1,
                    help="--tp-runner-only: tensor_parallel_size of the runner's engine (1 fits one GPU)")
    a = ap.parse_args()

    result: dict = {"ok": False, "cuda": torch.cuda.is_available()}
    checks: dict = {}
    sharded_only = a.sharded_only or a.cpu_smoke
    try:
        result["torch"] = torch.__version__
        if torch.cuda.is_available():
            result["gpu"] = torch.cuda.get_device_name(0)
            result["gpus"] = torch.cuda.device_count()
        work = a.out or tempfile.mkdtemp(prefix="gpu_check_")
        if a.tp_runner_only:
            from gpu_tp_runner import run_tp_runner

            run_tp_runner(a, result, checks, work)
        if not (sharded_only or a.tp_runner_only):
            run_engine_checks(a, result, checks, work)
        if (a.sharded or sharded_only) and not a.tp_runner_only:
            run_sharded_step(a, result, checks, work)
        result["ok"] = bool(checks) and all(ok for _, ok in checks.values())
    except Exception as e:  # report, don't hide
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    result["checks"] = {k: {"value": v, "ok": ok} for k, (v, ok) in checks.items()}
    for k, (v, ok) in checks.items():
        print(f"{'PASS' if ok else 'FAIL'} {k}: {v}")
    if "error" in result:
        print(f"FAIL error: {result['error']}")
    print("GPU_CHECK_RESULT " + json.dumps(result, default=str))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
