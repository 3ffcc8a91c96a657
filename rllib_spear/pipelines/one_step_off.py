"""The "one_step_off" rollout pipeline (docs/design.md "Rollout pipelining").

With ``rollout_pipeline="one_step_off"`` the driver keeps one sample request in flight: it
collects the batch launched in the previous iteration, at once launches the next one (on the
runners' current weights), and only then runs the recipe and the learner update, so the runners
sample batch t+1 while the learners train on batch t. The requests go through RLlib's actor
manager (``EnvRunnerGroup.foreach_env_runner_async`` / ``fetch_ready_async_reqs``, one tag).

Versions. An actor runs one call at a time, so the version-checked weight sync after the update
queues behind the sample in flight and never interrupts it; the next request is launched after
that sync returned. Iteration t (t-1 updates done) thus trains on the batch sampled with the
weights of t-2 updates: one update behind (the first batch after a start or a restore: none).
The lag of a group is counted in training iterations (weight syncs), which equals the version
difference when an iteration makes one learner update (sequential SIL makes two): the pipeline
remembers at which step each version it sampled with was current. Groups whose lag exceeds
``max_policy_lag``, or whose version it never launched with (a runner restarted behind the
driver's back holds the initial weights), are dropped whole and counted.

Checkpoints save the task sampler as it was before the request in flight drew its tasks, and a
restore discards the request (``drop``): the restored run samples those tasks fresh, with the
restored weights. A failed runner's request is lost (the actor manager forgets it) and counted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS

from ..core.trajectory import Trajectory
from .base import PipelineHost, RolloutPipeline, SampledBatch, draw_seed_key, resync_of
from .registry import register_pipeline
from .runner_requests import healthy_runner_ids, sample_requests, whole_groups

__all__ = ["OneStepOffPipeline", "Collected", "SAMPLE_TAG"]

#: The actor-manager tag of the pipeline's sample requests.
SAMPLE_TAG = "rllib_spear/one_step_off_sample"


@dataclass
class _Request:
    runner_ids: list[int]  # the runners a share of the tasks went to, in dealing order
    group_size: int
    step: int  # completed training iterations at launch
    version: int  # the policy version the runners held at launch
    sampler_state: dict  # the task sampler before these tasks were drawn


@dataclass
class Collected:
    """One collected batch: whole, fresh-enough groups, and what was lost or dropped."""

    trajectories: list[Trajectory]
    runner_stats: list[dict]
    lost: int = 0  # runner results that never came back (failed runners)
    stale: int = 0  # trajectories dropped (whole groups) for a lag above max_policy_lag
    incomplete_groups: int = 0  # groups dropped because they came back with != group_size members
    lag_max: int = 0  # the largest lag (training iterations) among the kept trajectories
    lags: list[int] = field(default_factory=list)  # per kept trajectory


@register_pipeline("one_step_off")
class OneStepOffPipeline(RolloutPipeline):
    """At most one sample request in flight; launch, collect, drop."""

    overlaps_update = True

    def __init__(self, max_policy_lag: int = 1) -> None:
        self.max_policy_lag = int(max_policy_lag)
        self._pending: _Request | None = None
        self._step_of_version: dict[int, int] = {}

    @classmethod
    def from_config(cls, config: Any) -> "OneStepOffPipeline":
        return cls(config.max_policy_lag)

    @classmethod
    def config_problems(cls, config: Any) -> list[str]:
        problems = []
        if config.num_env_runners < 1:
            problems.append(
                "`rollout_pipeline='one_step_off'` samples on remote env runners while the learners train: "
                f"set .env_runners(num_env_runners=1 or more) (got {config.num_env_runners}), or use "
                "rollout_pipeline='sync'")
        if config.max_policy_lag < 1:
            problems.append(
                "`max_policy_lag` must be >= 1 with rollout_pipeline='one_step_off' (every batch after the "
                f"first is one update old, so {config.max_policy_lag} would drop them all), or use "
                "rollout_pipeline='sync'")
        return problems

    def next_batch(self, host: PipelineHost) -> SampledBatch:
        """The batch launched last iteration (launched now on a start or after a restore), then
        the next iteration's request goes out, so the runners sample it during this update."""
        if not self.in_flight:
            self._launch_next(host)
        got = self.collect(host.env_runner_group, step=host.algo_step)
        sampled_version = host.policy_version  # the lag metrics count against the learners now
        self._launch_next(host)
        return SampledBatch(got.trajectories, got.runner_stats, sampled_version, counts={
            "lost_env_runner_samples": got.lost,
            "dropped_stale_trajectories": got.stale,
            "dropped_incomplete_groups": got.incomplete_groups,
        }, gauges={(ENV_RUNNER_RESULTS, "policy_lag_max"): got.lag_max})

    def _launch_next(self, host: PipelineHost) -> None:
        """The request of the next ``tasks_per_iteration`` tasks, on the runners' weights now."""
        sampler = host.task_sampler
        before = sampler.get_state()
        key = draw_seed_key(host)
        self.launch(host.env_runner_group, sampler.next(int(host.config.tasks_per_iteration)),
                    int(host.config.group_size), step=host.algo_step, version=host.policy_version,
                    sampler_state=before, resync=resync_of(host), seed_key=key)

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    def launch(self, group: Any, tasks: list[dict], group_size: int, *, step: int, version: int,
               sampler_state: dict, resync: Callable[[], int], seed_key: tuple[int, int] | None = None) -> None:
        """Send ``tasks`` (G = ``group_size`` each) to the healthy runners without waiting
        (``seed_key``: the sampling seeds, ``runner_requests.sample_requests``)."""
        if self._pending is not None:
            raise RuntimeError("one_step_off: a sample is already in flight; collect it first")
        if group.num_in_flight_async_reqs(SAMPLE_TAG):
            self._discard(group)  # a request nobody collects any more (e.g. after a failed step)
        ids, resynced = healthy_runner_ids(group, resync)
        version = version if resynced is None else resynced
        work = sample_requests(ids, tasks, group_size, version, seed_key)
        if work:
            sent = group.foreach_env_runner_async([f for _, f in work], tag=SAMPLE_TAG,
                                                  remote_worker_ids=[i for i, _ in work])
            if sent != len(work):
                raise RuntimeError(f"one_step_off: {len(work)} sample requests, the actor manager sent {sent}")
        self._step_of_version[version] = step
        self._pending = _Request([i for i, _ in work], group_size, step, version, sampler_state)

    def collect(self, group: Any, step: int) -> Collected:
        """Wait for the request in flight; ``step``: completed training iterations now (the
        learners train this batch next, before another update)."""
        req, self._pending = self._pending, None
        if req is None:
            raise RuntimeError("one_step_off: no sample in flight")
        results = dict(group.fetch_ready_async_reqs(tags=SAMPLE_TAG, timeout_seconds=None)) if req.runner_ids else {}
        ordered = [results[i] for i in req.runner_ids if i in results]  # dealing order: reproducible
        trajs, incomplete = whole_groups(ordered, req.group_size)
        lag = [self._lag(t, step) for t in trajs]
        stale_uids = {t.uid for t, g in zip(trajs, lag) if g is None or not 0 <= g <= self.max_policy_lag}
        lags = [int(g) for t, g in zip(trajs, lag) if t.uid not in stale_uids]
        kept = [t for t in trajs if t.uid not in stale_uids]
        self._step_of_version = {v: s for v, s in self._step_of_version.items() if step - s <= self.max_policy_lag}
        return Collected(kept, [r["stats"] for r in ordered], lost=len(req.runner_ids) - len(ordered),
                         stale=len(trajs) - len(kept), lag_max=max(lags, default=0), lags=lags,
                         incomplete_groups=incomplete)

    def drop(self, group: Any) -> int:
        """Discard the request in flight (a restore: the restored run samples fresh) and forget
        the version history; returns the number of trajectories discarded."""
        self._pending = None
        self._step_of_version = {}
        return self._discard(group) if group is not None and group.num_in_flight_async_reqs(SAMPLE_TAG) else 0

    def checkpoint_sampler_state(self, sampler: Any) -> dict:
        """The task sampler state to checkpoint: before the request in flight drew its tasks."""
        return self._pending.sampler_state if self._pending is not None else sampler.get_state()

    def get_state(self) -> dict:
        """Nothing beyond the sampler state (the request in flight is drawn again)."""
        return {}

    def set_state(self, state: dict) -> None:
        pass

    # ------------------------------------------------------------------ helpers
    def _lag(self, traj: Trajectory, step: int) -> int | None:
        s = self._step_of_version.get(int(traj.policy_version))
        return None if s is None else step - s

    @staticmethod
    def _discard(group: Any) -> int:
        results = group.fetch_ready_async_reqs(tags=SAMPLE_TAG, timeout_seconds=None)
        return sum(len(r["trajectories"]) for _, r in results)
