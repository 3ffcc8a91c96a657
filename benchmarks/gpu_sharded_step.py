"""The sharded learner step of ``benchmarks/gpu_check.py`` (step 6 of its docstring): 2 FSDP2 +
bf16 learner ranks on a random-init Qwen2 model, one optimizer step, the gathered weights into the
engine. Imported by gpu_check.py; ``--cpu-smoke`` there runs it on CPU."""
from __future__ import annotations

import contextlib
import os
import time

import numpy as np
import torch

from rllib_spear.env_runners.engines.hf_engine import HFEngine
from rllib_spear.models.factory import conversation_texts, synthetic_conversations


def _gap(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if a else 0.0


# ------------------------------------------------------------------ sharded learner step
#: Qwen2.5-0.5B's shape (random init here).
QWEN25_05B = dict(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936)
#: --cpu-smoke: the same architecture, small (vocab still larger than the tokenizer's).
SMOKE_SHAPE = dict(hidden=128, intermediate=384, layers=4, heads=4, kv_heads=2, vocab=4096)


def _say(msg: str) -> None:
    print(f"[sharded] {msg}", flush=True)


def build_random_qwen2(out: str, shape: dict, *, device: str = "cpu", seed: int = 0) -> tuple[str, int]:
    """A random-init Qwen2ForCausalLM of ``shape`` (tied embeddings) with the project's own ChatML
    tokenizer, saved to ``out`` (fp32). The vocabulary only has to cover the tokenizer's ids."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rllib_spear.models.tokenizer import train_chat_tokenizer

    tok = train_chat_tokenizer(conversation_texts(synthetic_conversations(300, seed=0)), vocab_size=2048)
    if len(tok) > shape["vocab"]:
        raise ValueError(f"tokenizer has {len(tok)} ids > vocab {shape['vocab']}")
    cfg = Qwen2Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                      intermediate_size=shape["intermediate"], num_hidden_layers=shape["layers"],
                      num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                      head_dim=shape["hidden"] // shape["heads"], max_position_embeddings=2048,
                      tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0,
                      bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      initializer_range=0.02)
    torch.manual_seed(seed)
    with torch.device(device):  # init on the GPU when there is one (seconds instead of a minute)
        model = Qwen2ForCausalLM(cfg).to(torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out)
    tok.save_pretrained(out)
    del model
    if device != "cpu":
        torch.cuda.empty_cache()
    return out, n


def _vllm_named_weights(worker, names):
    """(collective_rpc) the named parameters of vLLM's model, as float32 CPU copies."""
    model = worker.model_runner.model
    params = dict(model.named_parameters())
    return {n: params[n].detach().float().cpu().clone() for n in names if n in params}


#: vLLM's fused Qwen2 parameters -> the HF tensors they concatenate (dim 0, no tensor parallelism).
_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def _probe_names(num_layers: int) -> list[str]:
    last = num_layers - 1
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in (0, last):
        names += [f"model.layers.{i}.input_layernorm.weight", f"model.layers.{i}.self_attn.o_proj.weight",
                  f"model.layers.{i}.mlp.down_proj.weight", f"model.layers.{i}.self_attn.qkv_proj.weight",
                  f"model.layers.{i}.self_attn.qkv_proj.bias", f"model.layers.{i}.mlp.gate_up_proj.weight"]
    return names


def _hf_view(sd: dict, name: str):
    """The HF tensor(s) behind an engine parameter name (concatenated for vLLM's fused ones)."""
    if name in sd:
        return sd[name]
    for fused, parts in _FUSED.items():
        if f".{fused}." in name:
            keys = [name.replace(fused, p) for p in parts]
            if all(k in sd for k in keys):
                return torch.cat([sd[k] for k in keys], dim=0)
    return None


def engine_weights(engine, names: list[str]) -> dict:
    """Engine-side parameters by name: vLLM's own (fused) names through collective_rpc, or the
    HF engine's model (``--cpu-smoke``), whose names are HF names (fused ones assembled)."""
    if hasattr(engine, "llm"):
        return engine.llm.collective_rpc(_vllm_named_weights, args=(names,))[0]
    sd = {k: v.detach().float().cpu() for k, v in engine.model.state_dict().items()}
    out = {}
    for n in names:
        t = _hf_view(sd, n)
        if t is not None:
            out[n] = t
    return out


def _weights_gap(eng: dict, ref_sd: dict, dtype: torch.dtype) -> tuple[float, int]:
    """max |engine - ref cast to the engine dtype| over the probed tensors, and how many were
    compared (vLLM's CPU backend re-packs the linear layers' weights for its GEMM and leaves the
    parameters empty: those are skipped; on GPU every probed tensor is compared)."""
    gap, n = 0.0, 0
    for name, t in eng.items():
        ref = _hf_view(ref_sd, name)
        if ref is None or t.numel() == 0:
            continue
        ref = ref.to(dtype).float()
        if t.shape != ref.shape and t.dim() == ref.dim() and t.shape[1:] == ref.shape[1:]:
            t = t[: ref.shape[0]]  # an engine may pad the vocabulary rows
        gap = max(gap, float((t - ref).abs().max()))
        n += 1
    return gap, n


def _rank_info(learner, reset: bool = False) -> dict:
    """(foreach_learner) rank, device, backend, state bytes, peak memory (then reset the peak)."""
    import resource

    import torch.distributed as dist

    dev = learner.device
    out = {"rank": dist.get_rank() if dist.is_initialized() else 0, "device": str(dev),
           "backend": dist.get_backend() if dist.is_initialized() else None,
           "world_size": dist.get_world_size() if dist.is_initialized() else 1,
           **learner.state_bytes(),
           "rss_peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    if dev is not None and dev.type == "cuda":
        out["max_memory_allocated"] = int(torch.cuda.max_memory_allocated(dev))
        out["max_memory_reserved"] = int(torch.cuda.max_memory_reserved(dev))
        if reset:
            torch.cuda.reset_peak_memory_stats(dev)
    return out


def _foreach(lg, fn) -> list:
    res = lg.foreach_learner(fn)
    out = []
    for r in res.result_or_errors:
        if not r.ok:
            raise r.get()
        out.append(r.get())
    return out


def _sharded_batch(path: str, n_trajs: int, tokens: int, vocab: int, num_learners: int, t_norm: float):
    """Seeded synthetic trajectories (non-zero advantages) -> one learner batch per rank."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from learner_throughput import synthetic_trajectories
    from rllib_spear.recipe.batching import LearnerRow, build_learner_batches
    from rllib_spear.core.advantages import group_advantages

    trajs = synthetic_trajectories(n_trajs, tokens, vocab, seed=0, group_size=4)
    adv = group_advantages(np.array([t.total_reward for t in trajs]), [t.uid for t in trajs],
                           std_normalize=False)
    rows = [LearnerRow(t, t.token_advantages(float(a)), t.loss_mask()) for t, a in zip(trajs, adv)]
    batches = build_learner_batches(rows, num_learners=num_learners, minibatch_size=None,
                                    t_norm=t_norm, pad_token_id=0, seed=0)
    mabs = [MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(b)}, env_steps=len(b["input_ids"])) for b in batches]
    return trajs, mabs


def _learner_config(path: str, *, num_learners: int, gpus_per_learner: float, lr: float, budget: int):
    from rllib_spear import GRPOConfig

    return (GRPOConfig().environment("search_qa")
            .env_runners(num_env_runners=0, max_model_len=1024, max_response_tokens=256)
            .training(lr=lr, loss_mode="vanilla", entropy_coeff=0.0, micro_batch_token_budget=budget,
                      response_filters=(), group_filter_keep_fraction=None)
            .rl_module(model_config={"model_path": path, "dtype": "float32"})
            .learners(num_learners=num_learners, num_gpus_per_learner=gpus_per_learner,
                      num_cpus_per_learner=1, sharding="fsdp", mixed_precision="bf16")
            .debugging(seed=0))


@contextlib.contextmanager
def _process_group_backend(backend: str | None):
    """Force the learners' torch.distributed backend (RLlib picks NCCL whenever learners have
    GPUs; two ranks on one GPU need gloo)."""
    from ray.rllib.core.learner import learner_group as lg_mod

    if backend is None:
        yield
        return
    orig = lg_mod._get_backend_config

    def patched(learner_class):
        cfg = orig(learner_class)
        cfg.backend = backend
        return cfg

    lg_mod._get_backend_config = patched
    try:
        yield
    finally:
        lg_mod._get_backend_config = orig


def _update_metrics(res) -> dict:
    """grad_norm / loss / trained_tokens of each rank's learner_group.update result."""
    out = []
    for r in (res if isinstance(res, list) else [res]):
        m = r.get("default_policy", r) if isinstance(r, dict) else {}
        row = {}
        for k in ("grad_norm", "total_loss", "policy_loss", "trained_tokens", "param_bytes"):
            v = m.get(k)
            if v is not None:
                v = v.peek() if hasattr(v, "peek") else v
                try:
                    row[k] = float(v)
                except (TypeError, ValueError):
                    pass
        out.append(row)
    return out


def run_sharded_step(a, result: dict, checks: dict, work: str) -> None:
    """One FSDP2 + bf16 step of 2 learner ranks, weight sync into the engine, memory per rank."""
    import ray
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    from rllib_spear.env_runners.llm_env_runner import hf_state_dict_from_module_state

    smoke = bool(a.cpu_smoke)
    on_gpu = torch.cuda.is_available() and not smoke
    n_gpus = torch.cuda.device_count() if on_gpu else 0
    if not smoke and not on_gpu:
        raise RuntimeError("the sharded step needs a GPU (use --cpu-smoke for the CPU code path)")
    if on_gpu:  # the fp32 HF reference scorer: no TF32
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    shape = SMOKE_SHAPE if smoke else QWEN25_05B
    out = {"shape": shape, "mode": "cpu-smoke" if smoke else "gpu"}
    result["sharded"] = out
    t = time.time()
    path, n_params = build_random_qwen2(os.path.join(work, "sharded_model"), shape,
                                        device="cuda" if on_gpu else "cpu")
    out["params"], out["model_build_s"] = n_params, round(time.time() - t, 1)
    _say(f"model: random-init Qwen2 {shape}, {n_params / 1e6:.1f}M parameters ({out['model_build_s']} s)")

    # the engine, before any update
    t = time.time()
    if on_gpu or a.smoke_engine == "vllm":
        from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine

        dtype = a.sharded_engine_dtype if on_gpu else "float32"
        kw = {"gpu_memory_utilization": a.gpu_mem, "enforce_eager": True} if on_gpu else {}
        eng = VLLMEngine(path, dtype=dtype, seed=0, max_model_len=1024, **kw)
        ref = HFEngine(path, device="cuda" if on_gpu else "cpu", dtype="float32")  # fp32 reference scorer
        tol = a.tol if dtype == "float32" else max(a.tol, 0.1)
    else:
        dtype = "float32"
        eng = HFEngine(path, device="cpu", dtype="float32")
        ref, tol = None, a.tol
    eng_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
    out["engine"] = f"{type(eng).__name__} ({dtype})"
    _say(f"engine {out['engine']} ready in {time.time() - t:.1f} s")
    names = _probe_names(shape["layers"])
    w_eng_before = engine_weights(eng, names)
    # every probed tensor on GPU; vLLM's CPU backend leaves its re-packed linear weights empty
    min_compared = 6 if on_gpu or not hasattr(eng, "llm") else 3

    # learners: 2 FSDP2 ranks, bf16 compute, fp32 master shards
    if n_gpus >= 2:
        gpus, backend = 1, None  # RLlib: NCCL, one GPU per rank
    elif on_gpu:
        gpus, backend = a.sharded_gpu_fraction, "gloo"  # 1 GPU: fractional GPUs, gloo (NCCL refuses)
    else:
        gpus, backend = 0, "gloo"  # CPU: gloo (RLlib's choice too; set through the same override)
    if a.sharded_backend != "auto":
        backend = a.sharded_backend
    out["num_gpus_per_learner"] = gpus
    lr, budget = a.sharded_lr, 1024
    if not ray.is_initialized():
        ray.init(num_cpus=max(4, os.cpu_count() or 4) if on_gpu else 2, include_dashboard=False,
                 log_to_driver=True,
                 runtime_env={"env_vars": {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                                           "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}})
    tok_vocab = len(eng.tokenizer)
    cfg2 = _learner_config(path, num_learners=2, gpus_per_learner=gpus, lr=lr, budget=budget)
    trajs, mabs = _sharded_batch(path, a.sharded_trajs, a.sharded_tokens, tok_vocab, 2, cfg2.loss_t_norm)
    n_tokens = sum(t_.length for t_ in trajs)
    _say(f"building the learner group: 2 ranks, sharding=fsdp, mixed_precision=bf16, "
         f"num_gpus_per_learner={gpus}, process group backend={backend or 'RLlib default'}, lr={lr}")
    t = time.time()
    with _process_group_backend(backend):
        lg = cfg2.build_learner_group(env=None)
    try:
        out["learner_build_s"] = round(time.time() - t, 1)
        built = sorted(_foreach(lg, lambda l: _rank_info(l, reset=True)), key=lambda d: d["rank"])
        _say(f"learners built in {out['learner_build_s']} s: "
             + "; ".join(f"rank {r['rank']} on {r['device']} ({r['backend']}, world {r['world_size']})" for r in built))
        t = time.time()
        res = lg.update(batches=mabs, timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 1})
        out["step_s"] = round(time.time() - t, 2)
        metrics = _update_metrics(res)
        stepped = sorted(_foreach(lg, _rank_info), key=lambda d: d["rank"])
        out["update_metrics"] = metrics
        _say(f"one optimizer step on {n_tokens} tokens in {out['step_s']} s; per-rank results {metrics}")
        states = [s for s in _foreach(lg, lambda l: l.weight_senders.weights.state()) if s is not None]
    finally:
        lg.shutdown()
    full = n_params * 4  # fp32 bytes of the whole model
    out["ranks"] = []
    for b, s_ in zip(built, stepped):
        row = {"rank": s_["rank"], "device": s_["device"], "backend": s_["backend"],
               "param_MiB": round(s_["param_bytes"] / 2**20, 1), "grad_MiB": round(s_["grad_bytes"] / 2**20, 1),
               "optimizer_MiB": round(s_["optimizer_bytes"] / 2**20, 1),
               "param_fraction_of_model": round(s_["param_bytes"] / full, 4),
               "rss_peak_MiB": s_["rss_peak_mib"]}
        if "max_memory_allocated" in s_:
            row["build_peak_GiB"] = round(b["max_memory_allocated"] / 2**30, 3)
            row["step_peak_GiB"] = round(s_["max_memory_allocated"] / 2**30, 3)
            row["step_peak_reserved_GiB"] = round(s_["max_memory_reserved"] / 2**30, 3)
        out["ranks"].append(row)
        _say("rank {rank}: params {param_MiB} MiB ({param_fraction_of_model:.3f} of the fp32 model), grads "
             "{grad_MiB} MiB, AdamW {optimizer_MiB} MiB".format(**row)
             + (f"; peak GPU memory allocated: build {row['build_peak_GiB']} GiB, step {row['step_peak_GiB']} GiB "
                f"(reserved {row['step_peak_reserved_GiB']} GiB)" if "step_peak_GiB" in row else
                f"; peak RSS {row['rss_peak_MiB']} MiB"))
    if on_gpu:
        # every rank's peak while building, against one whole fp32 replica of the model
        bp = [round(b["max_memory_allocated"] / full, 3) for b in built]
        checks["sharded_build_peak_below_full_replica"] = (bp, all(x < 1.0 for x in bp))
    fr = [r["param_fraction_of_model"] for r in out["ranks"]]
    checks["sharded_two_ranks"] = ([r["world_size"] for r in stepped], len(stepped) == 2
                                   and all(r["world_size"] == 2 for r in stepped))
    checks["sharded_params_half_per_rank"] = (fr, all(0.45 <= f <= 0.55 for f in fr))
    opt_ratio = [r["optimizer_MiB"] / max(r["param_MiB"], 1e-9) for r in out["ranks"]]
    checks["sharded_adam_state_2x_shard"] = ([round(x, 3) for x in opt_ratio], all(1.9 <= x <= 2.1 for x in opt_ratio))
    gn = [m.get("grad_norm") for m in metrics if m.get("grad_norm") is not None]
    checks["sharded_step_finite"] = (gn, bool(gn) and all(np.isfinite(g) and g > 0 for g in gn))

    # the gathered weights -> the engine
    if len(states) != 1:
        raise RuntimeError(f"engine_state: expected one rank to return the weights, got {len(states)}")
    sd = hf_state_dict_from_module_state(states[0])
    from safetensors.torch import load_file

    init = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            init.update(load_file(os.path.join(path, f)))
    moved = max(float((sd[k].float() - init[k].float()).abs().max()) for k in sd if k in init)
    checks["sharded_learner_weights_moved"] = (moved, moved > 1e-5)
    checks["sharded_master_weights_fp32"] = (sorted({str(v.dtype) for v in sd.values()}),
                                             all(v.dtype == torch.float32 for v in sd.values()))
    gap0, n0 = _weights_gap(w_eng_before, init, eng_dtype)
    checks["engine_weights_equal_init_before_sync"] = ((gap0, n0), n0 >= min_compared and gap0 <= 1e-6)
    seqs = [[int(x) for x in t_.input_ids()[:128]] for t_ in trajs[:8]]
    before = eng.score(seqs)
    ref_before = ref.score(seqs) if ref is not None else None
    t = time.time()
    eng.update_weights(sd, version=1)
    out["engine_update_s"] = round(time.time() - t, 2)
    w_eng_after = engine_weights(eng, names)
    gap1, n1 = _weights_gap(w_eng_after, sd, eng_dtype)
    gap_init, _ = _weights_gap(w_eng_after, init, eng_dtype)
    checks["engine_weights_equal_learner_after_sync"] = ((gap1, n1), n1 >= min_compared and gap1 <= 1e-6)
    checks["engine_weights_differ_from_init_after_sync"] = (gap_init, gap_init > 0)
    after = eng.score(seqs)
    lp_moved = max(map(_gap, after, before))
    checks["engine_logprobs_moved"] = (lp_moved, lp_moved > 1e-3)
    checks["engine_version"] = (eng.version, eng.version == 1)
    if ref is not None:
        checks["engine_logprobs_match_hf_before"] = (max(map(_gap, before, ref_before)),
                                                     max(map(_gap, before, ref_before)) < tol)
        ref.update_weights(sd, version=1)
        ref_after = ref.score(seqs)
        m = max(map(_gap, after, ref_after))
        checks["engine_logprobs_match_learner_weights"] = (m, m < tol)
        ref_moved = max(map(_gap, ref_after, ref_before))
        out["hf_ref_logprob_move"] = ref_moved
    _say(f"weights synced into the engine in {out['engine_update_s']} s; engine log-probs moved by up to {lp_moved:.4g}")
    del ref

    # the same batch on one FSDP rank: the 2-rank gradient must not depend on the split
    if not a.sharded_no_reference:
        cfg1 = _learner_config(path, num_learners=1, gpus_per_learner=gpus if gpus else 0, lr=lr, budget=budget)
        _, mabs1 = _sharded_batch(path, a.sharded_trajs, a.sharded_tokens, tok_vocab, 1, cfg1.loss_t_norm)
        _say("reference: the same batch through 1 FSDP rank (bf16)")
        with _process_group_backend(backend):
            lg1 = cfg1.build_learner_group(env=None)
        try:
            res1 = lg1.update(batch=mabs1[0], timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: 1})
        finally:
            lg1.shutdown()
        g1 = [m.get("grad_norm") for m in _update_metrics(res1) if m.get("grad_norm") is not None]
        if g1 and gn:
            rel = abs(gn[0] - g1[0]) / max(abs(g1[0]), 1e-12)
            checks["sharded_grad_norm_matches_1_rank"] = ((gn[0], g1[0], rel), rel < 2e-2)
        else:
            checks["sharded_grad_norm_matches_1_rank"] = ((gn, g1), False)
    if hasattr(eng, "shutdown"):
        eng.shutdown()
