"""Driver side of validation (docs/design.md "Validation"): which tasks, which sampling
parameters, and the evaluation requests to the training env runners.

Evaluation runs on the runners that sample for training (no second engine), through
``LLMEnvRunner.evaluate_groups``: its own rollout, seed stream and env pool, so the training run
is the same with or without it. The requests are synchronous ``foreach_env_runner`` calls; the
actor manager waits for exactly those, so a one_step_off sample in flight (an async request of
its own tag) is neither consumed nor lost: the evaluation call queues behind it on each runner.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ...core.trajectory import Trajectory
from ...env_runners.engines.base import SamplingConfig
from ...env_runners.llm_env_runner import EVAL_SAMPLING_KEYS
from .rollouts import healthy_runner_ids, whole_groups

__all__ = ["EvalSettings", "eval_settings", "eval_source", "dataset_label", "sample_for_evaluation"]

#: The ``evaluation()`` knob of each sampling parameter of an evaluation call.
_KNOB_OF = {k: f"eval_{k}" for k in EVAL_SAMPLING_KEYS}


@dataclass(frozen=True)
class EvalSettings:
    """What one evaluation runs: the dataset ``split``, its first ``num_tasks`` tasks (None =
    all), ``samples`` (n) episodes per task, and the ``sampling`` parameters of
    ``LLMEnvRunner.evaluate_groups`` ({temperature, top_p, top_k, max_new_tokens}; a None value
    keeps the training one)."""

    split: str
    num_tasks: int | None
    samples: int
    sampling: dict[str, Any] = field(default_factory=dict)


def eval_settings(cfg: Any, **overrides: Any) -> EvalSettings:
    """The config's ``evaluation()`` knobs with ``overrides`` (split, num_tasks, samples,
    temperature, top_p, top_k, max_new_tokens; a None override keeps the config's value),
    checked here, on the driver, before any runner gets them."""
    unknown = sorted(set(overrides) - {"split", "num_tasks", "samples", *_KNOB_OF})
    if unknown:
        raise ValueError(f"eval_settings: unknown settings {unknown}")

    def pick(name: str, knob: str) -> Any:
        v = overrides.get(name)
        return getattr(cfg, knob) if v is None else v

    run = EvalSettings(split=pick("split", "eval_split"), num_tasks=pick("num_tasks", "eval_num_tasks"),
                       samples=pick("samples", "eval_samples"),
                       sampling={k: pick(k, knob) for k, knob in _KNOB_OF.items()})
    if not isinstance(run.samples, int) or run.samples < 1:
        raise ValueError(f"evaluation samples per task (n) must be an integer >= 1, got {run.samples!r}")
    if run.num_tasks is not None and (not isinstance(run.num_tasks, int) or run.num_tasks < 1):
        raise ValueError(f"evaluation num_tasks must be None (all) or an integer >= 1, got {run.num_tasks!r}")
    given = {k: v for k, v in run.sampling.items() if v is not None}
    SamplingConfig(**given).validate()  # the runner's own check, raised here
    return run


def eval_source(cfg: Any, dataset: Any = None) -> Any:
    """The dataset an evaluation reads: ``dataset``, else ``environment(eval_dataset=...)``,
    else the training dataset, else the environment (its embedded split)."""
    if dataset is not None:
        return dataset
    return cfg.eval_dataset or cfg.dataset or cfg.env


def dataset_label(source: Any) -> str:
    """The source name of tasks without a ``data_source``: the dataset's file or folder name
    (``.../bamboogle.parquet`` -> "bamboogle", ``.../nq/`` -> "nq"), a default-dataset name as it
    is, the ``path`` of a ``{"path": ..., "dataset_format": ...}`` spec, "all" for task lists,
    callables and anything else."""
    if isinstance(source, dict) and isinstance(source.get("path"), (str, os.PathLike)):
        source = source["path"]
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        return (p.stem if p.suffix else p.name) or "all"
    return "all"


def sample_for_evaluation(group: Any, tasks: list[dict], samples: int, sampling: dict[str, Any],
                          resync: Callable[[], int], eval_key: int | None = None,
                          ) -> tuple[list[Trajectory], list[dict], int]:
    """(trajectories, runner stats, runner results lost): ``samples`` episodes per task with the
    evaluation ``sampling``, tasks dealt round-robin over the healthy runners (the local runner
    when there are no remote ones); only whole groups are kept, as for training. ``eval_key``:
    the driver's evaluation counter, the runners' seed key (``LLMEnvRunner.evaluate_groups``):
    a runner's own counter restarts with the runner and would repeat earlier seeds."""
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
