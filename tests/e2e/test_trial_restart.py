"""A trial that fails is restarted by Tune from its last checkpoint (``FailureConfig``, which
``rllib-spear train`` and the shipped recipes set: docs/design.md "Fault tolerance"), and from that
checkpoint on it equals the uninterrupted run with the same seed: the same batches and, bit for
bit, the same weights (SPEAR, SIL on: task sampler, schedules, SIL buffer and RNG states all come
back from the checkpoint)."""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

import rllib_spear  # noqa: F401  (registers the algorithms)
from rllib_spear import SPEARConfig
from rllib_spear.cli import max_failures

from e2e_helpers import small_config


def _config(tiny_model, record_dir: str, fail_marker: str | None):
    """SPEAR with a callback that writes, per iteration, a digest of the sampled batch and of the
    learner weights after the update; with ``fail_marker``, the first attempt dies in iteration 3
    (after the checkpoint of iteration 2)."""
    from rllib_spear.callbacks import TrajectoryCallback

    class Record(TrajectoryCallback):
        def on_trajectories(self, *, algorithm, trajectories, runner_stats, step, **kwargs):
            if fail_marker is not None and step == 3 and not os.path.exists(fail_marker):
                open(fail_marker, "w").close()
                raise RuntimeError("chaos: the trial dies in iteration 3")
            rng = np.random.default_rng(7)  # an untrained model earns nothing: seeded rewards
            for t in trajectories:
                t.outcome_reward = float(rng.choice([0.0, 0.5, 1.0]))
            ids = [t.assistant_token_ids() for t in trajectories]
            self._write(record_dir, f"batch_{step}", hashlib.sha256(repr(ids).encode()).hexdigest())

        def on_train_result(self, *, algorithm, result, **kwargs):
            weights = algorithm.learner_group.get_weights()
            (module,) = weights.values()
            h = hashlib.sha256()
            for k in sorted(module):
                h.update(k.encode())
                h.update(np.ascontiguousarray(np.asarray(module[k])).tobytes())
            self._write(record_dir, f"weights_{algorithm.algo_step}", h.hexdigest())

        @staticmethod
        def _write(folder, key, value):
            with open(os.path.join(folder, f"{key}.json"), "w") as f:
                json.dump(value, f)

    return small_config(SPEARConfig, tiny_model, sil_enabled=True).callbacks(Record)


def _run(cfg, storage: str, failures: int):
    from ray import tune

    return tune.Tuner("SPEAR", param_space=cfg, run_config=tune.RunConfig(
        stop={"training_iteration": 4}, storage_path=storage, verbose=0,
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
        failure_config=tune.FailureConfig(max_failures=failures))).fit()


def _read(folder):
    return {name[:-5]: json.load(open(os.path.join(folder, name))) for name in os.listdir(folder)}


def test_a_restarted_trial_equals_the_uninterrupted_run(ray_session, tiny_model, tmp_path):
    plain, chaos = tmp_path / "plain", tmp_path / "chaos"
    plain.mkdir()
    chaos.mkdir()
    grid = _run(_config(tiny_model, str(plain), None), str(tmp_path / "r1"), failures=0)
    assert not grid.errors
    marker = str(tmp_path / "failed_once")
    grid = _run(_config(tiny_model, str(chaos), marker), str(tmp_path / "r2"), failures=1)
    assert not grid.errors, grid.errors
    assert os.path.exists(marker), "the first attempt died"
    (result,) = [grid[i] for i in range(len(grid))]
    assert result.metrics["training_iteration"] == 4
    a, b = _read(str(plain)), _read(str(chaos))
    for key in ("batch_3", "batch_4", "weights_3", "weights_4"):
        assert a[key] == b[key], f"{key} differs after the restart"
    assert a["weights_4"] != a["weights_2"], "the learner trained"


def test_max_failures_from_the_yaml_or_the_command_line():
    from argparse import Namespace

    import pytest

    from rllib_spear.cli import CLIError

    assert max_failures({}, Namespace(max_failures=None)) == 0
    assert max_failures({"max_failures": 3}, Namespace(max_failures=None)) == 3
    assert max_failures({"max_failures": 3}, Namespace(max_failures=1)) == 1
    with pytest.raises(CLIError, match="max_failures"):
        max_failures({"max_failures": "three"}, Namespace(max_failures=None))
