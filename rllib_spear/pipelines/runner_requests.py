"""The driver's requests to the env runners: deal tasks over the healthy LLMEnvRunners, gather
whole groups (docs/design.md "One training iteration", "Validation").

``sample_groups`` samples training tasks now (the "sync" pipeline, ``GRPO.sample``);
``sample_requests`` builds the same requests for the one-step-off pipeline, which sends them
asynchronously; ``sample_for_evaluation`` sends the evaluation requests (``GRPO.evaluate_tasks``).
Each share of a draw is sampled with ``sampling_seed`` (run seed, draw, runner id), so a
restarted runner or a restored run samples a draw with the original run's seeds.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

import numpy as np

from ..core.trajectory import Trajectory

__all__ = ["sample_groups", "sample_for_evaluation", "healthy_runner_ids", "sample_requests", "sampling_seed",
           "whole_groups"]


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


def sample_for_evaluation(group: Any, tasks: list[dict], samples: int, sampling: dict[str, Any],
                          resync: Callable[[], int], eval_key: int | None = None,
                          ) -> tuple[list[Trajectory], list[dict], int]:
    """(trajectories, runner stats, runner results lost): ``samples`` episodes per task with the
    evaluation ``sampling``, tasks dealt round-robin over the healthy runners (the local runner
    when there are no remote ones); only whole groups are kept, as for training. ``eval_key``:
    the driver's evaluation counter, the runners' seed key (``LLMEnvRunner.evaluate_groups``):
    a runner's own counter restarts with the runner and would repeat earlier seeds.

    The runners evaluate with their own rollout, seed stream and env pool, so the training run is
    the same with or without evaluation. The requests are synchronous ``foreach_env_runner``
    calls; the actor manager waits for exactly those, so a one_step_off sample in flight (an
    async request of its own tag) is neither consumed nor lost: the evaluation call queues
    behind it on each runner."""
    if group.num_remote_env_runners() == 0:
        out = group.local_env_runner.evaluate_groups(tasks=tasks, group_size=samples, sampling=sampling,
                                                     eval_key=eval_key)
        return list(out["trajectories"]), [out["stats"]], 0
    ids, _ = healthy_runner_ids(group, resync)
    shares = [(i, tasks[k::len(ids)]) for k, i in enumerate(ids)]
    shares = [(i, s) for i, s in shares if s]
    if not shares:
        return [], [], 0
    results = group.foreach_env_runner(
        [lambda r, s=s: r.evaluate_groups(tasks=s, group_size=samples, sampling=sampling, eval_key=eval_key)
         for _, s in shares],
        local_env_runner=False, remote_worker_ids=[i for i, _ in shares])
    trajs, _ = whole_groups(results, samples)  # eval tasks have distinct uids (loaders)
    return trajs, [r["stats"] for r in results], len(shares) - len(results)
