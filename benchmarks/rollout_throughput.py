"""Generated tokens/s of the multi-turn rollout loop vs the raw batched engine on the same work.

The rollout side is ``MultiTurnRollout.run`` (what ``LLMEnvRunner.sample_groups`` runs): groups
of episodes on the embedded ``search_qa`` environment, one batched engine call per turn, with
tokenisation, tool calls (BM25 search) and observation templating in between. Its throughput is
generated tokens / wall time of the whole ``run``.

The raw side replays the same engine calls: for every turn call of the rollout, the same
contexts (same batch size, left-padded) go to ``model.generate`` (HF) -- or ``LLM.generate``
(vLLM) -- sampling exactly the mean number of tokens the rollout generated per row in that turn
(``min_new_tokens = max_new_tokens``, no eos), so both sides generate about the same number of
tokens in the same number of calls at the same batch sizes; only the loop around the engine
differs. Runs alternate; medians are reported. The vLLM part also replays each row's own
length (``per-row lengths``: the same decode steps per turn as the rollout, since a turn lasts
as long as its longest row).

    .venv/bin/python benchmarks/rollout_throughput.py [--model tiny|embedded|PATH]
        [--tasks 8 --group 4 --max-new 48 --max-turns 3 --reps 3] [--vllm auto|on|off]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

import torch  # noqa: E402


class RecordingEngine:
    """Forwards to an engine and records every call's contexts and generated lengths."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[tuple[list[list[int]], list[int]]] = []

    def generate(self, prompts, sampling, max_new_tokens=None):
        outs = self.engine.generate(prompts, sampling, max_new_tokens)
        self.calls.append(([list(p) for p in prompts], [len(o.token_ids) for o in outs]))
        return outs

    def __getattr__(self, name):
        return getattr(self.engine, name)


def model_path_of(name: str) -> str:
    if name == "tiny":
        from rllib_spear.models.factory import tiny_model_path

        return tiny_model_path()
    if name == "embedded":
        from rllib_spear.coldstart import default_policy_path

        return default_policy_path()
    return name


def make_rollout(engine, tokenizer, args, seed):
    from rllib_spear.env_runners.engines.base import SamplingConfig
    from rllib_spear.env_runners.rollout import MultiTurnRollout, RolloutConfig
    from rllib_spear.envs import make_env

    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.max_new, seed=seed)
    return MultiTurnRollout(
        engine=engine, tokenizer=tokenizer,
        env_factory=lambda: make_env("search_qa", max_turns=args.max_turns),
        sampling=sampling,
        config=RolloutConfig(max_turns=args.max_turns, max_model_len=args.max_model_len,
                             max_response_tokens=args.max_response),
    )


def raw_hf(model, pad_id, calls, device):
    """model.generate on the recorded calls; returns (tokens, seconds)."""
    tokens, t = 0, 0.0
    for prompts, lens in calls:
        n = max(1, round(sum(lens) / len(lens)))
        L = max(map(len, prompts))
        ids = torch.tensor([[pad_id] * (L - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts], device=device)
        t0 = time.perf_counter()
        g = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=n,
                           min_new_tokens=n, pad_token_id=pad_id, eos_token_id=None, top_k=None,
                           top_p=None, temperature=1.0)
        t += time.perf_counter() - t0
        tokens += (g.shape[1] - L) * len(prompts)
    return tokens, t


def raw_vllm(llm, calls, per_row=False, engine_options=False):
    """LLM.generate on the recorded calls: every row samples the turn's mean length, or with
    ``per_row`` exactly the length that row generated in the rollout (same decode steps).
    ``engine_options`` adds what VLLMEngine asks of every request (sampled-token log-probs,
    a per-request seed, detokenisation) to isolate their cost from the loop's."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {}
    tokens, t = 0, 0.0
    for c, (prompts, lens) in enumerate(calls):
        mean = max(1, round(sum(lens) / len(lens)))
        if engine_options:
            extra = dict(logprobs=0, detokenize=True, skip_special_tokens=False)
        sp = [SamplingParams(temperature=1.0, max_tokens=n, min_tokens=n, ignore_eos=True,
                             **extra, **({"seed": 1000 * c + i} if engine_options else {}))
              for i, n in enumerate((max(1, k) for k in lens) if per_row else [mean] * len(lens))]
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        t += time.perf_counter() - t0
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    return tokens, t


def bench(engine, tokenizer, tasks, args, raw_fn, label):
    rec = RecordingEngine(engine)
    r_tps, w_tps, info = [], [], None
    for rep in range(args.reps + 1):  # rep 0 warms up both sides
        rollout = make_rollout(rec, tokenizer, args, seed=rep)
        rec.calls.clear()
        t0 = time.perf_counter()
        trajs, stats = rollout.run(tasks, args.group)
        wall = time.perf_counter() - t0
        tok_raw, t_raw = raw_fn(list(rec.calls))
        if rep:
            r_tps.append(stats.generated_tokens / wall)
            w_tps.append(tok_raw / t_raw)
            info = (len(trajs), stats.engine_calls, stats.generated_tokens, tok_raw,
                    wall, stats.generation_time_s, stats.env_time_s, t_raw)
    r, w = statistics.median(r_tps), statistics.median(w_tps)
    n, calls, gen, raw_tok, wall, gen_t, env_t, t_raw = info
    print(f"[{label}] {n} episodes, {calls} turn calls, {gen} generated tokens "
          f"(raw side {raw_tok}); last rep: rollout wall {wall:.2f}s = generation {gen_t:.2f}s "
          f"+ env/tokenizer {env_t:.2f}s (+ rest), raw {t_raw:.2f}s")
    print(f"[{label}] MultiTurnRollout {r:9.1f} tok/s | raw engine {w:9.1f} tok/s | "
          f"ratio {r / w:.3f}x (target >= 0.9x: {'OK' if r / w >= 0.9 else 'BELOW'})")
    return r / w


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", help="tiny | embedded | a model folder")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--max-response", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--vllm", default="auto", choices=("auto", "on", "off"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from rllib_spear.env_runners.engines.hf_engine import HFEngine
    from rllib_spear.envs import load_tasks

    path = model_path_of(args.model)
    tasks = load_tasks("search_qa", "train")[: args.tasks]
    eng = HFEngine(path, device=args.device)
    print(f"model={path} params={sum(p.numel() for p in eng.model.parameters())} device={args.device} "
          f"tasks={len(tasks)} x group={args.group} max_new={args.max_new} max_turns={args.max_turns} "
          f"torch threads={torch.get_num_threads()}")
    bench(eng, eng.tokenizer, tasks, args,
          lambda calls: raw_hf(eng.model, eng.pad_token_id, calls, eng.device), "hf")

    if args.vllm != "off":
        try:
            import vllm  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            if args.vllm == "on":
                raise
            print(f"[vllm] skipped: import vllm failed ({type(exc).__name__}: {exc})")
            return
        from rllib_spear.env_runners.engines.vllm_engine import VLLMEngine

        # One scheduler step per prefill wave (VLLMEngine sets the CPU token budget and splits
        # larger batches), so the raw replay below gets the same budget.
        veng = VLLMEngine(path, seed=0, max_model_len=args.max_model_len)
        llm = getattr(veng, "llm", None) or getattr(veng, "_llm")
        bench(veng, eng.tokenizer, tasks, args, lambda calls: raw_vllm(llm, calls), "vllm")
        # Same, but the raw side replays each row's own length: the same number of decode steps
        # per turn as the rollout (the mean-length replay finishes a turn in fewer steps).
        bench(veng, eng.tokenizer, tasks, args, lambda calls: raw_vllm(llm, calls, per_row=True),
              "vllm, per-row lengths")
        bench(veng, eng.tokenizer, tasks, args,
              lambda calls: raw_vllm(llm, calls, per_row=True, engine_options=True),
              "vllm, per-row lengths, raw with the engine's request options")
        veng.shutdown()


if __name__ == "__main__":
    main()
