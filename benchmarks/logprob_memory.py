"""Peak memory of chunked vs naive per-token log-probs (forward + backward) on a 32k-vocab model.

Each variant runs in a fresh subprocess; the number reported is the rise of the process's peak
RSS (ru_maxrss) over its RSS just before the forward pass, so allocator reuse between variants
cannot hide anything. The subprocesses run with a fixed glibc mmap threshold
(MALLOC_MMAP_THRESHOLD_=131072): with glibc's default dynamic threshold, freed multi-MB chunks stay
in the heap, fragment, and RSS then counts memory that is free (it over-reports the chunked path,
which allocates many medium tensors). CPU only, no downloads (random-init Qwen2 config).

    .venv/bin/python benchmarks/logprob_memory.py [--batch 4 --seq 1024 --vocab 32000 --chunk 256]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def run_one(mode: str, a) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from rllib_spear.models.logprobs import naive_token_logprobs, token_logprobs

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=3 * a.hidden, num_hidden_layers=2,
                      num_attention_heads=a.hidden // 64, num_key_value_heads=a.hidden // 64, head_dim=64,
                      tie_word_embeddings=True, max_position_embeddings=a.seq + 8)
    model = Qwen2ForCausalLM(cfg).float()
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    mask = torch.ones_like(ids)
    base = _rss_mb()
    t = time.time()
    if mode == "naive":
        lp = naive_token_logprobs(model, ids, mask)
    else:
        lp = token_logprobs(model, ids, mask, chunk_size=a.chunk or None)
    lp.sum().backward()
    dt = time.time() - t
    return {"mode": mode, "peak_rise_mb": _peak_mb() - base, "seconds": dt, "logp_sum": float(lp.detach().sum())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=0, help="0 = token_logprobs' automatic chunk size")
    ap.add_argument("--one", choices=["naive", "chunked"])
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one, a)))
        return
    logits_mb = a.batch * a.seq * a.vocab * 4 / 2**20
    print(f"B={a.batch} T={a.seq} V={a.vocab} hidden={a.hidden} chunk={a.chunk}: "
          f"one [B,T,V] float32 tensor = {logits_mb:.0f} MB")
    res = {}
    for mode in ("naive", "chunked"):
        cmd = [sys.executable, __file__, "--one", mode] + [f"--{k}={getattr(a, k)}" for k in ("batch", "seq", "vocab", "hidden", "chunk")]
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": os.environ.get("MALLOC_MMAP_THRESHOLD_", "131072")}
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.strip().splitlines()[-1]
        res[mode] = json.loads(out)
        print(f"{mode:8s} peak RSS rise {res[mode]['peak_rise_mb']:8.1f} MB   fwd+bwd {res[mode]['seconds']:.2f} s")
    ratio = res["chunked"]["peak_rise_mb"] / res["naive"]["peak_rise_mb"]
    same = abs(res["chunked"]["logp_sum"] - res["naive"]["logp_sum"]) / abs(res["naive"]["logp_sum"])
    print(f"ratio chunked/naive = {ratio:.3f}  (target <= 0.3); relative logp-sum gap {same:.1e}")


if __name__ == "__main__":
    main()
