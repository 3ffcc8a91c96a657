"""``.evaluation()`` knobs of the configs: builder, YAML section, validate() messages, and the
evaluation config RLlib derives (no Ray cluster needed)."""
import pytest

import rllib_spear  # noqa: F401
from rllib_spear import GRPOConfig, SPADERConfig, SPEARConfig
from rllib_spear.algorithms.grpo.defaults import EVALUATION_DEFAULTS
from rllib_spear.algorithms.grpo.evaluation import dataset_label, eval_settings, eval_source


def test_defaults_and_builder():
    cfg = SPEARConfig()
    assert {k: getattr(cfg, k) for k in EVALUATION_DEFAULTS} == EVALUATION_DEFAULTS
    assert cfg.eval_temperature == 0.0 and cfg.eval_samples == 1 and cfg.evaluation_interval is None
    cfg.evaluation(evaluation_interval=5, eval_before_train=True, eval_samples=32, eval_temperature=1.0,
                   eval_top_p=0.6, eval_num_tasks=10, eval_max_new_tokens=64, evaluation_duration=3)
    assert cfg.evaluation_interval == 5 and cfg.eval_before_train and cfg.eval_samples == 32
    assert (cfg.eval_temperature, cfg.eval_top_p, cfg.eval_top_k) == (1.0, 0.6, -1)
    assert cfg.eval_num_tasks == 10 and cfg.eval_max_new_tokens == 64
    assert cfg.evaluation_duration == 3, "RLlib's own evaluation() kwargs still pass through"
    cfg.validate()


def test_yaml_evaluation_section():
    from rllib_spear.cli import build_config

    cfg = build_config({"algorithm": "SPEAR", "config": {
        "evaluation": {"evaluation_interval": 5, "eval_before_train": True, "eval_samples": 32,
                       "eval_temperature": 1.0, "eval_top_p": 0.6},
        "environment": {"eval_dataset": "search_qa"}}})
    assert (cfg.evaluation_interval, cfg.eval_samples, cfg.eval_top_p) == (5, 32, 0.6)
    assert cfg.eval_before_train and cfg.eval_dataset == "search_qa"


@pytest.mark.parametrize("kwargs, key", [
    ({"eval_samples": 0}, "eval_samples"),
    ({"eval_samples": 2.5}, "eval_samples"),
    ({"eval_temperature": -0.1}, "eval_temperature"),
    ({"eval_top_p": 0.0}, "eval_top_p"),
    ({"eval_top_p": 1.5}, "eval_top_p"),
    ({"eval_top_k": 0}, "eval_top_k"),
    ({"eval_max_new_tokens": 0}, "eval_max_new_tokens"),
    ({"eval_num_tasks": 0}, "eval_num_tasks"),
    ({"eval_split": ""}, "eval_split"),
    ({"eval_before_train": "yes"}, "eval_before_train"),
    ({"evaluation_interval": -1}, "evaluation_interval"),
    ({"evaluation_num_env_runners": 1, "evaluation_interval": 1}, "evaluation_num_env_runners"),
])
def test_validate_names_the_key(kwargs, key):
    cfg = GRPOConfig().evaluation(**kwargs)
    with pytest.raises(ValueError, match=key):
        cfg.validate()


def test_greedy_is_valid_for_evaluation_but_not_for_training():
    GRPOConfig().evaluation(eval_temperature=0.0).validate()
    with pytest.raises(ValueError, match="`temperature` must be > 0"):
        GRPOConfig().env_runners(temperature=0.0).validate()


def test_no_separate_evaluation_runner_group():
    """RLlib's setup builds an evaluation EnvRunnerGroup (in the driver, with its own engine)
    whenever the evaluation config has an interval; ours never has one."""
    from ray.rllib.algorithms.algorithm import Algorithm

    cfg = SPADERConfig().evaluation(evaluation_interval=1)
    eval_cfg = cfg.get_evaluation_config_object()
    assert eval_cfg.in_evaluation and eval_cfg.evaluation_interval is None
    assert cfg.evaluation_interval == 1, "the main config keeps the interval that Algorithm.step reads"
    assert not Algorithm._should_create_evaluation_env_runners(eval_cfg)
    eval_cfg.validate()


def test_eval_settings_take_overrides_then_the_config():
    cfg = GRPOConfig().evaluation(eval_samples=4, eval_temperature=1.0, eval_top_p=0.6)
    run = eval_settings(cfg)
    assert (run.split, run.num_tasks, run.samples) == ("test", None, 4)
    assert run.sampling == {"temperature": 1.0, "top_p": 0.6, "top_k": -1, "max_new_tokens": None}
    run = eval_settings(cfg, samples=32, temperature=0.0, max_new_tokens=8, split="train", num_tasks=3)
    assert (run.split, run.num_tasks, run.samples) == ("train", 3, 32)
    assert run.sampling == {"temperature": 0.0, "top_p": 0.6, "top_k": -1, "max_new_tokens": 8}


@pytest.mark.parametrize("overrides, match", [
    ({"samples": 0}, "samples per task"), ({"num_tasks": 0}, "num_tasks"),
    ({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"colour": 1}, "unknown"),
])
def test_eval_settings_refuse_bad_values(overrides, match):
    with pytest.raises(ValueError, match=match):
        eval_settings(GRPOConfig(), **overrides)


def test_eval_source_and_labels(tmp_path):
    cfg = GRPOConfig()
    assert eval_source(cfg) == "search_qa"
    cfg.environment(dataset="/data/train.parquet")
    assert eval_source(cfg) == "/data/train.parquet"
    cfg.environment(eval_dataset="/data/bamboogle.parquet")
    assert eval_source(cfg) == "/data/bamboogle.parquet" and eval_source(cfg, "x.parquet") == "x.parquet"
    assert dataset_label("/data/bamboogle.parquet") == "bamboogle"
    assert dataset_label(tmp_path / "nq") == "nq"
    assert dataset_label({"path": "/data/aime_2025.parquet", "dataset_format": "aime25"}) == "aime_2025"
    assert dataset_label("search_qa") == "search_qa"
    assert dataset_label([{"question": "q"}]) == "all"
