"""models/threads.py for vLLM-cpu engines: a new thread takes torch's thread count before it steps
an engine (sync_thread_torch_threads), and validate() refuses a count vLLM-cpu cannot run."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from rllib_spear.models.threads import VLLM_CPU_MAX_THREADS, check_engine_threads


def test_a_new_thread_takes_torch_count_at_sync():
    """With OMP_NUM_THREADS=1 (a Ray actor) and torch set to 2, a new thread's OpenMP count is 1
    until sync_thread_torch_threads (what vLLM-cpu's attention schedules and checks)."""
    code = textwrap.dedent("""
        import ctypes, glob, os, threading
        import torch
        omp = None  # the OpenMP runtime torch loaded
        libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "lib*omp*.so*"))
        for name in libs + ["libgomp.so.1", "libiomp5.so", "libomp.so"]:
            try:
                omp = ctypes.CDLL(name, mode=os.RTLD_NOLOAD)
                break
            except OSError:
                pass
        if omp is None:
            print("NOOMP"); raise SystemExit
        from rllib_spear.models.threads import sync_thread_torch_threads
        torch.set_num_threads(2)
        seen = []
        def f():
            seen.append(omp.omp_get_max_threads())
            seen.append(sync_thread_torch_threads())
            seen.append(omp.omp_get_max_threads())
        t = threading.Thread(target=f); t.start(); t.join()
        print("SEEN", seen)
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=300)
    if "NOOMP" in out.stdout:
        pytest.skip("torch is not built with a loadable OpenMP runtime here")
    assert "SEEN [1, 2, 2]" in out.stdout, out.stdout + out.stderr[-3000:]


def _cfg(**kw):
    base = dict(engine="vllm", torch_num_threads=2, num_gpus_per_env_runner=0)
    return SimpleNamespace(**{**base, **kw})


def _raise(msg):
    raise ValueError(msg)


def test_check_engine_threads():
    for ok in (_cfg(), _cfg(torch_num_threads=None), _cfg(torch_num_threads=VLLM_CPU_MAX_THREADS),
               _cfg(engine="hf", torch_num_threads=VLLM_CPU_MAX_THREADS + 1),
               _cfg(num_gpus_per_env_runner=1, torch_num_threads=VLLM_CPU_MAX_THREADS + 1)):
        check_engine_threads(ok, _raise)
    with pytest.raises(ValueError, match=r"`torch_num_threads`=1025 with `engine`='vllm'.*<= 1024"):
        check_engine_threads(_cfg(torch_num_threads=VLLM_CPU_MAX_THREADS + 1), _raise)


def test_validate_refuses_more_threads_than_vllm_cpu_runs():
    import rllib_spear  # noqa: F401
    from rllib_spear import SPEARConfig

    cfg = SPEARConfig().env_runners(engine="vllm").training(torch_num_threads=VLLM_CPU_MAX_THREADS + 1)
    with pytest.raises(ValueError, match="torch_num_threads.*engine"):
        cfg.validate(check_files=False)
