"""The "async" rollout pipeline: fully asynchronous training (``rollout_pipeline="async"``;
docs/design.md "Fully asynchronous training").

The runners sample without pause (env_runners/rollout_stream.py) and the learners train on whole
groups as they finish. The driver's side, here:

- **Submission window.** While an iteration collects its batch, at most ``(k + 1) x
  tasks_per_iteration - j`` groups are outstanding (submitted and not yet trained or dropped;
  finished ones waiting on the driver count), j being the groups this batch already took; a
  dropped group frees its slot. So a group is submitted with at most ``(k + 1) B - j - 1`` ahead
  of it, all on the weights of the last sync, and when groups finish in order it is trained
  within k iterations: the window keeps most groups within the lag bound without idling the
  runners (AReaL's rule, submitted <= (t + k + 1) B, with drops given back; verl's
  ``staleness_threshold``). During the update kB groups stay in flight. Each new task goes to
  the healthy runner with the fewest outstanding groups.
- **Collection.** Each iteration takes ``tasks_per_iteration`` finished groups, oldest submission
  first; more finished groups wait for the next iteration. Runners are polled (``stream_take``,
  waiting up to ``poll_s`` for a group) and the window is refilled between polls.
- **Lag.** The weights change while episodes are in flight (partial rollouts), so every assistant
  segment records its version; a trajectory's lag is the number of iterations since its oldest
  segment's version was current. A group with a trajectory above ``max_policy_lag`` is dropped
  whole and counted (``dropped_stale_trajectories``); so is one on a version this pipeline saw
  current but has forgotten since (older than k + 1 iterations: stale, no resync). A version it
  never saw, or one older than the weights the runner held when the group was submitted, means a
  runner restarted behind the driver's back: the group is dropped and every runner resynced once.
- **Group uids.** The sampler draws one task per call here, so it cannot tell repeats apart (a
  dataset smaller than the window, an epoch boundary): a task drawn while a group of the same uid
  is outstanding or already in the batch being collected gets the uid ``<uid>#<k>`` (the smallest
  k free; ``recipe.task_sampler.repeat_uid``), so every group of a batch has its own uid, as in
  the sync path. The renamed task is what is outstanding, hence checkpointed.
- **Failures.** A runner that stops answering, or that no longer has a group the driver sent it
  (it restarted), loses those groups: they are counted (``lost_env_runner_samples``) and their
  tasks are submitted again, fresh; nothing half-sampled is used. A group the runner reports as
  failed (its engine raised) fails the iteration, as a failed sampling call does in sync mode.
- **Checkpoints.** The state holds the tasks outstanding (in submission order) with the task
  sampler past them; a restore stops the runners' streams (the groups in flight are dropped and
  counted: ``dropped_in_flight_trajectories``) and submits those tasks again first, fresh, on the
  restored weights.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS

from ..core.trajectory import Trajectory
from ..env_runners.rollout_modes import streaming_rollout_modes
from ..recipe.task_sampler import repeat_uid
from .base import PipelineHost, RolloutPipeline, SampledBatch, resync_of
from .registry import register_pipeline
from .runner_requests import healthy_runner_ids, sampling_seed

__all__ = ["AsyncPipeline", "AsyncCollected"]

logger = logging.getLogger(__name__)

#: The runner id of the driver's local runner (no remote runners).
LOCAL = 0


@dataclass
class _Group:
    key: int  # the order of submission: the collection order among finished groups
    task: dict
    serial: int  # the task's index in the sampler's draw order (its sampling seed)
    runner: int | None = None  # where it was sent; None: to (re)submit
    version: int | None = None  # the runners' weights version when it was (last) submitted
    result: list[Trajectory] | None = None  # finished, waiting on the driver


@dataclass
class AsyncCollected:
    """One iteration's batch of whole, fresh-enough groups, and what was dropped or lost."""

    trajectories: list[Trajectory]
    runner_stats: list[dict]
    lost: int = 0  # groups lost with a runner (their tasks were submitted again)
    stale: int = 0  # trajectories dropped (whole groups) for a lag above max_policy_lag
    incomplete_groups: int = 0
    lags: list[int] = field(default_factory=list)  # per kept trajectory, in iterations
    wait_s: float = 0.0  # time the driver waited for groups
    in_flight: int = 0  # groups outstanding after the collection

    @property
    def lag_max(self) -> int:
        return max(self.lags, default=0)


#: How the stats of a runner's polls combine over one collection (the rest: the last value).
_ADDITIVE = ("generation_time_s", "env_time_s", "generated_tokens", "engine_calls", "rollout_errors",
             "engine_idle_s", "tool_calls", "tool_timeouts", "tool_calls_abandoned", "agent_program_errors",
             "agent_program_timeouts")
_MAXIMA = ("tool_latency_max_s", "concurrent_episodes_max", "tool_calls_concurrent_max")


def merge_runner_stats(windows: list[dict]) -> dict:
    """One runner's stats over several ``stream_take`` windows: sums of the counters and times,
    maxima of the maxima, the last value of the rest (percentiles, means)."""
    merged: dict = {}
    for w in windows:
        for k, v in w.items():
            if k in _ADDITIVE:
                merged[k] = merged.get(k, 0) + v
            elif k in _MAXIMA:
                merged[k] = max(merged.get(k, v), v)
            else:
                merged[k] = v
    return merged


@register_pipeline("async")
class AsyncPipeline(RolloutPipeline):
    """The driver's bookkeeping of fully asynchronous sampling (see the module doc)."""

    overlaps_update = True
    needs_streamed_groups = True

    def __init__(self, max_policy_lag: int, tasks_per_iteration: int, group_size: int, *,
                 poll_s: float = 0.5) -> None:
        self.max_policy_lag = int(max_policy_lag)
        self.tasks_per_iteration = int(tasks_per_iteration)
        self.group_size = int(group_size)
        self.poll_s = float(poll_s)
        self._groups: dict[int, _Group] = {}  # outstanding, by key
        self._next_key = 0
        self._step_of_version: dict[int, int] = {}
        #: the newest version forgotten (pruned from ``_step_of_version``); None: none yet
        self._forgotten_max: int | None = None
        self._version: int | None = None  # the runners' weights version now (the last sync)

    @classmethod
    def from_config(cls, config: Any) -> "AsyncPipeline":
        return cls(config.max_policy_lag, config.tasks_per_iteration, config.group_size)

    @classmethod
    def config_problems(cls, config: Any) -> list[str]:
        problems = []
        streaming = streaming_rollout_modes()
        if config.effective_rollout_mode not in streaming:
            loops = " or ".join(f".env_runners(rollout_mode={n!r})" for n in ["auto", *streaming])
            problems.append(
                "`rollout_pipeline='async'` samples every episode at its own pace while the learners train: "
                f"it needs the async agent loop, {loops} (got rollout_mode={config.rollout_mode!r}), or use "
                "rollout_pipeline='one_step_off'")
        if config.max_policy_lag < 1:
            problems.append(
                "`max_policy_lag` must be >= 1 with rollout_pipeline='async' (groups finish while the learners "
                f"train, so most are at least one update old and {config.max_policy_lag} would drop them), or use "
                "rollout_pipeline='sync'")
        return problems

    @property
    def window(self) -> int:
        """The most groups outstanding at once (at the start of a collection)."""
        return (self.max_policy_lag + 1) * self.tasks_per_iteration

    @property
    def outstanding(self) -> int:
        return len(self._groups)

    # ------------------------------------------------------------------ one iteration
    def next_batch(self, host: PipelineHost) -> SampledBatch:
        """The groups the runners finished, at most ``max_policy_lag`` iterations old."""
        got = self.collect(host.env_runner_group, host.task_sampler, step=host.algo_step,
                           version=host.policy_version, run_seed=int(host.config.seed or 0),
                           resync=resync_of(host))
        return SampledBatch(got.trajectories, got.runner_stats, host.policy_version, counts={
            "lost_env_runner_samples": got.lost,
            "dropped_stale_trajectories": got.stale,
            "dropped_incomplete_groups": got.incomplete_groups,
        }, gauges={
            (ENV_RUNNER_RESULTS, "policy_lag_max"): got.lag_max,
            (ENV_RUNNER_RESULTS, "policy_lag_mean"): float(np.mean(got.lags)) if got.lags else 0.0,
            ("async", "wait_s"): got.wait_s,
            ("async", "groups_outstanding"): got.in_flight,
        })

    def collect(self, group: Any, sampler: Any, *, step: int, version: int, run_seed: int,
                resync: Callable[[], int]) -> AsyncCollected:
        """``tasks_per_iteration`` finished groups for the iteration after ``step`` completed
        ones, on learner weights ``version`` (current on the runners since that step)."""
        self._step_of_version[int(version)] = int(step)
        self._version = int(version)
        out = AsyncCollected([], [])
        windows: dict[int, list[dict]] = {}
        t0 = time.perf_counter()
        # what finished during the update, without waiting: every iteration reports the runners'
        # windows, even one served from groups that finished earlier
        self._poll(group, windows, out, timeout_s=0.0)
        resynced = False
        while True:
            if self._admit(step, out) and not resynced:
                # a version never current here: a runner restarted (initial weights) without the
                # driver's sync; bring every runner to the current weights once, or it would
                # keep sampling groups that are dropped
                resynced = True
                self._version = int(resync())
                self._step_of_version[self._version] = int(step)
            if len(out.trajectories) >= self.tasks_per_iteration * self.group_size:
                break
            ids = self._runner_ids(group, resync, out)
            if ids is None:  # no runner left, none could be restarted
                break
            self._fill(group, sampler, ids, run_seed, out)
            self._poll(group, windows, out)
        self._fill(group, sampler, self._runner_ids(group, resync, out) or [], run_seed, out)
        if not windows:
            # a batch served whole from groups that had finished before (no runner was busy at
            # the first poll, a fast machine): the runners now sample the refilled window, so
            # ask them once more, without waiting, for their stats windows
            self._poll(group, windows, out, timeout_s=0.0)
        out.runner_stats = [merge_runner_stats(w) for _, w in sorted(windows.items())]
        out.wait_s = time.perf_counter() - t0
        out.in_flight = self.outstanding
        self._forget_old_versions(step)
        return out

    def drop(self, group: Any) -> int:
        """Stop every runner's stream and forget what was finished (a restore, or the end of a
        run); the tasks stay outstanding, to submit again. Returns the trajectories dropped
        (G per group, finished or not)."""
        dropped = 0
        if group is not None:
            dropped = sum(int(n or 0) for n in self._foreach(group, None, lambda r: r.stream_stop()).values())
        for g in self._groups.values():
            if g.result is not None:
                dropped += 1
            g.runner, g.result = None, None
        self._step_of_version = {}
        self._forgotten_max = None
        return dropped * self.group_size

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_sampler_state(self, sampler: Any) -> dict:
        """The task sampler state to checkpoint: past every outstanding task (they are in
        :meth:`get_state`)."""
        return sampler.get_state()

    def get_state(self) -> dict:
        """The tasks outstanding, in submission order (a restore submits them again first)."""
        return {"outstanding": [{"task": g.task, "serial": g.serial}
                                for g in sorted(self._groups.values(), key=lambda g: g.key)]}

    def set_state(self, state: dict) -> None:
        self._groups = {}
        self._next_key = 0
        for item in state.get("outstanding", []):
            self._add(item["task"], int(item["serial"]))

    # ------------------------------------------------------------------ pieces
    def _add(self, task: dict, serial: int) -> _Group:
        g = _Group(self._next_key, dict(task), int(serial))
        self._groups[g.key] = g
        self._next_key += 1
        return g

    def _runner_ids(self, group: Any, resync: Callable[[], int], out: AsyncCollected) -> list[int] | None:
        if group.num_remote_env_runners() == 0:
            return [LOCAL]
        ids, _ = healthy_runner_ids(group, resync)
        live = set(ids)
        for g in self._groups.values():  # groups on a runner that is gone: submit them again
            if g.runner is not None and g.result is None and g.runner not in live:
                g.runner = None
                out.lost += 1
        return ids or None

    def _fill(self, group: Any, sampler: Any, ids: list[int], run_seed: int, out: AsyncCollected) -> None:
        """Submit the groups waiting to be (re)submitted, and new tasks up to the window less
        the groups ``out`` already took (see the module doc)."""
        if not ids:
            return
        while self.outstanding < self.window - len(out.trajectories) // self.group_size:
            serial = int(sampler.served)
            (task,) = sampler.next(1)
            self._add(self._distinct_uid(task, out), serial)
        todo = sorted((g for g in self._groups.values() if g.runner is None and g.result is None),
                      key=lambda g: g.key)
        if not todo:
            return
        load = {i: 0 for i in ids}
        for g in self._groups.values():
            if g.runner in load and g.result is None:
                load[g.runner] += 1
        shares: dict[int, list[dict]] = {}
        for g in todo:
            i = min(ids, key=lambda j: (load[j], j))
            load[i] += 1
            g.runner, g.version = i, self._version
            shares.setdefault(i, []).append({"key": g.key, "task": g.task, "group_size": self.group_size,
                                             "seed": sampling_seed((run_seed, g.serial), 0)})
        answered = self._foreach(group, {i: (lambda r, s=share: r.stream_submit(s)) for i, share in shares.items()})
        for i in shares:
            if i not in answered:  # the runner failed on the way: its share goes again
                for g in todo:
                    if g.runner == i:
                        g.runner = None
                        out.lost += 1

    def _poll(self, group: Any, windows: dict[int, list[dict]], out: AsyncCollected,
              timeout_s: float | None = None) -> None:
        """Take what the runners finished (each waits up to ``timeout_s``, default ``poll_s``,
        for one group); their stats windows go to ``windows`` (per runner)."""
        busy = sorted({g.runner for g in self._groups.values() if g.runner is not None and g.result is None})
        if not busy:
            return
        wait = self.poll_s if timeout_s is None else float(timeout_s)
        take = lambda r, p=wait: r.stream_take(min_groups=1, timeout_s=p)  # noqa: E731
        results = self._foreach(group, {i: take for i in busy})
        for i in busy:
            res = results.get(i)
            if res is None:  # no answer: the runner failed; _runner_ids resubmits its groups
                continue
            if res.get("failed"):
                key, error = res["failed"][0]
                raise RuntimeError(f"env runner {i}: a sampling group failed ({error}); "
                                   f"{len(res['failed'])} group(s) failed in this poll")
            if res.get("stats") is not None:
                windows.setdefault(i, []).append(res["stats"])
            for key, trajs in res["groups"]:
                g = self._groups.get(int(key))
                if g is not None and g.runner == i and g.result is None:
                    g.result = list(trajs)
            alive = set(res["in_flight_keys"]) | {int(k) for k, _ in res["groups"]}
            for g in self._groups.values():  # sent there, neither finished nor running: lost
                if g.runner == i and g.result is None and g.key not in alive:
                    g.runner = None
                    out.lost += 1

    def _admit(self, step: int, out: AsyncCollected) -> bool:
        """Move finished groups, oldest submission first, into ``out`` until it holds
        ``tasks_per_iteration`` groups (the rest stay for the next iteration); groups that are
        not whole or too old are counted and dropped. True when a group had a version this
        pipeline never saw current."""
        unknown = False
        ready = sorted((g for g in self._groups.values() if g.result is not None), key=lambda g: g.key)
        for g in ready:
            trajs = g.result or []
            if len(trajs) != self.group_size:
                del self._groups[g.key]
                out.incomplete_groups += 1
                continue
            lags = [self._lag(t, step, g.version) for t in trajs]
            if any(lag is None or not 0 <= lag <= self.max_policy_lag for lag in lags):
                del self._groups[g.key]
                out.stale += len(trajs)
                unknown = unknown or None in lags
                continue
            if len(out.trajectories) >= self.tasks_per_iteration * self.group_size:
                continue  # whole and fresh, but this batch is full: the next one's
            del self._groups[g.key]
            out.trajectories += trajs
            out.lags += [int(lag) for lag in lags]
        return unknown

    def _lag(self, traj: Trajectory, step: int, submitted: int | None = None) -> int | None:
        """The trajectory's lag in iterations; None for a version that says a runner restarted
        behind the driver's back (never current here, or older than ``submitted``, the weights
        the runner held when the group was sent). A version current once but forgotten since
        (more than ``max_policy_lag`` + 1 iterations ago) is stale: a lag above the bound."""
        versions = [int(v) for v in traj.segment_versions if v is not None] or [int(traj.policy_version)]
        if submitted is not None and min(versions) < submitted:
            return None
        steps = [self._step_of_version.get(v) for v in versions]
        if any(s is None and not self._forgotten(v) for s, v in zip(steps, versions)):
            return None
        if any(s is None for s in steps):
            return self.max_policy_lag + 1
        return step - min(steps)

    def _forgotten(self, version: int) -> bool:
        """Whether ``version`` was current here once and pruned since (versions only grow
        within a pipeline's life: ``drop`` starts it over)."""
        return self._forgotten_max is not None and 0 <= version <= self._forgotten_max

    def _forget_old_versions(self, step: int) -> None:
        """Prune the versions no kept group can be on (current more than k iterations before
        ``step``), remembering the newest pruned one: a group on it is stale, not unknown."""
        old = [v for v, s in self._step_of_version.items() if step - s > self.max_policy_lag]
        for v in old:
            del self._step_of_version[v]
        if old:
            self._forgotten_max = max([*old, *([] if self._forgotten_max is None else [self._forgotten_max])])

    def _distinct_uid(self, task: dict, out: AsyncCollected) -> dict:
        """``task``, or a copy under ``<uid>#<k>`` (the smallest k free) when a group of its uid
        is outstanding or in the batch ``out`` collects: every group of a batch has its own uid
        (advantages, the group filter, SIL and GiGPO group by uid)."""
        if "uid" not in task:  # nothing to tell its groups apart by (load_tasks adds one)
            return task
        used = {g.task.get("uid") for g in self._groups.values()} | {t.uid for t in out.trajectories}
        if task["uid"] not in used:
            return task
        k = 1
        while repeat_uid(task, k) in used:
            k += 1
        return {**task, "uid": repeat_uid(task, k)}

    @staticmethod
    def _foreach(group: Any, calls: dict[int, Callable[[Any], Any]] | None,
                 fn: Callable[[Any], Any] | None = None) -> dict[int, Any]:
        """Call the runners: ``calls`` {runner id: fn(runner)}, or ``fn`` on every healthy one
        (``calls`` None). Runner ids are RLlib's worker indices (the actor manager's ids of the
        remote runners, 1..n); the local runner, 0, when there are no remote ones. Returns
        {runner id: result} of those that answered (a failed runner is left out)."""
        if group.num_remote_env_runners() == 0:
            call = fn if calls is None else calls.get(LOCAL)
            return {} if call is None else {LOCAL: call(group.local_env_runner)}
        if calls is None:
            calls = {i: fn for i in group.healthy_env_runner_ids()}
        if not calls:
            return {}
        ids = list(calls)
        results = group.foreach_env_runner([lambda r, f=calls[i]: (r.worker_index, f(r)) for i in ids],
                                           local_env_runner=False, remote_worker_ids=ids)
        return {int(i): res for i, res in results}
