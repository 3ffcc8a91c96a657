"""Config builders, presets and validate() messages (no Ray cluster needed)."""
import pytest

import rllib_spear  # noqa: F401
from rllib_spear import DrBoTConfig, GRPOConfig, SPADERConfig, SPEARConfig


def test_grpo_defaults_and_builder():
    cfg = GRPOConfig().training(group_size=4, clip_ratio_high=0.3, lr=1e-5).env_runners(
        engine="hf", temperature=0.7, num_env_runners=2).environment("search_qa", env_config={"top_k": 3})
    assert cfg.group_size == 4 and cfg.clip_ratio_high == 0.3 and cfg.lr == 1e-5
    assert cfg.temperature == 0.7 and cfg.num_env_runners == 2
    assert cfg.env == "search_qa" and cfg.env_config == {"top_k": 3}
    assert cfg.std_normalize_advantages is True and cfg.loss_agg_mode == "token-mean"


def test_drbot_preset_switches_every_trick():
    cfg = DrBoTConfig()
    assert cfg.clip_ratio_high == 0.28 and cfg.dual_clip_c == 10.0
    assert cfg.std_normalize_advantages is False
    assert cfg.loss_agg_mode == "seq-mean-token-sum-norm"
    assert set(cfg.response_filters) == {"overlong", "incomplete", "repetitive", "unreadable"}
    assert cfg.group_filter_keep_fraction == 0.75 and cfg.kl_coeff == 0.0


def test_spear_defaults():
    cfg = SPEARConfig()
    assert cfg.loss_mode == "clip_cov" and cfg.clip_ratio_high == 0.28
    assert cfg.tool_reward_schedule == "cosine" and cfg.tool_reward_steps == 200
    assert cfg.sil_enabled and cfg.sil_trigger == "burst" and cfg.sil_update == "sequential"
    replay = cfg.policy_loss_config(replay=True)
    assert (replay.clip_cov_ratio, replay.clip_cov_lb, replay.clip_cov_ub) == (0.02, 2.0, 60.0)
    onp = cfg.policy_loss_config()
    assert (onp.clip_cov_ratio, onp.clip_cov_lb, onp.clip_cov_ub) == (2e-4, 1.0, 5.0)


def test_spader_defaults():
    cfg = SPADERConfig()
    assert cfg.advantage_estimator == "spa" and cfg.spa_gamma == 0.9
    assert cfg.clip_ratio_low == cfg.clip_ratio_high == 0.2 and cfg.loss_agg_mode == "token-mean"
    assert cfg.env == "multi_answer_search" and not cfg.sil_enabled
    assert cfg.tool_round_cost == 0.01 and cfg.cost_free_steps == 100


@pytest.mark.parametrize("kwargs, key", [
    ({"group_size": 0}, "group_size"),
    ({"loss_agg_mode": "token-sum"}, "loss_agg_mode"),
    ({"loss_mode": "ppo"}, "loss_mode"),
    ({"clip_ratio_low": -0.1}, "clip_ratio_low"),
    ({"dual_clip_c": 0.5}, "dual_clip_c"),
    ({"response_filters": ["toolong"]}, "response_filters"),
    ({"group_filter_keep_fraction": 1.5}, "group_filter_keep_fraction"),
    ({"sil_trigger": "sometimes"}, "sil_trigger"),
    ({"sil_update": "parallel"}, "sil_update"),
    ({"tool_reward_schedule": "linear"}, "tool_reward_schedule"),
    ({"sil_tolerate_steps": 11}, "sil_tolerate_steps"),
])
def test_validate_names_the_key(kwargs, key):
    cfg = SPEARConfig().training(**kwargs)
    with pytest.raises(ValueError, match=key):
        cfg.validate()


def test_validate_engine_and_lengths():
    with pytest.raises(ValueError, match="engine"):
        SPEARConfig().env_runners(engine="tgi").validate()
    with pytest.raises(ValueError, match="max_response_tokens"):
        SPEARConfig().env_runners(max_response_tokens=4096, max_model_len=1024).validate()


def test_unknown_training_kwarg_is_rejected():
    with pytest.raises(TypeError):
        SPEARConfig().training(group_sise=4)


def test_config_round_trips_through_dict():
    cfg = SPEARConfig().training(group_size=3, sil_capacity=16)
    d = cfg.to_dict()
    cfg2 = SPEARConfig().update_from_dict(d)
    assert cfg2.group_size == 3 and cfg2.sil_capacity == 16 and cfg2.loss_mode == "clip_cov"


def test_embedded_task_cold_start_with_another_call_format_warns(caplog):
    import logging

    from rllib_spear.coldstart import task_policy_env_config

    def config(env_config):
        return (SPADERConfig().environment("multi_answer_search", env_config=env_config)
                .rl_module(model_config={"model_path": "embedded:multi_answer_search"}))

    with caplog.at_level(logging.WARNING):
        config({}).validate()  # the env's default parser is spader: the cold start never calls it
    assert "parser 'search_r1'" in caplog.text and "task_policy_env_config" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        config(task_policy_env_config("multi_answer_search")).validate()
        SPADERConfig().rl_module(model_config={"model_path": "embedded"}).validate()
    assert "parser" not in caplog.text


@pytest.mark.parametrize("cls, kwargs, key", [
    (GRPOConfig, {"clip_cov_ratio": 0}, "clip_cov_ratio"),  # used to fail in the learner's first update
    (SPEARConfig, {"clip_cov_ratio": 0}, "clip_cov_ratio"),
    (SPEARConfig, {"replay_clip_cov_ratio": 0}, "replay_clip_cov_ratio"),
    (SPEARConfig, {"replay_clip_cov_lb": 70.0}, "replay_clip_cov_ub"),
    (SPEARConfig, {"kl_coeff": -1.0}, "kl_coeff"),
    (SPEARConfig, {"kl_estimator": "k2"}, "kl_estimator"),
    (SPEARConfig, {"clip_ratio_low": 1.0}, "clip_ratio_low"),
    (DrBoTConfig, {"kl_cov_ratio": 2.0}, "kl_cov_ratio"),
    (SPEARConfig, {"tis_cap": -1.0}, "tis_cap"),
])
def test_validate_runs_the_core_loss_checks_on_both_losses(cls, kwargs, key):
    """validate() checks with the core PolicyLossConfig.validate() (on-policy and replay loss), and
    the message names the training() kwarg to change."""
    cfg = cls().training(**kwargs).rl_module(model_config={"model_path": "embedded"})
    with pytest.raises(ValueError, match=f"`{key}`"):
        cfg.validate()


def test_tis_cap_can_be_switched_off_on_every_engine():
    for engine in ("hf", "vllm"):
        cfg = SPEARConfig().env_runners(engine=engine).training(tis_cap=0).rl_module(model_config={"model_path": "embedded"})
        cfg.validate()
        assert cfg.policy_loss_config().tis_cap is None
    auto = SPEARConfig().env_runners(engine="vllm")
    assert auto.policy_loss_config().tis_cap == 2.0 and auto.policy_loss_config(replay=True).tis_cap is None
    assert SPEARConfig().policy_loss_config().tis_cap is None


def test_one_dtype_table_for_learner_and_engines():
    import torch

    from rllib_spear.env_runners.engines import hf_engine
    from rllib_spear.models import dtypes, hf_policy

    for name in ("bf16", "bfloat16", "torch.bfloat16", "BF16"):
        assert dtypes.torch_dtype(name) is torch.bfloat16 and dtypes.dtype_name(name) == "bfloat16"
    assert dtypes.torch_dtype("fp32") is torch.float32 and dtypes.dtype_name("half") == "float16"
    # the learner's module (its loader, models/hf_policy.py) and the engines resolve through the same function
    assert hf_policy.torch_dtype is dtypes.torch_dtype and hf_engine.torch_dtype is dtypes.torch_dtype
    with pytest.raises(ValueError, match="bfloat16"):
        dtypes.torch_dtype("int8")
    SPEARConfig().rl_module(model_config={"model_path": "embedded", "dtype": "bf16"}).validate()
    with pytest.raises(ValueError, match="model_config\\['dtype'\\]"):
        SPEARConfig().rl_module(model_config={"model_path": "embedded", "dtype": "fp8"}).validate()


def test_rl_module_loads_bf16_by_its_short_name(tmp_path):
    import torch

    from rllib_spear.models.factory import tiny_model_path
    from rllib_spear.models.rl_module import HFCausalLMRLModule

    module = HFCausalLMRLModule(model_config={"model_path": tiny_model_path(tmp_path), "dtype": "bf16"})
    assert next(module.model.parameters()).dtype is torch.bfloat16


def test_learner_layout_kwargs():
    cfg = GRPOConfig().learners(num_learners=4, sharding="fsdp", mixed_precision="bf16",
                                cpu_offload=True, activation_checkpointing=True, gpu_memory_gb=80)
    assert (cfg.num_learners, cfg.sharding, cfg.mixed_precision, cfg.cpu_offload) == (4, "fsdp", "bf16", True)
    assert cfg.use_activation_checkpointing and cfg.gpu_memory_gb == 80
    # None defers to the module's own switch
    cfg = GRPOConfig().rl_module(model_config={"model_path": "embedded", "gradient_checkpointing": True})
    assert cfg.activation_checkpointing is None and cfg.use_activation_checkpointing
    assert GRPOConfig().env_runners(engine_gpu_memory_gb=141).engine_gpu_memory_gb == 141
    d = GRPOConfig().learners(sharding="fsdp").to_dict()
    assert d["sharding"] == "fsdp"


@pytest.mark.parametrize("learners, model_config, key", [
    ({"sharding": "zero3"}, {}, "sharding"),
    ({"sharding": "fsdp", "num_learners": 0}, {}, "num_learners"),
    ({"cpu_offload": True}, {}, "cpu_offload"),
    ({"mixed_precision": "fp8"}, {}, "mixed_precision"),
    ({"mixed_precision": "bf16"}, {"dtype": "bfloat16"}, "float32"),
    ({"gpu_memory_gb": -1}, {}, "gpu_memory_gb"),
    ({"sharding": "fsdp", "num_learners": 2, "_clip_by": "value"}, {}, "grad_clip_by"),
])
def test_validate_learner_layout(learners, model_config, key):
    learners = dict(learners)
    clip_by = learners.pop("_clip_by", None)
    cfg = GRPOConfig().learners(**learners).rl_module(model_config={"model_path": "embedded", **model_config})
    if clip_by:
        cfg = cfg.training(grad_clip_by=clip_by)
    with pytest.raises(ValueError, match=key):
        cfg.validate()


def test_bf16_master_weights_warn_with_the_measured_effect(caplog):
    import logging

    import ray.util.debug as debug

    debug.reset_log_once("low_precision_master")  # the warning is once per process
    cfg = GRPOConfig().rl_module(model_config={"model_path": "embedded", "dtype": "bfloat16"})
    with caplog.at_level(logging.WARNING):
        cfg.validate()
    text = caplog.text
    assert "mixed_precision='bf16'" in text and "2.1%" in text and "benchmarks/master_weights.py" in text


def test_negative_entropy_coeff_is_refused_before_the_first_update():
    with pytest.raises(ValueError, match="entropy_coeff.*>= 0"):
        SPEARConfig().training(entropy_coeff=-0.01).validate()
    SPEARConfig().training(entropy_coeff=0.0).validate()


def test_model_config_temperature_must_agree_with_temperature():
    """The learner scored under model_config['temperature'] while the engine and the reference
    model used `temperature`: one source of truth."""
    cfg = SPEARConfig().rl_module(model_config={"model_path": "embedded", "temperature": 0.7})
    with pytest.raises(ValueError, match=r"model_config\['temperature'\].*env_runners\(temperature"):
        cfg.validate()
    SPEARConfig().env_runners(temperature=0.7).validate()  # the scoring temperature follows it
    assert SPEARConfig().env_runners(temperature=0.7).model_config["temperature"] == 0.7


def test_lr_warmup_with_an_lr_schedule_is_refused_not_dropped():
    cfg = SPADERConfig().training(lr=[[0, 1e-5], [100, 1e-6]])  # SPADER warms up 10 steps by default
    with pytest.raises(ValueError, match="lr_warmup_steps.*schedule"):
        cfg.validate()
    SPADERConfig().training(lr=[[0, 1e-5], [100, 1e-6]], lr_warmup_steps=0).validate()
