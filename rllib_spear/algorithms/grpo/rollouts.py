"""Driver side of sampling: split tasks over the healthy LLMEnvRunners, gather whole groups.

``sample_groups`` is the synchronous path (``rollout_pipeline="sync"``); the pieces below it are
shared with the one-step-off pipeline (``pipeline.py``), which sends the same requests
asynchronously.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import numpy as np

from ...core.trajectory import Trajectory

__all__ = ["sample_groups", "healthy_runner_ids", "sample_requests", "sampling_seed", "whole_groups"]


def healthy_runner_ids(group: Any, resync: Callable[[], int]) -> tuple[list[int], int | None]:
    """(ids of the healthy remote runners, the version ``resync()`` returned or None).

    When every runner is down, RLlib's probe restarts them and ``resync()`` brings them to the
    current weights first (returning that version), since a restarted runner holds the initial
    weights."""
    ids = group.healthy_env_runner_ids()
    version = None
    if not ids and group.probe_unhealthy_env_runners():
        version = resync()
        ids = group.healthy_env_runner_ids()
    return ids, version


#: Separates the training sampling-seed stream from others derived from the same keys.
_TRAIN_SEED_STREAM = 0x5EED


def sampling_seed(seed_key: tuple[int, int] | None, runner_id: int) -> int | None:
    """The sampling seed of one runner's share of a draw: a function of (run seed, draw key,
    runner id) only, so a restarted runner or a restored run samples a draw with the seeds the
    original run used (a runner-side call counter restarts at 0). None: the runner's own."""
    if seed_key is None:
        return None
    run_seed, draw = seed_key
    return int(np.random.SeedSequence([int(run_seed), int(draw), int(runner_id), _TRAIN_SEED_STREAM])
               .generate_state(1)[0])


def sample_requests(ids: list[int], tasks: list[dict], group_size: int,
                    version: int, seed_key: tuple[int, int] | None = None) -> list[tuple[int, Callable]]:
    """[(runner id, fn(runner) -> its ``sample_groups`` result)]: ``tasks`` dealt round-robin;
    ``seed_key`` (run seed, draw key) gives each share its :func:`sampling_seed`."""
    shares = [tasks[i::len(ids)] for i in range(len(ids))] if ids else []
    return [(i, (lambda r, s=s, seed=sampling_seed(seed_key, i): r.sample_groups(
                tasks=s, group_size=group_size, policy_version=version, seed=seed)))
            for i, s in zip(ids, shares) if s]


def whole_groups(results: list[dict], group_size: int) -> tuple[list[Trajectory], int]:
    """(the trajectories of the runner results whose group came back complete, the number of
    groups dropped): a group with fewer or more than ``group_size`` members (split by a runner
    failure, or a uid sent twice) would bias its baseline. Callers log the count."""
    trajs = [t for r in results for t in r["trajectories"]]
    counts: dict[str, int] = defaultdict(int)
    for t in trajs:
        counts[t.uid] += 1
    dropped = sum(1 for n in counts.values() if n != group_size)
    return [t for t in trajs if counts[t.uid] == group_size], dropped


def sample_groups(group: Any, tasks: list[dict], group_size: int, version: int,
                  resync: Callable[[], int], seed_key: tuple[int, int] | None = None,
                  ) -> tuple[list[Trajectory], list[dict], int, int]:
    """(trajectories, runner stats, number of runner results lost, number of incomplete groups
    dropped) for ``tasks``, G = ``group_size`` episodes each, sampled with weights ``version``.

    With no remote runners the local runner samples. Otherwise the healthy runners
    (:func:`healthy_runner_ids`) share the tasks; only whole groups are kept. ``seed_key``:
    see :func:`sample_requests`.
    """
    if group.num_remote_env_runners() == 0:
        out = group.local_env_runner.sample_groups(tasks=tasks, group_size=group_size, policy_version=version,
                                                   seed=sampling_seed(seed_key, 0))
        trajs, dropped = whole_groups([out], group_size)
        return trajs, [out["stats"]], 0, dropped
    ids, resynced = healthy_runner_ids(group, resync)
    if not ids:
        return [], [], 0, 0
    version = version if resynced is None else resynced
    work = sample_requests(ids, tasks, group_size, version, seed_key)
    results = group.foreach_env_runner([f for _, f in work], local_env_runner=False,
                                       remote_worker_ids=[i for i, _ in work])
    trajs, dropped = whole_groups(results, group_size)
    return trajs, [r["stats"] for r in results], len(work) - len(results), dropped
