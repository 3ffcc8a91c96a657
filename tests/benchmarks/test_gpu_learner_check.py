"""benchmarks/gpu_learner_check.py -- the GPU check of a bare GPU machine (no Ray, no vLLM) -- runs
every stage on CPU with ``ray`` and ``vllm`` unimportable (``--cpu-smoke``), and the library's
Ray-free modules import with Ray blocked (a later Ray import sneaking into one fails here)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_learner_check.py"
STAGES = ("imports", "logprobs", "fsdp_1p5b", "fsdp_offload", "fsdp_7b_cut", "weight_sync", "hf_engine")

#: What the GPU check runs: the learner's update core, loader, micro-batching and optimizer
#: builder, sharding, planner, weight-sync sender, HF engine (and what they import).
RAY_FREE = (
    "rllib_spear", "rllib_spear.registration", "rllib_spear.algorithms.grpo",
    "rllib_spear.learner", "rllib_spear.learner.core", "rllib_spear.learner.microbatching",
    "rllib_spear.learner.optim", "rllib_spear.learner.module_layout", "rllib_spear.models.hf_policy", "rllib_spear.models.logprobs",
    "rllib_spear.models.sharding", "rllib_spear.models.shapes", "rllib_spear.models.tokenizer",
    "rllib_spear.models.factory", "rllib_spear.planning", "rllib_spear.planning.learner", "rllib_spear.core.losses",
    "rllib_spear.recipe.batching", "rllib_spear.weight_streaming.buckets", "rllib_spear.env_runners.engines.hf_engine",
)

# ``ray`` and ``vllm`` as if not installed: ``import ray`` raises ModuleNotFoundError(name="ray"),
# ``importlib.util.find_spec("ray")`` is None
BLOCKER = textwrap.dedent("""
    import sys

    sys.modules["ray"] = sys.modules["vllm"] = None
""")


def _env() -> dict:
    env = dict(os.environ)
    env.pop("RLLIB_SPEAR_NO_REGISTER", None)  # the package's own registration must cope with no Ray
    env.update(GLOO_SOCKET_IFNAME="lo", TOKENIZERS_PARALLELISM="false")
    return env


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKER + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=_env())


def test_ray_free_modules_import_with_ray_and_vllm_blocked():
    res = _python(f"""
        import importlib, json
        for name in {RAY_FREE!r}:
            importlib.import_module(name)
        from rllib_spear.registration import register_all
        print(json.dumps({{"registered": register_all(),
                          "leaked": sorted(m for m in sys.modules
                                           if m.split(".")[0] in ("ray", "vllm") and sys.modules[m] is not None)}}))
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out == {"registered": False, "leaked": []}


def test_the_blocker_blocks():
    """The control: with the same blocker the RLlib learner does not import (so the test above
    would catch a Ray import in a Ray-free module)."""
    res = _python("""
        try:
            import rllib_spear.learner.rllib_learner
        except ModuleNotFoundError as e:
            print("blocked", e.name.split(".")[0])  # "ray.rllib": 'ray' is not a package
    """)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "blocked ray"


def test_registration_raises_a_broken_ray_instead_of_skipping_it():
    """Only a missing Ray skips registration: an installed Ray whose import fails is an error."""
    res = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys

        class Broken:
            def find_spec(self, name, path=None, target=None):
                if name == "ray.tune":
                    raise ModuleNotFoundError("No module named 'ray.tune'", name="ray.tune")

        sys.meta_path.insert(0, Broken())
        from rllib_spear.registration import register_all
        try:
            register_all()
        except ImportError as e:
            print("raised", e.name)
    """)], capture_output=True, text=True, timeout=300, cwd=ROOT, env={**_env(), "RLLIB_SPEAR_NO_REGISTER": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "raised ray.tune"


def test_registration_with_ray():
    from rllib_spear.registration import register_all

    assert register_all() is True


def test_choose_layers_takes_the_most_that_fit():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_learner_check import choose_layers

    gib = {n: 10.0 + 4.0 * n for n in range(1, 29)}  # 4 GiB per layer over a 10 GiB base
    assert choose_layers(lambda n: n, 28, 90.0, gib.__getitem__) == 20
    assert choose_layers(lambda n: n, 28, 500.0, gib.__getitem__) == 28
    assert choose_layers(lambda n: n, 28, 12.0, gib.__getitem__) == 0


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, list[dict], list[dict]]:
    out = tmp_path_factory.mktemp("gpu_learner_check") / "out.jsonl"
    res = subprocess.run([sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(out)], capture_output=True,
                         text=True, timeout=600, cwd=ROOT, env=_env())
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    written = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    return res, lines, written


def test_cpu_smoke_runs_every_stage_without_ray(smoke):
    res, lines, written = smoke
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    by_stage = {line["stage"]: line for line in lines}
    for stage in STAGES:
        assert stage in by_stage, f"stage {stage} printed nothing"
        assert by_stage[stage]["ok"] is True and "error" not in by_stage[stage], by_stage[stage]
    summary = lines[-1]
    assert summary["stage"] == "summary" and summary["ok"] is True
    assert summary["stages"] == {s: True for s in STAGES}
    assert written == lines  # --out holds the same lines
    # the block held (Ray and vLLM neither importable nor found, nothing of them loaded) and the
    # package's registration was skipped
    imports = by_stage["imports"]
    assert imports["importable"] == {"ray": False, "vllm": False} and imports["leaked"] == []
    assert imports["registered_with_tune"] is False


def test_cpu_smoke_figures(smoke):
    _, lines, _ = smoke
    by_stage = {line["stage"]: line for line in lines}
    lp = by_stage["logprobs"]
    assert lp["vocab"] == 151936 and lp["logp_max_abs_diff"] <= lp["tolerances"]["logp"]
    for stage in ("fsdp_1p5b", "fsdp_7b_cut"):
        r = by_stage[stage]
        assert r["tokens_per_s"] > 0 and r["planned_gib"] > 0 and r["layout"] == "fsdp x1 + AC + bf16"
        assert len(r["loss"]) == 2 and all(g > 0 for g in r["grad_norm"])  # warm-up + 1 timed update
    off = by_stage["fsdp_offload"]
    assert off["layout"] == "fsdp x1 + offload + AC + bf16" and len(off["loss"]) == 2
    # same seed and batch as fsdp_1p5b: the first update (before any optimizer step) is the same
    diff = off["vs_on_device"]
    assert diff["loss_rel_diff"][0] <= 1e-3 and diff["grad_norm_rel_diff"][0] <= 1e-3, diff
    cut = by_stage["fsdp_7b_cut"]
    assert 1 <= cut["chosen_layers"] < cut["full_layers"] and cut["layers"] == cut["chosen_layers"]
    ws = by_stage["weight_sync"]
    assert ws["bf16_to_host"]["bytes"] * 2 == ws["fp32_to_host"]["bytes"] > 0
    # the staged host path and the per-tensor copy of before, on the same buckets (CPU: unpinned)
    assert ws["bf16_to_host_before"]["bytes"] == ws["bf16_to_host"]["bytes"] and ws["staging_speedup"] > 0
    assert ws["staging_buffer"]["pinned"] is False and ws["host_copy_paths"]["host_staging"]["gb_per_s"] > 0
    eng = by_stage["hf_engine"]
    assert eng["generated_tokens"] > 0 and eng["logp_gap_max"] < 0.1


def test_a_failing_stage_reports_its_error_and_the_next_one_runs():
    res = subprocess.run([sys.executable, str(SCRIPT), "--cpu-smoke", "--stages", "fsdp_7b_cut,imports",
                          "--fit-fraction", "0"], capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
    lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    by_stage = {line["stage"]: line for line in lines}
    assert res.returncode == 1
    assert by_stage["fsdp_7b_cut"]["ok"] is False and "error" in by_stage["fsdp_7b_cut"]
    assert by_stage["imports"]["ok"] is True
    assert by_stage["summary"]["ok"] is False and by_stage["summary"]["stages"] == {"fsdp_7b_cut": False,
                                                                                      "imports": True}


def test_the_device_session_script_parses_and_its_steps_are_valid_calls():
    """benchmarks/gpu_learner_session.sh (one device call): bash accepts it, every step's flags
    parse as gpu_learner_check arguments, and the steps' timeouts fit one call (600 s)."""
    import shlex

    root = Path(__file__).resolve().parents[2]
    script = root / "benchmarks" / "gpu_learner_session.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    sys.path.insert(0, str(root / "benchmarks"))
    import gpu_learner_check

    steps = [shlex.split(line.strip())[1:] for line in script.read_text().splitlines()
             if line.strip().startswith("step ") and not line.strip().startswith("step()")]
    assert len(steps) == 6
    for name, secs, *flags in steps:
        a = gpu_learner_check.parse_args(flags)
        assert a.stages, name
    assert sum(int(secs) for _, secs, *_ in steps) <= 560  # + the torch probe and the table, under 600
