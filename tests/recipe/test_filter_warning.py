"""Filters that mask (nearly) a whole batch are reported loudly, and every configured filter's
share is logged every iteration (0 included)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_spear import SPEARConfig
from rllib_spear.algorithms.grpo.grpo import GRPO
from rllib_spear.recipe.filters import apply_filters, filtered_batch_warning
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
    assert "100%" in w and "Most of it is 'incomplete'" in w and "smollm2-instruct" in w
    assert "response_filters" in w and "overlong 25%" in w
    w = filtered_batch_warning({"group_std": 0.95, "any": 0.95})
    assert "group_filter_keep_fraction" in w
    assert "my_filter" in filtered_batch_warning({"my_filter": 1.0, "any": 1.0})


def test_the_algorithm_warns_once_per_run_and_logs_every_iteration(caplog):
    algo = SimpleNamespace(metrics=MetricsLogger(), algo_step=0, _warned_filtered_out=False)
    with caplog.at_level(logging.WARNING, logger="rllib_spear.algorithms.grpo.grpo"):
        for step in range(3):
            algo.algo_step = step
            GRPO._warn_if_filtered_out(algo, {"incomplete": 1.0, "any": 1.0})
    assert caplog.text.count("masked 100% of this batch") == 1
    assert algo.metrics.peek(("filters", "nearly_all_filtered")) == 1.0
    GRPO._warn_if_filtered_out(algo, {"incomplete": 0.1, "any": 0.1})
    assert algo.metrics.peek(("filters", "nearly_all_filtered")) == 0.0


def test_the_iteration_line_shows_the_filtered_share_and_the_warning():
    from rllib_spear.cli import progress_line

    line = progress_line({"training_iteration": 3, "filters": {"any_frac": 0.25, "nearly_all_filtered": 0.0}})
    assert "filtered 0.250" in line and "WARNING" not in line
    line = progress_line({"training_iteration": 4, "filters": {"any_frac": 1.0, "nearly_all_filtered": 1.0}})
    assert "filtered 1.000" in line and "WARNING: the filters masked 100% of the batch" in line
