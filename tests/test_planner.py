"""The memory planner (rllib_spear/planning/, docs/memory_planner.md): exact parameter counts,
hand-computed state bytes per layout, the activation trace against torch's saved tensors, the
validate() hook, the ``rllib-spear plan`` command and every shipped recipe."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_spear import planning
from rllib_spear.models.activations import Precision, saved_bytes
from rllib_spear.models.shapes import ModelShape, bundled_model_config, bundled_model_names, model_config_for

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import planner_accuracy as accuracy  # noqa: E402

#: Published parameter counts (the model cards' safetensors totals).
REAL_COUNTS = {
    "Qwen2.5-1.5B-Instruct": 1_543_714_304,
    "Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen2.5-32B-Instruct": 32_763_876_352,
    "Llama-3.1-8B-Instruct": 8_030_261_248,
    "Qwen3-8B": 8_190_735_360,
    "SmolLM2-135M-Instruct": 134_515_008,  # the model of the "smollm2-*" cold starts
}


# ---------------------------------------------------------------------- shapes
@pytest.mark.parametrize("name", sorted(REAL_COUNTS))
def test_bundled_config_parameter_counts_are_exact(name):
    assert name in bundled_model_names()
    assert ModelShape.from_config(bundled_model_config(name), name).num_params == REAL_COUNTS[name]


def test_bundled_configs_are_exactly_the_counted_models():
    assert sorted(bundled_model_names()) == sorted(REAL_COUNTS)


def test_tiny_model_parameter_count_matches_torch():
    from transformers import AutoModelForCausalLM

    from rllib_spear.models.factory import tiny_model_path

    path = tiny_model_path()
    model = AutoModelForCausalLM.from_pretrained(path)
    assert ModelShape.from_config(path).num_params == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("arch, extra", [("qwen3", {}), ("llama", {"attention_bias": True, "mlp_bias": True}),
                                         ("qwen2", {"tie_word_embeddings": True})])
def test_random_model_parameter_counts_match_torch(arch, extra):
    cfg = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)
    cfg.update(extra)
    model = accuracy.random_model(arch, **cfg)
    shape = ModelShape.from_config({"model_type": arch, **cfg})
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    from peft import LoraConfig, get_peft_model

    lora = {"r": 4, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    peft = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
    assert shape.lora_params(lora) == sum(p.numel() for p in peft.parameters() if p.requires_grad)


def test_model_path_resolution(tmp_path):
    assert model_config_for("/models/Qwen2.5-7B-Instruct")[1] == "Qwen2.5-7B-Instruct"
    assert model_config_for("meta-llama/Llama-3.1-8B-Instruct")[1] == "Llama-3.1-8B-Instruct"
    assert model_config_for("/my/models/qwen2.5-32b-retool-sft")[1] == "Qwen2.5-32B-Instruct"
    assert model_config_for("/x/Meta-Llama-3.1-8B-Instruct/")[1] == "Llama-3.1-8B-Instruct"
    # a folder with a config.json wins over a bundled name
    folder = tmp_path / "Qwen2.5-7B-Instruct"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**bundled_model_config("Qwen2.5-1.5B-Instruct")}))
    cfg, _, source = model_config_for(str(folder))
    assert cfg["hidden_size"] == 1536 and source.endswith("config.json")
    with pytest.raises(ValueError, match="config.json"):
        model_config_for("/models/my-own-model")
    from rllib_spear.coldstart import resolve_model_path

    with pytest.raises(ValueError, match="resolve"):
        model_config_for("embedded")  # the model layer does not know the cold starts
    cfg, name, _ = model_config_for("embedded", resolve=resolve_model_path)
    assert name == "embedded" and cfg["model_type"] in ("qwen2", "llama")


def test_planner_module_imports_no_torch():
    code = "import sys, rllib_spear.planning; print('torch' in sys.modules)"
    env = {**os.environ, "RLLIB_SPEAR_NO_REGISTER": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------- hand-computed state bytes
#: A made-up qwen2 shape: h 64, I 128, 2 layers, 2 heads / 1 kv head of 32, vocab 100, untied.
SMALL = ModelShape.from_config({"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
                                "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                                "head_dim": 32, "vocab_size": 100, "tie_word_embeddings": False})
# per block: q 64*64 + 64, k and v 64*32 + 32 each, o 64*64, MLP 3*64*128, two norms 2*64
BLOCK = 4096 + 64 + 2 * (2048 + 32) + 4096 + 3 * 64 * 128 + 128
ROOT_P = 100 * 64 + 64 + 100 * 64
P = 2 * BLOCK + ROOT_P


def _learner(**kw):
    return planning.plan_learner(SMALL, planning.LearnerLayout(**kw), micro_batch_token_budget=64, max_model_len=32)


def test_small_shape_counts():
    assert (SMALL.block_params, SMALL.root_params, SMALL.num_params) == (BLOCK, ROOT_P, P) == (37120, 12864, 87104)


def test_ddp_state_bytes():
    one = _learner(num_learners=1)
    assert (one.params, one.grads, one.optim, one.step_temp, one.buckets, one.gathered) == (4 * P, 4 * P, 8 * P, 4 * P, 0, 0)
    two = _learner(num_learners=2)
    assert (two.params, two.grads, two.optim, two.buckets) == (4 * P, 4 * P, 8 * P, 4 * P)  # replicas + DDP buckets
    assert _learner(num_learners=2, ddp_bucket_view=True).buckets == 0


def test_fsdp_halves_params_grads_and_optimizer_state():
    f = _learner(num_learners=2, sharding="fsdp")
    assert (f.params, f.grads, f.optim, f.step_temp, f.buckets) == (2 * P, 2 * P, 4 * P, 2 * P, 0)
    # float32 gather: two blocks + one block's unsharded grads + the root and its grads
    assert f.gathered == 4 * (2 * BLOCK + BLOCK + 2 * ROOT_P)
    bf = _learner(num_learners=2, sharding="fsdp", mixed_precision="bf16")
    assert (bf.params, bf.grads, bf.optim) == (2 * P, 2 * P, 4 * P)  # float32 master shards
    assert bf.gathered == 2 * 2 * BLOCK + (2 + 4) * BLOCK + 2 * ROOT_P + 2 * ROOT_P


def test_cpu_offload_moves_the_state_to_cpu():
    off = _learner(num_learners=2, sharding="fsdp", cpu_offload=True)
    assert (off.params, off.grads, off.optim, off.step_temp) == (0, 0, 0, 0)
    assert off.cpu_ram_per_rank == (4 + 4 + 8 + 4) * P // 2
    assert off.cpu_ram_per_node == 2 * off.cpu_ram_per_rank  # both ranks on one node
    assert off.gathered == _learner(num_learners=2, sharding="fsdp").gathered


def test_lora_trains_only_the_adapters():
    lora = {"r": 4, "target_modules": ["q_proj", "v_proj"]}
    adapters = 2 * (4 * (64 + 64) + 4 * (64 + 32))
    assert SMALL.lora_params(lora) == adapters == 1792
    lp = _learner(num_learners=1, lora=lora)
    assert (lp.params, lp.grads, lp.optim) == (4 * (P + adapters), 4 * adapters, 8 * adapters)


def test_reference_model_and_bf16_storage():
    ref = _learner(num_learners=2, sharding="fsdp", reference_model=True)
    assert ref.reference == 4 * P // 2 + 4 * ROOT_P
    pure = _learner(weight_dtype="bfloat16")
    assert (pure.params, pure.grads, pure.optim) == (2 * P, 2 * P, 4 * P)


def test_autocast_copies_every_matmul_weight():
    lp = _learner(mixed_precision="bf16")
    assert lp.autocast_copy == 2 * (2 * SMALL.block_linear_weights + 100 * 64)


def test_packing_cases():
    assert planning.packing_cases(8192, 2560) == [(3, 2560)]
    assert planning.packing_cases(32768, 32768) == [(1, 32768), (2, 16384)]
    assert planning.packing_cases(4096, 8704) == [(1, 4096), (2, 2048), (1, 8704)]


# ---------------------------------------------------------------------- activations vs torch
#: The trace is exact on these models (benchmarks/planner_accuracy.py: ratio 1.000); the tolerance
#: leaves room for small changes of torch / transformers internals.
ACTIVATION_TOLERANCE = 0.02
_TINY_CFG = dict(vocab_size=500, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("regime", ["fp32", "bf16", "autocast", "lora"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
def test_activation_estimate_matches_saved_tensors(arch, regime, checkpointing):
    import torch

    dtype = torch.bfloat16 if regime == "bf16" else torch.float32
    prec = {"fp32": Precision(4), "bf16": Precision(2), "autocast": Precision(4, autocast=True),
            "lora": Precision(4)}[regime]
    shape = ModelShape.from_config({"model_type": arch, **_TINY_CFG})
    model = accuracy.random_model(arch, dtype, **_TINY_CFG)
    lora = {"r": 4, "target_modules": ["q_proj", "v_proj"]} if regime == "lora" else None
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **lora))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            model.enable_input_require_grads()
    # unpadded (is_causal, GQA in SDPA) and padded (mask); the head in one chunk (not checkpointed)
    # and in chunks of 8 positions per row (checkpointed)
    for rows, row_len, chunk in ((1, 96, None), (3, 40, None), (1, 96, 8), (3, 40, 8)):
        ids, mask = accuracy.micro_batch(shape.vocab, rows, row_len, padded=rows > 1)
        scored = int((mask[:, 1:].bool() & mask[:, :-1].bool()).sum())  # targets with a left context
        measured = accuracy.measure_saved(model, ids, mask, autocast=prec.autocast, chunk_size=chunk)
        est = saved_bytes(shape, prec, rows=rows, row_len=row_len, checkpointing=checkpointing,
                          lora_targets=shape.lora_targets(lora["target_modules"]) if lora else (),
                          lora_r=4 if lora else 0, scored=scored, chunk_size=chunk).total
        assert abs(est / measured - 1) <= ACTIVATION_TOLERANCE, (rows, row_len, chunk, est, measured)


def test_per_layer_formula_of_the_docs():
    """Full fine-tune, no mask, no autocast: per token and layer 2(4h + 4 + bh) + 2bh + b(2q + 2kv)
    + 4H + 4bi (models/activations.py)."""
    s = ModelShape.from_config(bundled_model_config("Qwen2.5-7B-Instruct"))
    for b in (4, 2):
        per_layer = (saved_bytes(s, Precision(b), rows=1, row_len=100, layers=2).per_token
                     - saved_bytes(s, Precision(b), rows=1, row_len=100, layers=1).per_token)
        h, q, kv, i = s.hidden, s.q_width, s.kv_width, s.intermediate
        assert per_layer == 2 * (4 * h + 4 + b * h) + 2 * b * h + b * (2 * q + 2 * kv) + 4 * s.heads + 4 * b * i


# ---------------------------------------------------------------------- validate() and the CLI
def _recipe(name: str, *overrides: str):
    from rllib_spear.cli import build_config, load_experiment

    return build_config(load_experiment(str(ROOT / "configs" / name), list(overrides)))


def test_validate_refuses_a_7b_ddp_full_finetune_on_80_gb_naming_fsdp():
    cfg = _recipe("spear_qwen2.5_7b_search.yaml", "learners.sharding=ddp")
    with pytest.raises(ValueError) as e:
        cfg.validate(check_files=False)
    msg = str(e.value)
    assert msg.startswith(planning.MEMORY_ERROR)
    assert '.learners(sharding="fsdp")' in msg and "GiB per learner GPU" in msg and "gpu_memory_gb=80" in msg


def test_fixes_give_the_cli_form_too():
    msg = planning.check_fits(_recipe("spear_qwen2.5_7b_search.yaml", "learners.sharding=ddp"))
    assert '.learners(sharding="fsdp") (--set learners.sharding=fsdp)' in msg
    assert "--set learners.cpu_offload=true" in msg
    assert "--set rl_module.model_config.lora=" in msg
    msg = planning.check_fits(_recipe("spear_qwen2.5_32b_code_math.yaml", "env_runners.num_gpus_per_env_runner=1",
                                     "env_runners.engine_kwargs.tensor_parallel_size=1"))
    assert "--set env_runners.engine_kwargs.tensor_parallel_size=" in msg


def test_host_memory_is_part_of_the_verdict():
    cfg = _recipe("spear_qwen2.5_32b_code_math.yaml")
    p = planning.plan(cfg, host_memory_gb=512)  # the recipe pins ~610 GiB per learner node
    assert p.learner_fits is True and p.host_fits is False and p.fits is False
    (msg,) = planning.plan_problems(p)
    assert "pinned host memory" in msg and "host_memory_gb=512" in msg and "--set learners.num_learners=16" in msg
    assert planning.plan(cfg, host_memory_gb=2048).fits is True
    assert planning.plan(cfg).host_fits is None  # validate() declares no host memory: not checked
    # no offload, nothing pinned: no host verdict
    assert planning.plan(_recipe("spear_qwen2.5_7b_search.yaml"), host_memory_gb=1).host_fits is None


def test_cli_plan_exits_1_when_the_host_memory_is_short(capsys):
    from rllib_spear.cli import main

    path = str(ROOT / "configs" / "spear_qwen2.5_32b_code_math.yaml")
    assert main(["plan", path, "--host-memory-gb", "256"]) == 1
    out = capsys.readouterr().out
    assert "host memory 610.27 GiB pinned (cpu_offload) of 256 GiB: DOES NOT FIT" in out
    assert main(["plan", path]) == 0  # the default: an 8-GPU node's 2 TiB
    assert "of 2048 GiB: fits" in capsys.readouterr().out


def test_validate_accepts_the_shipped_7b_recipe_and_ignores_undeclared_memory():
    _recipe("spear_qwen2.5_7b_search.yaml").validate(check_files=False)
    # the same DDP layout without a declared GPU is not checked (the CPU default)
    _recipe("spear_qwen2.5_7b_search.yaml", "learners.sharding=ddp", "learners.gpu_memory_gb=null").validate(
        check_files=False)


def test_validate_names_the_other_knobs():
    msg = planning.check_fits(_recipe("spear_qwen2.5_32b_code_math.yaml", "learners.cpu_offload=false"))
    assert "cpu_offload=True" in msg and "num_learners=16" in msg and "CPU RAM per node" in msg
    # 16384-token micro-batches of 4608-token episodes need 79.9 GiB without checkpointing
    msg = planning.check_fits(_recipe("spear_qwen2.5_1.5b_search.yaml", "training.micro_batch_token_budget=16384",
                                     "learners.gpu_memory_gb=78"))
    assert "activation_checkpointing=True" in msg and "micro_batch_token_budget=8192" in msg
    msg = planning.check_fits(_recipe("spear_qwen2.5_32b_code_math.yaml", "env_runners.num_gpus_per_env_runner=1",
                                     "env_runners.engine_kwargs.tensor_parallel_size=1"))
    assert '"tensor_parallel_size": 2' in msg or '"tensor_parallel_size": 4' in msg


def test_engine_gpu_memory_is_checked_on_its_own():
    cfg = _recipe("spear_qwen2.5_7b_search.yaml", "learners.gpu_memory_gb=null", "env_runners.engine_gpu_memory_gb=16")
    with pytest.raises(ValueError, match="KV cache"):
        cfg.validate(check_files=False)


def test_cli_plan_prints_the_table_and_exits_0(capsys):
    from rllib_spear.cli import main

    assert main(["plan", str(ROOT / "configs" / "spear_qwen2.5_7b_search.yaml")]) == 0
    out = capsys.readouterr().out
    assert "| strategy |" in out and "(this config)" in out and "KV cache" in out
    assert "verdict: fits" in out


def test_cli_plan_exits_1_when_it_does_not_fit(capsys):
    from rllib_spear.cli import main

    path = str(ROOT / "configs" / "spear_qwen2.5_7b_search.yaml")
    assert main(["plan", path, "--set", "learners.sharding=ddp"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main(["plan", path, "--set", "learners.gpu_memory_gb=null", "--gpu-memory-gb", "40"]) == 1


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_plans(path):
    from rllib_spear.cli import build_config, load_experiment

    cfg = build_config(load_experiment(str(path)))
    p = planning.plan(cfg)
    assert p.learner.total > 0 and len(p.alternatives) >= 4
    text = planning.format_plan(p)
    assert "| strategy |" in text
    if cfg.gpu_memory_gb is not None:
        assert p.fits is True, text


# ---------------------------------------------------------------------- CPU learners' host memory
def _cpu_config(model_path: str = "smollm2-tools", budget: int = 8192, **learners):
    from rllib_spear import SPEARConfig

    return (SPEARConfig().environment("search_qa").env_runners(num_env_runners=0, max_new_tokens=64, max_turns=2)
            .rl_module(model_config={"model_path": model_path}).learners(**learners)
            .training(tasks_per_iteration=12, group_size=4, micro_batch_token_budget=budget))


def test_a_named_cold_start_is_sized_without_building_it(monkeypatch):
    from rllib_spear.coldstart import lookup

    def no_build(path):
        raise AssertionError(f"sizing built {path}")

    monkeypatch.setattr(lookup, "resolve_model_path", no_build)
    p = planning.plan(_cpu_config())
    assert p.shape.num_params == REAL_COUNTS["SmolLM2-135M-Instruct"] and p.shape.name == "smollm2-tools"
    assert "'smollm2-tools'" in p.model_source


def test_cpu_learners_are_checked_against_host_memory():
    """The README snippet's first form (budget 8192) peaked at 21.1 GB RSS on CPU (docs/benchmarks.md):
    the plan holds the whole learner in host RAM and names what fits."""
    p = planning.plan(_cpu_config(), host_memory_gb=12)
    assert not p.learner_on_gpu and p.learner_host_bytes == p.learner.total
    assert 15 < p.learner_host_bytes / 2**30 < 20 and p.host_fits is False and p.fits is False
    (msg,) = planning.plan_problems(p)
    assert "more than the 12 GiB of host memory" in msg
    assert "--set training.micro_batch_token_budget=4096" in msg  # the largest halving that fits (11.3 GiB)
    assert "--set learners.activation_checkpointing=true" in msg
    assert "CPU learners" in planning.format_plan(p)
    assert planning.plan(_cpu_config(budget=2048), host_memory_gb=12).host_fits is True
    two = planning.plan(_cpu_config(num_learners=2), host_memory_gb=64)
    assert two.learner_host_bytes == 2 * two.learner.total  # both ranks on this machine
    assert planning.plan(_cpu_config(num_gpus_per_learner=1), host_memory_gb=1).host_fits is None  # GPU learners


def test_validate_warns_when_cpu_learners_exceed_this_machines_ram(monkeypatch, caplog):
    import logging

    from rllib_spear.algorithms.grpo import layout_checks
    from rllib_spear.planning import memory_plan

    monkeypatch.setattr(memory_plan, "available_host_memory_gb", lambda meminfo="/proc/meminfo": 8.0)
    assert planning.check_cpu_learner_memory(_cpu_config()) is not None
    assert planning.check_cpu_learner_memory(_cpu_config(budget=512)) is None
    assert planning.check_cpu_learner_memory(_cpu_config(num_gpus_per_learner=1)) is None
    assert planning.check_cpu_learner_memory(_cpu_config(model_path="embedded")) is None  # never resolved
    assert planning.check_cpu_learner_memory(_cpu_config(model_path="/no/such/model")) is None  # cannot size
    monkeypatch.setattr(layout_checks, "log_once", lambda key: True)  # the warning is once per process
    with caplog.at_level(logging.WARNING):
        _cpu_config().validate()
    assert "micro_batch_token_budget" in caplog.text and "killed for memory" in caplog.text


def test_available_host_memory_reads_meminfo(tmp_path):
    from rllib_spear.planning.memory_plan import available_host_memory_gb

    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24576000 kB\nMemFree:  1000 kB\nMemAvailable:   20971520 kB\n")
    assert available_host_memory_gb(str(f)) == pytest.approx(20.0)
    assert available_host_memory_gb(str(tmp_path / "missing")) > 0  # the physical RAM instead


def test_cli_plan_checks_cpu_learners_against_this_machine(capsys):
    from rllib_spear.cli import main

    path = str(ROOT / "configs" / "spear_cpu_demo.yaml")
    assert main(["plan", path]) == 0
    out = capsys.readouterr().out
    assert "GiB available on this machine, where CPU learners run" in out and "CPU learners" in out
    assert main(["plan", path, "--host-memory-gb", "1"]) == 1  # the 3 GiB allowance alone is more
    out = capsys.readouterr().out
    assert "available on this machine" not in out and "more than the 1 GiB of host memory" in out


# ---------------------------------------------------------------------- packed micro-batches
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("attention", ["sdpa", "sdpa_varlen"])
def test_packed_micro_batch_saved_bytes(arch, checkpointing, attention):
    """packed_microbatches: the real tokens of ragged rows scored as one packed row of N tokens.
    sdpa saves what one row of N tokens with a dense mask does (the N x N float bias per layer,
    more than the same row without a mask: the term the planner adds for packed layouts);
    sdpa_varlen saves no bias, only the repeated k/v and the documents' outputs beside their
    concatenation (``saved_bytes(varlen=True)``)."""
    from rllib_spear.models import varlen_attention  # noqa: F401  registers "sdpa_varlen"

    shape = ModelShape.from_config({"model_type": arch, **_TINY_CFG})
    model = accuracy.random_model(arch, **_TINY_CFG)
    model.config._attn_implementation = attention
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    varlen = attention == "sdpa_varlen"
    for rows, row_len in ((3, 40), (4, 96)):
        ids, mask = accuracy.micro_batch(shape.vocab, rows, row_len, padded=True)
        n = int(mask.sum())
        scored = int((mask[:, 1:].bool() & mask[:, :-1].bool()).sum())
        measured = accuracy.measure_saved(model, ids, mask, packed=True)
        est = saved_bytes(shape, Precision(4), rows=1, row_len=n, checkpointing=checkpointing, padded=not varlen,
                          scored=scored, varlen=varlen).total
        assert abs(est / measured - 1) <= ACTIVATION_TOLERANCE, (rows, row_len, est, measured)
        if not checkpointing and not varlen:
            no_mask = saved_bytes(shape, Precision(4), rows=1, row_len=n, padded=False, scored=scored).total
            assert measured - no_mask > 0.5 * 2 * n * n * 4  # 2 layers' N x N float32 bias, at least half


def test_the_planner_sizes_packed_layouts():
    from rllib_spear.planning.layouts import LearnerLayout

    shape = ModelShape.from_config(bundled_model_config("Qwen2.5-1.5B-Instruct"))
    base = LearnerLayout(sharding="fsdp", num_learners=1, mixed_precision="bf16", activation_checkpointing=False)
    kw = dict(micro_batch_token_budget=16384, max_model_len=4096)
    padded = planning.plan_learner(shape, base, **kw).activations
    packed = planning.plan_learner(shape, base.replace(packed=True), **kw).activations
    flex = planning.plan_learner(shape, base.replace(packed=True, attention="flex_attention"), **kw).activations
    assert (packed.rows, packed.row_len, packed.padded) == (1, 16384, True)
    assert (flex.rows, flex.row_len, flex.padded) == (1, 16384, False)
    # what a mask costs beyond no mask (its float bias, and k/v repeated to all heads, the same for
    # both): the bias of a padded part is rows x T^2 = 4 x 4096^2 elements per layer, a packed
    # row's 16384^2; in bf16 over 28 layers the difference is 28 x (16384^2 - 4 x 4096^2) x 2 bytes
    prec = Precision(2, gathered=True)
    mask_cost = lambda r, t: saved_bytes(shape, prec, rows=r, row_len=t, padded=True).activations - saved_bytes(  # noqa: E731
        shape, prec, rows=r, row_len=t, padded=False).activations
    assert mask_cost(1, 16384) - mask_cost(4, 4096) == 28 * (16384**2 - 4 * 4096**2) * 2  # 10.5 GiB
    varlen = planning.plan_learner(shape, base.replace(packed=True, attention="sdpa_varlen"), **kw).activations
    assert (varlen.rows, varlen.row_len, varlen.padded) == (1, 16384, False)
    assert packed.total > padded.total > varlen.total > flex.total  # varlen: repeated k/v, two outputs
    assert planning.packed_cases(4096, 8192) == [(1, 4096), (1, 8192)]  # a row alone over the budget


def test_config_packed_knob_reaches_the_plan():
    from rllib_spear import GRPOConfig

    cfg = (GRPOConfig().environment("search_qa")
           .rl_module(model_config={"model_path": "Qwen2.5-1.5B-Instruct", "attn_implementation": "flex_attention"})
           .learners(packed_microbatches=True))
    lay = planning.plan(cfg).learner.layout
    assert lay.packed and lay.attention == "flex_attention" and not lay.dense_packed_mask
    assert "packed micro-batches (flex_attention: no dense mask)" in planning.format_plan(planning.plan(cfg))
