"""``.learners(mixed_precision="auto")`` (models/precision.py): bf16 compute over float32 master
weights where the learner's device computes bf16 in hardware, float32 elsewhere. The CPU's flags
are read from /proc/cpuinfo (x86 and aarch64 forms); the resolution table; validate() and the
planner; and an RLlib learner update under "auto" equals the "bf16" update where the device has
bf16 and the float32 update where it lacks it (which differ from each other)."""
from __future__ import annotations

import pytest
import torch

from rllib_spear import GRPOConfig
from rllib_spear.models import precision
from rllib_spear.models.precision import (cpu_flags, cpu_has_native_bf16, device_has_native_bf16,
                                          resolve_mixed_precision)

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 avx512_vnni
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 avx512_vnni
"""
AARCH64 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics bf16 i8mm
CPU implementer\t: 0x41
"""


def test_cpu_flags_reads_x86_and_aarch64_lines(tmp_path):
    x86, arm = tmp_path / "x86", tmp_path / "arm"
    x86.write_text(X86)
    arm.write_text(AARCH64)
    assert {"avx2", "avx512_bf16", "avx512_vnni"} <= cpu_flags(str(x86)) and "sysret_ss_attrs" not in cpu_flags(str(x86))
    assert {"asimd", "bf16", "i8mm"} <= cpu_flags(str(arm))
    assert cpu_flags(str(tmp_path / "missing")) == frozenset()  # not Linux: no flags, so no bf16


@pytest.mark.parametrize("flags, native", [
    ({"avx2", "fma"}, False),  # this project's CI CPU (AVX2 EPYC): bf16 would be emulated
    ({"avx512f", "avx512_vnni"}, False),  # AVX-512 without its BF16 extension
    ({"avx512f", "avx512_bf16"}, True),  # Zen 4, Cooper Lake
    ({"amx_bf16", "amx_tile"}, True),  # Sapphire Rapids
    ({"asimd", "bf16"}, True),  # Graviton 3, Neoverse V1
    (set(), False),
])
def test_cpu_has_native_bf16(flags, native):
    assert cpu_has_native_bf16(flags) is native
    assert device_has_native_bf16("cpu", flags=flags) is native


def test_other_devices():
    assert device_has_native_bf16("mps") is False
    if not torch.cuda.is_available():
        assert device_has_native_bf16("cuda") is True  # a driver planning GPU learners it does not hold


@pytest.mark.parametrize("setting, native, dtype, expected", [
    (None, True, "float32", None),
    ("bf16", False, "float32", "bf16"),  # an explicit choice is kept, even where emulated
    ("auto", True, "float32", "bf16"),
    ("auto", False, "float32", None),
    ("auto", True, "bfloat16", None),  # bf16 weights compute in bf16 without a cast
    ("auto", True, "fp32", "bf16"),
])
def test_resolution_table(setting, native, dtype, expected):
    assert resolve_mixed_precision(setting, device_type="cpu", weight_dtype=dtype, native_bf16=native) == expected


def test_bad_setting_names_the_knob():
    with pytest.raises(ValueError, match=r"mixed_precision must be one of .*'auto'"):
        resolve_mixed_precision("fp8", device_type="cpu")


@pytest.fixture(scope="module")
def tiny_model():
    from rllib_spear.models.factory import tiny_model_path

    return tiny_model_path()


def _config(path, mixed_precision):
    return (GRPOConfig().environment("search_qa").env_runners(num_env_runners=0)
            .training(lr=1e-3, micro_batch_token_budget=48, num_epochs=1)
            .learners(mixed_precision=mixed_precision)
            .rl_module(model_config={"model_path": path}).debugging(seed=0))


def test_validate_accepts_auto_and_names_the_choices(tiny_model):
    _config(tiny_model, "auto").validate()
    with pytest.raises(ValueError, match=r"`mixed_precision` must be None, 'bf16' or 'auto'"):
        _config(tiny_model, "fp16").validate()


def test_the_planner_resolves_auto(tiny_model, monkeypatch):
    from rllib_spear.planning.config_plan import _layouts_of

    gpu = _config(tiny_model, "auto").learners(num_gpus_per_learner=1)
    assert _layouts_of(gpu)[0].mixed_precision == "bf16"  # GPU learners: bf16 assumed
    monkeypatch.setattr(precision, "cpu_flags", lambda path="/proc/cpuinfo": frozenset({"avx2"}))
    assert _layouts_of(_config(tiny_model, "auto"))[0].mixed_precision is None
    monkeypatch.setattr(precision, "cpu_flags", lambda path="/proc/cpuinfo": frozenset({"amx_bf16"}))
    assert _layouts_of(_config(tiny_model, "auto"))[0].mixed_precision == "bf16"


def _update(cfg) -> dict:
    """The scalar metrics of one RLlib learner update (built in process) on a fixed batch: 4 rows
    of 20 tokens, the last 12 of each scored, advantages +-1."""
    import numpy as np
    from learner_update import learner_update_metrics

    from rllib_spear.core.trajectory import Segment, Trajectory
    from rllib_spear.recipe.batching import LearnerRow, build_learner_batches

    rng = np.random.default_rng(0)
    rows = []
    for i in range(4):
        segs = [Segment("prompt", rng.integers(3, 500, 8).tolist()),
                Segment("assistant", rng.integers(3, 500, 12).tolist(), (-0.5 - rng.random(12)).tolist(), 0)]
        t = Trajectory(uid=f"g{i // 2}", segments=segs, outcome_reward=float(i % 2), step_rewards=[0.0],
                       traj_id=f"t{i}")
        rows.append(LearnerRow(t, t.token_advantages(1.0 if i % 2 else -1.0), t.loss_mask()))
    batch = build_learner_batches(rows, num_learners=0, minibatch_size=4, t_norm=64.0, pad_token_id=0, seed=0,
                                  num_epochs=1)[0]
    return learner_update_metrics(cfg, batch)


def test_learner_update_under_auto_follows_the_hardware(tiny_model, monkeypatch):
    fp32, bf16 = _update(_config(tiny_model, None)), _update(_config(tiny_model, "bf16"))
    # the two precisions give different numbers, so the comparisons below can tell them apart
    assert abs(bf16["total_loss"] - fp32["total_loss"]) > 1e-6 or abs(bf16["grad_norm"] - fp32["grad_norm"]) > 1e-6
    for flags, same_as in (({"avx512_bf16"}, bf16), ({"avx2"}, fp32)):
        monkeypatch.setattr(precision, "cpu_flags", lambda path="/proc/cpuinfo", f=frozenset(flags): f)
        auto = _update(_config(tiny_model, "auto"))
        assert auto.keys() == same_as.keys()
        for k, v in same_as.items():
            assert auto[k] == pytest.approx(v, rel=1e-6, abs=1e-7), (flags, k)
