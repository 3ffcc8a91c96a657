"""Callbacks of this library's training step, on top of RLlib's ``RLlibCallback``.

``TrajectoryCallback.on_trajectories`` runs on the driver once per iteration, after the runners
return the sampled trajectories and before any reward shaping. It may read them (logging,
recording), edit them in place, or replace the batch (``trajectories[:] = other``). Pass it the
RLlib way: ``config.callbacks(MyCallback)``; the instance is ``algo.callbacks``.
"""
from __future__ import annotations

from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.utils import force_list

__all__ = ["TrajectoryCallback", "run_trajectory_callbacks"]


class TrajectoryCallback(RLlibCallback):
    """An RLlib callback with one more event: ``on_trajectories``."""

    def on_trajectories(self, *, algorithm: Any, trajectories: list, runner_stats: list[dict],
                        step: int, metrics_logger: Any = None, **kwargs: Any) -> None:
        """Called with the iteration's trajectories (a list the callback may edit or refill)."""


def run_trajectory_callbacks(algorithm: Any, trajectories: list, runner_stats: list[dict], step: int) -> None:
    """Call ``on_trajectories`` of every configured callback object that defines it."""
    for cb in force_list(getattr(algorithm, "callbacks", None)):
        hook = getattr(cb, "on_trajectories", None)
        if hook is not None:
            hook(algorithm=algorithm, trajectories=trajectories, runner_stats=runner_stats, step=step,
                 metrics_logger=algorithm.metrics)
