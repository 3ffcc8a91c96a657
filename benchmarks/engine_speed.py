"""HFEngine sampling throughput vs raw ``model.generate`` on the same prompts (CPU or GPU).

Both sample exactly ``--max-new`` tokens per prompt (eos disabled) from left-padded chat prompts;
runs alternate, the median of ``--reps`` is reported. ``--samples G`` repeats each of the
``--batch`` prompts G times (a GRPO group: the engine prefills each distinct prompt once).

    .venv/bin/python benchmarks/engine_speed.py [--model PATH] [--batch 16 --samples 1 --max-new 64 --reps 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from rllib_spear.env_runners.engines.base import SamplingConfig  # noqa: E402
from rllib_spear.env_runners.engines.hf_engine import HFEngine  # noqa: E402
from rllib_spear.models.factory import synthetic_conversations, tiny_model_path  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model folder (default: a cached tiny test model)")
    ap.add_argument("--batch", type=int, default=16, help="distinct prompts")
    ap.add_argument("--samples", type=int, default=1, help="rows per distinct prompt (a GRPO group size)")
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--stop", nargs="*", default=[], help="stop strings for the engine (checked every step)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    path = a.model or tiny_model_path(tempfile.gettempdir() + "/rllib_spear_bench", hidden=192, layers=2, heads=3,
                                      vocab_size=1024)
    eng = HFEngine(path, device=a.device)
    eng.eos_token_ids = []  # fixed-length runs for both
    tok = eng.tokenizer
    convs = synthetic_conversations(a.batch, seed=3)
    prompts = [tok(tok.apply_chat_template(c[:2], add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"] for c in convs for _ in range(a.samples)]
    L = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (L - len(p)) + p for p in prompts], device=a.device)
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts], device=a.device)
    sc = SamplingConfig(max_new_tokens=a.max_new, seed=0, stop=[s for s in a.stop])
    n = len(prompts) * a.max_new
    eng.generate(prompts, sc)
    eng.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=4, pad_token_id=tok.pad_token_id)
    t_eng, t_raw = [], []
    for _ in range(a.reps):
        t = time.perf_counter()
        outs = eng.generate(prompts, sc)
        t_eng.append(time.perf_counter() - t)
        n_eng = sum(len(o.token_ids) for o in outs)
        assert a.stop or n_eng == n
        t = time.perf_counter()
        g = eng.model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=a.max_new,
                               min_new_tokens=a.max_new, pad_token_id=tok.pad_token_id, eos_token_id=None,
                               top_k=None, top_p=None)
        t_raw.append(time.perf_counter() - t)
        assert g.shape[1] - L == a.max_new
    e, r = n_eng / statistics.median(t_eng), n / statistics.median(t_raw)
    print(f"model={path} params={sum(p.numel() for p in eng.model.parameters())} device={a.device} "
          f"batch={a.batch} samples={a.samples} max_new={a.max_new}")
    print(f"HFEngine {e:8.1f} tok/s | raw generate {r:8.1f} tok/s | ratio {e / r:.2f}")


if __name__ == "__main__":
    main()
