"""Filters that mask (nearly) a whole batch are reported loudly (one masked response quoted, the
model in use never recommended), and every configured filter's share is logged every iteration
(0 included)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_spear import SPEARConfig
from rllib_spear.algorithms.grpo.grpo import GRPO
from rllib_spear.recipe.filters import (TOOL_USE_COLD_START, FilterResult, apply_filters, filtered_batch_warning,
                                       masked_response)
from rllib_spear.testing import _contract_group


def test_every_configured_filter_is_reported_even_at_zero():
    cfg = SPEARConfig().training(response_filters=("overlong", "repetitive"), group_filter_keep_fraction=None)
    fr = apply_filters(_contract_group(), cfg).fractions
    assert fr == {"overlong": 0.0, "repetitive": 0.0, "any": 0.0}
    cfg = SPEARConfig().training(response_filters=("incomplete",), group_filter_keep_fraction=1.0)
    assert set(apply_filters(_contract_group(), cfg).fractions) == {"incomplete", "group_std", "any"}


def test_warning_names_the_filter_and_its_knob():
    assert filtered_batch_warning({"incomplete": 0.5, "any": 0.5}) is None
    w = filtered_batch_warning({"overlong": 0.25, "incomplete": 1.0, "any": 1.0})
    assert "100%" in w and "Most of it is 'incomplete'" in w
    assert "response_filters" in w and "overlong 25%" in w
    w = filtered_batch_warning({"group_std": 0.95, "any": 0.95})
    assert "group_filter_keep_fraction" in w
    assert "my_filter" in filtered_batch_warning({"my_filter": 1.0, "any": 1.0})


def test_warning_never_recommends_the_model_in_use():
    masked = {"incomplete": 1.0, "any": 1.0}
    for model in ("smollm2-instruct", "embedded", "/my/model", None):
        w = filtered_batch_warning(masked, model=model)
        assert f"'model_path': '{TOOL_USE_COLD_START}'" in w  # the tool-use cold start is the advice
        assert "model_path': 'smollm2-instruct'" not in w  # the instruct model writes prose, never advised
    w = filtered_batch_warning(masked, model=TOOL_USE_COLD_START)
    assert f"The model in use ('{TOOL_USE_COLD_START}')" in w
    assert "'model_path':" not in w  # no model is recommended: the one in use is the tool-use start


def test_warning_quotes_one_masked_response_cut_short():
    trajs = _contract_group()
    trajs[1].rollout.assistant_texts = ["The answer is probably seven. " * 40, "second turn"]
    sample = masked_response(trajs, [False, True] + [False] * (len(trajs) - 2), limit=80)
    assert sample.startswith("'The answer is probably seven.") and sample.endswith("...'") and len(sample) < 100
    assert masked_response(trajs, [False] * len(trajs)) is None
    w = filtered_batch_warning({"incomplete": 1.0, "any": 1.0}, sample=sample)
    assert w.endswith(f"One masked response: {sample}")


def test_the_algorithm_warns_once_per_run_and_logs_every_iteration(caplog):
    trajs = _contract_group()
    for t in trajs:
        t.rollout.assistant_texts = ["I think the river is the Sel."]
    config = SimpleNamespace(model_config={"model_path": "smollm2-instruct"})
    algo = SimpleNamespace(metrics=MetricsLogger(), algo_step=0, _warned_filtered_out=False, config=config)
    all_masked = FilterResult([], [True] * len(trajs), {"incomplete": 1.0, "any": 1.0})
    with caplog.at_level(logging.WARNING, logger="rllib_spear.algorithms.grpo.grpo"):
        for step in range(3):
            algo.algo_step = step
            GRPO._warn_if_filtered_out(algo, trajs, all_masked)
    assert caplog.text.count("masked 100% of this batch") == 1
    assert "One masked response: 'I think the river is the Sel.'" in caplog.text
    assert "smollm2-tools" in caplog.text
    assert algo.metrics.peek(("filters", "nearly_all_filtered")) == 1.0
    GRPO._warn_if_filtered_out(algo, trajs, FilterResult([], [False] * len(trajs), {"incomplete": 0.1, "any": 0.1}))
    assert algo.metrics.peek(("filters", "nearly_all_filtered")) == 0.0


def test_the_algorithm_does_not_recommend_the_tool_cold_start_it_runs(caplog, tmp_path, monkeypatch):
    """A run on the smollm2-tools build (its folder, as GRPO.setup resolves it) is told so."""
    import json

    folder = tmp_path / "sft-abc"
    (tmp_path / "smollm2-tools-0123456789abcdef.json").write_text(json.dumps({"path": str(folder)}))
    monkeypatch.setenv("RLLIB_SPEAR_CACHE", str(tmp_path))
    trajs = _contract_group()
    config = SimpleNamespace(model_config={"model_path": str(folder)})
    algo = SimpleNamespace(metrics=MetricsLogger(), algo_step=0, _warned_filtered_out=False, config=config)
    with caplog.at_level(logging.WARNING, logger="rllib_spear.algorithms.grpo.grpo"):
        GRPO._warn_if_filtered_out(algo, trajs, FilterResult([], [True] * len(trajs), {"incomplete": 1.0, "any": 1.0}))
    assert "The model in use ('smollm2-tools')" in caplog.text and "'model_path':" not in caplog.text


def test_the_iteration_line_shows_the_filtered_share_and_the_warning():
    from rllib_spear.progress import progress_line

    line = progress_line({"training_iteration": 3, "filters": {"any_frac": 0.25, "nearly_all_filtered": 0.0}})
    assert "filtered 0.250" in line and "WARNING" not in line
    line = progress_line({"training_iteration": 4, "filters": {"any_frac": 1.0, "nearly_all_filtered": 1.0}})
    assert "filtered 1.000" in line and "WARNING: the filters masked 100% of the batch" in line
