"""Driver side of sampling: split tasks over the healthy LLMEnvRunners, gather whole groups."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

from ...core.trajectory import Trajectory

__all__ = ["sample_groups"]


def sample_groups(group: Any, tasks: list[dict], group_size: int, version: int,
                  resync: Callable[[], int]) -> tuple[list[Trajectory], list[dict], int]:
    """(trajectories, runner stats, number of runner results lost) for ``tasks``, G = ``group_size``
    episodes each, sampled with weights ``version``.

    With no remote runners the local runner samples. When every runner is down, RLlib's probe
    restarts them and ``resync()`` brings them to the current weights first (returning that
    version), since a restarted runner holds the initial weights. Only whole groups are kept:
    a group split by a runner failure would bias its baseline.
    """
    if group.num_remote_env_runners() == 0:
        out = group.local_env_runner.sample_groups(tasks=tasks, group_size=group_size, policy_version=version)
        return list(out["trajectories"]), [out["stats"]], 0
    ids = group.healthy_env_runner_ids()
    if not ids and group.probe_unhealthy_env_runners():
        version = resync()
        ids = group.healthy_env_runner_ids()
    if not ids:
        return [], [], 0
    shares = [tasks[i::len(ids)] for i in range(len(ids))]
    work = [(i, (lambda r, s=s: r.sample_groups(tasks=s, group_size=group_size, policy_version=version)))
            for i, s in zip(ids, shares) if s]
    results = group.foreach_env_runner([f for _, f in work], local_env_runner=False,
                                       remote_worker_ids=[i for i, _ in work])
    trajs = [t for r in results for t in r["trajectories"]]
    counts: dict[str, int] = defaultdict(int)
    for t in trajs:
        counts[t.uid] += 1
    trajs = [t for t in trajs if counts[t.uid] == group_size]
    return trajs, [r["stats"] for r in results], len(work) - len(results)
