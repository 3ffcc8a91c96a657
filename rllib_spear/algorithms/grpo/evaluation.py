"""The settings of validation (docs/design.md "Validation"): which dataset and split, how many
tasks, how many samples per task, and the sampling parameters, from the ``evaluation()`` knobs and
a call's overrides, checked on the driver before any runner gets them.

Validation belongs to the algorithm (``GRPO.evaluate`` / ``evaluate_tasks``) and runs on the
runners that sample for training; its requests to them are
``pipelines/runner_requests.sample_for_evaluation``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...env_runners.engines.base import SamplingConfig
from ...env_runners.llm_env_runner import EVAL_SAMPLING_KEYS

__all__ = ["EvalSettings", "eval_settings", "eval_source", "dataset_label"]

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

