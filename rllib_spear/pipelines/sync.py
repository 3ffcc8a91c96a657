"""The "sync" rollout pipeline (the default): sample ``tasks_per_iteration`` new tasks on the
runners' current weights, then train on them; nothing is in flight between iterations, so a
checkpoint holds only the task sampler.
"""
from __future__ import annotations

from typing import Any

from .base import PipelineHost, RolloutPipeline, SampledBatch, draw_seed_key, resync_of
from .registry import register_pipeline
from .runner_requests import sample_groups

__all__ = ["SyncPipeline", "sample_tasks"]


@register_pipeline("sync")
class SyncPipeline(RolloutPipeline):
    """Sample, then train (see the module doc)."""

    overlaps_update = False

    @classmethod
    def from_config(cls, config: Any) -> "SyncPipeline":
        return cls()

    def next_batch(self, host: PipelineHost) -> SampledBatch:
        key = draw_seed_key(host)
        cfg = host.config
        return sample_tasks(host, host.task_sampler.next(int(cfg.tasks_per_iteration)), int(cfg.group_size), key)


def sample_tasks(host: PipelineHost, tasks: list[dict], group_size: int,
                 seed_key: tuple[int, int] | None = None) -> SampledBatch:
    """``group_size`` trajectories per task of ``tasks``, sampled now on the runners' weights
    (whole groups only; ``seed_key``: ``runner_requests.sampling_seed``, None: each runner's own).

    Every requested group is trained, dropped as incomplete, or lost with a runner's result:
    tasks = whole groups + ``dropped_incomplete_groups`` + ``lost_groups``."""
    trajs, stats, lost, incomplete = sample_groups(host.env_runner_group, tasks, group_size, host.policy_version,
                                                   resync_of(host), seed_key)
    # sampled on the learners' weights now: a resync during the call brought the runners to them
    return SampledBatch(trajs, stats, host.policy_version, counts={
        "lost_env_runner_samples": lost,
        "dropped_incomplete_groups": incomplete,
        "lost_groups": len(tasks) - len({t.uid for t in trajs}) - incomplete,
    })
