"""rllib-spear command: train from a YAML config on Tune, evaluate a checkpoint, export it, plan memory.

    rllib-spear train configs/spear_cpu_demo.yaml --set training.lr=5e-5 --set stop.training_iteration=5
    rllib-spear eval results/spear_cpu_demo/<trial> --split test      (the trial's latest checkpoint)
    rllib-spear eval <checkpoint> --dataset data/aime.parquet --n 32 --temperature 1 --top-p 0.6 --json out.json
    rllib-spear export results/spear_cpu_demo/<trial>/checkpoint_000010 exported_model/
    rllib-spear plan configs/spear_qwen2.5_7b_search.yaml --gpu-memory-gb 80
    rllib-spear convert-corpus wiki-18.jsonl.gz data/wiki18.parquet

YAML layout: algorithm (a registered name: SPEAR, SPADER, DrBoT, GRPO-LLM), stop (Tune stop
criteria: a result key such as training_iteration, or a metric path such as
env_runners/success_rate), optional name, storage_path, checkpoint_freq, max_failures (Tune
restarts a failed trial from its last checkpoint up to this many times; --max-failures overrides),
num_samples, num_cpus, and config: one mapping per AlgorithmConfig builder method (environment, env_runners, training,
learners, rl_module, evaluation, debugging, fault_tolerance, ...), each applied as
config.<method>(**kwargs). An unknown key anywhere fails at once, naming the closest valid one.
--set section.key=value overrides a builder setting (training.lr=1e-5), --set key=value a
top-level one (stop.training_iteration=3). Errors print their message alone; --debug shows the
traceback. A name already used under storage_path is refused; --resume continues that experiment
(Tune restores its trials from their last checkpoints); an interrupted run exits 130. Import paths
(env: my_envs:MyEnv) are read from the working directory.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from .config_keys import (SHORTHAND_SECTIONS, ConfigKeyError, check_experiment_keys, check_override_keys,
                          check_section_types)
from .progress import progress_line

__all__ = ["main", "load_experiment", "build_config", "apply_overrides", "quiet_worker_logs", "CLIError"]


class CLIError(ValueError):
    """An error of the user's input (config file, key, value, path): ``main`` prints its
    message alone, without a traceback (``--debug`` shows it)."""


def override_path(key: str) -> list[str]:
    """The experiment path of a ``--set`` key: builder sections may omit the leading
    ``config.`` (``training.lr`` -> config.training.lr); a stop metric may be written with dots
    (``stop.env_runners.success_rate`` -> the Tune key ``env_runners/success_rate``)."""
    path = key.split(".")
    if path[0] in SHORTHAND_SECTIONS:
        path = ["config", *path]
    if path[0] == "stop" and len(path) > 2:
        path = ["stop", "/".join(path[1:])]
    return path


def parse_override(item: str) -> tuple[str, Any]:
    """(key, value) of a ``key=value`` override, the value parsed as YAML."""
    if "=" not in item:
        raise CLIError(f"--set expects key=value, got {item!r}")
    key, raw = item.split("=", 1)
    value = yaml.safe_load(raw)
    if isinstance(value, str):
        try:  # YAML 1.1 reads "2e-4" as a string; users mean the number
            value = float(value)
        except ValueError:
            pass
    return key, value


def _set_path(exp: dict[str, Any], path: list[str], value: Any, key: str) -> None:
    node = exp
    for p in path[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise CLIError(f"--set {key}: {p!r} is not a mapping in the config")
    node[path[-1]] = value


def apply_overrides(exp: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (value parsed as YAML; paths as :func:`override_path`).
    No key check here: :func:`load_experiment` checks each override against the algorithm."""
    for item in overrides:
        key, value = parse_override(item)
        _set_path(exp, override_path(key), value, key)
    return exp


def read_experiment(path: str) -> dict[str, Any]:
    """The mapping of an experiment YAML file; CLIError for a missing, unreadable or non-mapping file."""
    try:
        with open(path) as f:
            exp = yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise CLIError(f"{path}: no such config file (the YAML layouts are in configs/)") from None
    except (OSError, yaml.YAMLError) as e:
        raise CLIError(f"{path}: cannot read the YAML config: {e}") from None
    if not isinstance(exp, dict):
        raise CLIError(f"{path}: the config must be a YAML mapping (algorithm, stop, config, ...), "
                       f"got a {type(exp).__name__}")
    return exp


def default_config(name: Any) -> Any:
    """The default config of a registered algorithm (CLIError naming the choices otherwise)."""
    _load_plugin()
    from rllib_spear.registration import algorithm_classes

    classes = algorithm_classes()
    if name not in classes:
        raise CLIError(f"unknown algorithm {name!r}; choose one of {sorted(classes)}")
    return classes[name].get_default_config()


def load_experiment(path: str, overrides: list[str] | None = None) -> dict[str, Any]:
    """The experiment of a YAML file with ``--set`` overrides applied. Every key of the file and
    of each override is checked against the algorithm (rllib_spear/config_keys.py): a typo is a
    CLIError naming the key, where it came from and the closest valid ones."""
    exp = read_experiment(path)
    if "algorithm" not in exp:
        raise CLIError(f"{path}: missing top-level key 'algorithm' (SPEAR, SPADER, DrBoT, GRPO-LLM)")
    config = default_config(exp["algorithm"])
    try:
        check_experiment_keys(exp, config)
    except ConfigKeyError as e:
        raise CLIError(f"{path}: {e}") from None
    for item in overrides or []:
        key, value = parse_override(item)
        keys = override_path(key)
        try:
            check_override_keys(keys, value, config)
        except ConfigKeyError as e:
            raise CLIError(f"--set {item}: {e}") from None
        _set_path(exp, keys, value, key)
    return exp


@functools.cache
def _load_plugin() -> None:
    """Register the library's algorithms with Tune (once). The rllib-spear process skips the
    registration at import (rllib_spear/__init__.py: --help stays free of Ray); every command
    that builds a config or restores a checkpoint comes here first."""
    from rllib_spear.registration import register_all

    register_all()


def build_config(exp: dict[str, Any]) -> Any:
    """The AlgorithmConfig described by an experiment mapping (its keys checked first)."""
    cfg = default_config(exp.get("algorithm"))
    try:
        check_experiment_keys(exp, cfg)
    except ConfigKeyError as e:
        raise CLIError(str(e)) from None
    for section, kwargs in (exp.get("config") or {}).items():
        try:
            # a value of the wrong type ("temperature: high") is named here, not in a bare
            # TypeError of validate()'s comparisons
            getattr(cfg, section)(**check_section_types(section, kwargs or {}, cfg))
        except ConfigKeyError as e:
            raise CLIError(str(e)) from None
        except TypeError as e:
            raise CLIError(f"config.{section}: {e}") from None
    return cfg


#: The line RLlib appends to every validation error: a Python-only escape hatch, noise on the CLI.
_RLLIB_HINT = re.compile(r"\n?To suppress all validation errors, set `config\.experimental\(_validate_config=False\)`"
                         r" at your own risk\.?")


def validation_message(error: Exception) -> str:
    """A ``validate()`` error without RLlib's ``_validate_config=False`` hint."""
    return _RLLIB_HINT.sub("", str(error)).strip()


def block_means(values: list[float], blocks: int = 6) -> list[tuple[int, int, float]]:
    """(first iteration, last iteration, mean) over ``blocks`` consecutive, near-equal blocks of a
    per-iteration series (iterations numbered from 1): the trend without one batch's noise."""
    n = len(values)
    k = max(1, min(blocks, n))
    edges = [round(i * n / k) for i in range(k + 1)]
    return [(a + 1, b, sum(values[a:b]) / (b - a)) for a, b in zip(edges, edges[1:]) if b > a]


#: Ray/Tune loggers whose routine notices would interleave with the one line per iteration of
#: ``rllib-spear train`` (every checkpoint, the slow-setup hint, the missing-gputil hint).
_QUIET_LOGGERS = {"ray.train": logging.WARNING, "ray.tune.trainable.trainable": logging.WARNING,
                  "ray.tune.utils.util": logging.ERROR}


def quiet_worker_logs() -> None:
    """Ray ``worker_process_setup_hook`` of ``rllib-spear train``: raise the level of
    ``_QUIET_LOGGERS`` in every worker process (warnings and errors still show)."""
    for name, level in _QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)


def max_failures(exp: dict, args: argparse.Namespace) -> int:
    """Trial restarts: ``--max-failures``, else the YAML's ``max_failures``, else 0 (the CPU
    demos; the GPU recipes set 3)."""
    value = getattr(args, "max_failures", None)
    if value is None:
        value = exp.get("max_failures", 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise CLIError(f"max_failures must be an integer >= 0 (-1: restart without limit), got {value!r}")
    return value


def _validate_for_train(cfg: Any, config_path: str) -> None:
    """``cfg.validate()`` and the cold start, as CLIErrors naming the config file. Resolve an
    embedded cold start here, in the foreground: a shipped build is a file copy; a build (a recipe
    with no shipped build) prints its progress on this console and stops on Ctrl-C, instead of
    running silently inside the trial actor."""
    from rllib_spear.coldstart import resolve_model_path

    try:
        cfg.validate()
        resolve_model_path(str(cfg.model_config.get("model_path", "")))
    except ValueError as e:
        raise CLIError(f"{config_path}: {validation_message(e)}") from e
    except TypeError as e:  # a value of a type no check above foresaw: still no bare traceback
        raise CLIError(f"{config_path}: a setting has the wrong type ({e}); compare each value with its default "
                       "(docs/design.md) or run with --debug for the traceback") from e


def check_experiment_dir(exp_dir: Path, resume: bool) -> None:
    """A name is one experiment: running a name again started a second trial at iteration 1 beside
    the first (and ``eval`` then refused the folder, "holds 2 trials"). CLIError when ``exp_dir``
    already holds an experiment and ``resume`` is off, or holds none and ``resume`` is on."""
    exists = exp_dir.is_dir() and any(exp_dir.iterdir())
    if exists and not resume:
        raise CLIError(f"{exp_dir} already holds an experiment of this name: add --resume to continue it from "
                       f"its last checkpoints, or start a new one under another name (--set name=...) or after "
                       f"removing the folder")
    if resume and not exists:
        raise CLIError(f"--resume: no experiment to resume at {exp_dir}; run without --resume to start it")


def cwd_on_sys_path() -> None:
    """Put the working directory on ``sys.path``: an ``env: my_envs:MyEnv`` next to the YAML is
    imported in this process (``validate()``) and the Ray workers (Ray adds the driver's working
    directory to theirs, and ``runtime_env`` below sets PYTHONPATH). The ``rllib-spear`` script's
    ``sys.path[0]`` is its bin folder, not the working directory (``python -m`` has it)."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def ray_runtime_env() -> dict[str, Any]:
    """The ``runtime_env`` of ``rllib-spear train``'s Ray: the working directory on every worker's
    PYTHONPATH (processes a worker starts, such as vLLM's, import the user's modules too)."""
    pythonpath = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
                         "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights" bars
                         "PYTHONPATH": pythonpath},
            "worker_process_setup_hook": "rllib_spear.cli.quiet_worker_logs"}


def start_ray(exp: dict[str, Any]) -> None:
    """Start Ray for ``train`` (unless this process already did)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=exp.get("num_cpus"), include_dashboard=False, runtime_env=ray_runtime_env())


def check_cluster(exp: dict[str, Any], cfg: Any, config_path: str) -> None:
    """Refuse, before Tune starts, a trial whose placement group the cluster can never hold: Tune
    would wait for it forever (resource_check.check_trial_fits, the Python API's message)."""
    from rllib_spear.cluster.resource_check import check_trial_fits
    from rllib_spear.registration import algorithm_classes

    try:
        check_trial_fits(algorithm_classes()[exp["algorithm"]], cfg)
    except ValueError as e:
        raise CLIError(f"{config_path}: {e}") from None


#: A Python exception line ("TypeError: ..." or "ray.exceptions.RayTaskError: ...").
_EXC_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b.*")
#: What a Ray worker writes to its .err log when an actor's __init__ raised.
_CREATION_FAILED = "Exception raised in creation task:"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def last_exception_line(text: str) -> str | None:
    """The last exception line of a traceback text (its final, outermost-raised error)."""
    lines = [ln.strip() for ln in _ANSI.sub("", text).splitlines() if _EXC_LINE.match(ln.strip())]
    return lines[-1] if lines else None


def actor_failures(logs_dir: Path, job_id: str | None = None, since: float = 0.0) -> list[tuple[str, str, Path]]:
    """(actor class, exception line, log file) of each actor whose creation failed, from the
    ``worker-*.err`` logs Ray writes in ``logs_dir`` (of job ``job_id``, changed after ``since``),
    oldest log first."""
    pattern = f"worker-*-{job_id}-*.err" if job_id else "worker-*.err"
    files = [f for f in logs_dir.glob(pattern) if f.stat().st_mtime >= since]
    out = []
    for f in sorted(files, key=lambda f: f.stat().st_mtime):
        text = _ANSI.sub("", f.read_text(errors="replace"))
        for block in text.split(_CREATION_FAILED)[1:]:
            actor = re.search(r"ray::(\w+)\.", block)
            line = last_exception_line(block.split("\n\n")[0])
            if line:
                out.append((actor.group(1) if actor else "an actor", line, f))
    return out


def _ray_logs_dir() -> Path | None:
    """The log folder of this process's Ray session (Ray's private node handle; None when moved)."""
    try:
        from .rllib_private import ray_session_logs_dir

        return ray_session_logs_dir()
    except Exception:  # noqa: BLE001 - a best-effort pointer, never the reason a report fails
        return None


def failure_report(error: Any, trial_dir: Any, since: float) -> list[str]:
    """The lines ``train`` prints for a failed trial: the trial's final error, then the first actor
    error that is not that one (an env runner's ``__init__`` failing ends the trial in an unrelated
    ``IndexError`` of RLlib, the cause only in the runner's log), then where the traceback is."""
    text = str(error)
    last = (last_exception_line(text) or text.strip().splitlines()[-1]) if text.strip() else repr(error)
    lines = [f"training failed: {last}"]
    logs = _ray_logs_dir()
    job_id = None
    try:
        import ray

        job_id = ray.get_runtime_context().get_job_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001
        pass
    causes = [c for c in (actor_failures(logs, job_id, since) if logs and logs.is_dir() else []) if c[1] != last]
    if causes:
        actor, line, log = causes[0]
        lines.append(f"first actor error ({actor}, log {log}): {line}")
    error_file = Path(str(trial_dir)) / "error.txt" if trial_dir else None
    if error_file is not None and error_file.is_file():
        lines.append(f"full traceback: {error_file}")
    return lines


def unfinished_trials(grid: Any) -> int:
    """Trials that neither ended nor failed: the run was interrupted (Ctrl-C, SIGUSR1), Tune saved
    their state and they wait for ``--resume``."""
    return len(grid) - int(grid.num_terminated) - int(grid.num_errors)


def _interrupted(config_path: str, exp_dir: Path) -> int:
    print(f"interrupted: the experiment in {exp_dir} is not finished; continue it with "
          f"rllib-spear train {config_path} --resume", file=sys.stderr)
    return 130  # the shell's code of a run ended by SIGINT


def _restored_tuner(tune: Any, exp_dir: Path, algorithm: str, callbacks: list) -> Any:
    """``Tuner.restore`` of the experiment in ``exp_dir``: unfinished and failed trials continue from
    their last checkpoints, with the settings they were started with. The restored run config
    holds the callbacks pickled at the first start; this run's progress callback replaces them
    (the Tuner's run config is private: when it moved, the old callbacks stay, lines still print)."""
    from .rllib_private import restored_run_config

    tuner = tune.Tuner.restore(str(exp_dir), trainable=algorithm, resume_unfinished=True, resume_errored=True)
    run_config = restored_run_config(tuner)
    if run_config is not None:
        run_config.callbacks = callbacks
    return tuner


def _train(args: argparse.Namespace) -> int:
    from ray import tune

    exp = load_experiment(args.config, args.set)
    cfg = build_config(exp)
    _validate_for_train(cfg, args.config)
    stop = exp.get("stop") or {"training_iteration": 10}
    name = exp.get("name") or Path(args.config).stem
    storage = os.path.abspath(exp.get("storage_path") or "results")
    exp_dir = Path(storage) / name
    check_experiment_dir(exp_dir, bool(getattr(args, "resume", False)))

    # the task's headline number: answer-set F1 on multi-answer search (a full-set "success" is
    # rare there), success elsewhere
    label, key = ("f1", "f1_mean") if cfg.env == "multi_answer_search" else ("success", "success_rate")
    headline: list[float] = []

    class _Progress(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            print(progress_line(result), flush=True)
            value = (result.get("env_runners") or {}).get(key)
            if isinstance(value, (int, float)):
                headline.append(float(value))

    start_ray(exp)
    check_cluster(exp, cfg, args.config)
    t0 = time.time()
    if getattr(args, "resume", False):
        tuner = _restored_tuner(tune, exp_dir, exp["algorithm"], [_Progress()])
    else:
        tuner = tune.Tuner(
            exp["algorithm"],
            param_space=cfg,
            tune_config=tune.TuneConfig(num_samples=int(exp.get("num_samples") or 1)),
            run_config=tune.RunConfig(
                name=name, storage_path=storage, stop=stop, verbose=0, callbacks=[_Progress()],
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=int(exp.get("checkpoint_freq", 0) or 0),
                    checkpoint_at_end=True),
                # a failed trial (a learner or the trial's process died, a node was lost) restarts
                # from its last checkpoint: docs/design.md "Fault tolerance"
                failure_config=tune.FailureConfig(max_failures=max_failures(exp, args)),
            ),
        )
    try:
        grid = tuner.fit()
    except KeyboardInterrupt:  # a second Ctrl-C, or Tune's handler off (TUNE_DISABLE_SIGINT_HANDLER)
        return _interrupted(args.config, exp_dir)
    results = [grid[i] for i in range(len(grid))]
    failed = [r for r in results if r.error]
    if failed:
        if getattr(args, "debug", False):
            print(f"training failed: {failed[0].error}", file=sys.stderr)
        print("\n".join(failure_report(failed[0].error, failed[0].path, t0)), file=sys.stderr)
        return 1
    if headline:
        print(f"{label} by iterations: " + ", ".join(f"{a}-{b}: {m:.3f}" for a, b, m in block_means(headline)))
    if unfinished_trials(grid):
        return _interrupted(args.config, exp_dir)
    print(f"done in {time.time() - t0:.0f}s; trial dir{'s' if len(results) > 1 else ''}: "
          + ", ".join(str(r.path) for r in results))
    for res in results:
        if res.checkpoint:
            print(f"checkpoint: {res.checkpoint.path}")
    print(f"TensorBoard: tensorboard --logdir {storage}/{name}")
    return 0


def _checked_checkpoint(arg: str) -> str:
    """The checkpoint ``arg`` names (a trial or experiment folder: its latest), checked against
    its manifest before anything loads it; a missing, truncated or corrupted file is a CLIError
    naming it (no traceback)."""
    from rllib_spear.checkpoint_io import CorruptCheckpointError, verify_checkpoint
    from rllib_spear.checkpoint_paths import resolve_checkpoint

    try:
        checkpoint = str(resolve_checkpoint(arg))
        verify_checkpoint(checkpoint)
    except (FileNotFoundError, CorruptCheckpointError) as e:
        raise CLIError(str(e)) from None
    if os.path.abspath(checkpoint) != os.path.abspath(arg):
        print(f"checkpoint: {checkpoint}")
    return checkpoint


def _eval(args: argparse.Namespace) -> int:
    """Evaluate a checkpoint (``GRPO.evaluate_tasks``): a per-benchmark table on stdout (rows =
    ``data_source``, then the unweighted average; columns = the metrics) and, with ``--json``,
    the settings and every metric in a file. Unset options take the checkpoint's
    ``evaluation()`` settings."""
    checkpoint = _checked_checkpoint(args.checkpoint)  # a trial or experiment folder: its latest
    import ray

    _load_plugin()
    from ray.rllib.algorithms.algorithm import Algorithm
    from rllib_spear import GRPOConfig
    from rllib_spear.algorithms.grpo.evaluation import eval_settings, eval_source

    overrides = {"split": args.split, "num_tasks": args.num_tasks, "samples": args.n, "temperature": args.temperature,
                 "top_p": args.top_p, "top_k": args.top_k, "max_new_tokens": args.max_new_tokens}
    try:  # the options given, before the (slow) restore; unset ones are the checkpoint's, checked below
        eval_settings(GRPOConfig(), **overrides)
    except ValueError as e:
        print(f"eval: {e}", file=sys.stderr)
        return 2
    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    algo = Algorithm.from_checkpoint(checkpoint)
    try:
        try:  # bad settings or a dataset that does not load: say so, no traceback
            run = eval_settings(algo.config, **overrides)
            metrics = algo.evaluate_tasks(dataset=args.dataset, **overrides)
        except ValueError as e:
            print(f"eval: {e}", file=sys.stderr)
            return 2
        source = eval_source(algo.config, args.dataset)
        settings = {"checkpoint": checkpoint,
                    "dataset": str(source) if isinstance(source, (str, os.PathLike)) else type(source).__name__,
                    "split": run.split, "num_tasks": run.num_tasks, "n": run.samples,
                    **run.sampling, "max_new_tokens": run.sampling["max_new_tokens"] or algo.config.max_new_tokens}
    finally:
        algo.stop()
    print(", ".join(f"{k} {v}" for k, v in settings.items() if k != "checkpoint"))
    print(format_source_table(metrics))
    print(", ".join(f"{k} {metrics[k]:.4g}" for k in metrics if "/" not in k))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": settings, "metrics": metrics}, indent=2))
    return 0


def format_source_table(metrics: dict[str, float]) -> str:
    """The per-benchmark table of a ``task_metrics`` dict: one row per ``data_source``, the
    "avg" row last (its counts are the totals), one column per metric."""
    from rllib_spear.metrics import source_table

    rows, cols, cells = source_table(metrics)
    first = max([len("source"), *map(len, rows)])
    widths = [max(len(c), 6) for c in cols]

    def cell(row: str, col: str, w: int) -> str:
        v = cells[row].get(col)
        if v is None:
            return "-".rjust(w)
        return (f"{int(v)}" if col.startswith("num_") else f"{v:.4f}").rjust(w)

    lines = ["  ".join(["source".ljust(first), *(c.rjust(w) for c, w in zip(cols, widths))])]
    lines += ["  ".join([r.ljust(first), *(cell(r, c, w) for c, w in zip(cols, widths))]) for r in rows]
    return "\n".join(lines)


def _export(args: argparse.Namespace) -> int:
    from rllib_spear.export import export_checkpoint

    checkpoint = _checked_checkpoint(args.checkpoint)
    try:
        out = export_checkpoint(checkpoint, args.out, module_id=args.module_id, dtype=args.dtype)
    except (FileNotFoundError, KeyError) as e:
        raise CLIError(str(e.args[0] if e.args else e)) from None
    info = json.loads((out / "rllib_spear_export.json").read_text())
    print(f"exported {info['source']} (weights version {info['weights_seq_no']}, {info['dtype']}) to {out}")
    return 0


def _plan(args: argparse.Namespace) -> int:
    """Print the memory plan of a config (rllib_spear/planning/, docs/memory_planner.md); exit 1
    when a declared GPU (learners.gpu_memory_gb, env_runners.engine_gpu_memory_gb or
    --gpu-memory-gb) or the learner node's host memory (--host-memory-gb) cannot hold it, 2 when
    the config is invalid or its model has no shape."""
    from rllib_spear import planning

    overrides = list(args.set)
    if args.gpu_memory_gb is not None:
        overrides.append(f"learners.gpu_memory_gb={args.gpu_memory_gb}")
    cfg = build_config(load_experiment(args.config, overrides))
    try:
        cfg.validate(check_files=False)  # a plan for another machine's folders
    except ValueError as e:  # a memory-plan refusal is what this command reports below
        if planning.MEMORY_ERROR not in str(e):
            raise CLIError(f"{args.config}: {validation_message(e)}") from e
    host, host_note = args.host_memory_gb, None
    if host is None:  # CPU learners run here (a local cluster); GPU learners on a GPU node
        cpu_learners = float(getattr(cfg, "num_gpus_per_learner", 0) or 0) == 0
        host = planning.available_host_memory_gb() if cpu_learners else DEFAULT_HOST_MEMORY_GB
        if cpu_learners and host is not None:
            host = round(host, 1)
            host_note = (f"host memory: {host:g} GiB available on this machine, where CPU learners run "
                         "(--host-memory-gb N to plan for another)")
    try:
        plan = planning.plan(cfg, host_memory_gb=host)
    except ValueError as e:
        raise CLIError(f"{args.config}: {e}") from e
    print(f"memory plan of {args.config} (GiB = 2^30 bytes)")
    if host_note:
        print(host_note)
    print(planning.format_plan(plan))
    return 1 if plan.fits is False else 0


def _convert_corpus(args: argparse.Namespace) -> int:
    """Stream a wiki-18 style JSONL into a corpus parquet (rllib_spear/envs/corpus.py,
    docs/retrieval.md); exit 2 on a bad line (it names the line) or a bad file."""
    from rllib_spear.envs.corpus import convert_corpus

    try:
        stats = convert_corpus(args.src, args.out, limit=args.limit, skip_bad=args.skip_bad,
                               row_group_size=args.row_group_size, progress_every_s=args.progress_s)
    except ValueError as e:
        print(f"convert-corpus: {e}", file=sys.stderr)
        return 2
    print(f"wrote {stats.written} passages to {args.out} ({stats.lines} lines read, {stats.skipped} bad "
          f"lines skipped, {stats.blank} blank; {stats.seconds:.1f}s, "
          f"{stats.lines / max(stats.seconds, 1e-9):,.0f} lines/s)")
    for lineno, reason in stats.bad:
        print(f"  skipped line {lineno}: {reason}")
    if stats.skipped > len(stats.bad):
        print(f"  ... and {stats.skipped - len(stats.bad)} more")
    return 0


def package_version() -> str:
    """The installed distribution's version (the package's own when run from a source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rllib-spear")
    except PackageNotFoundError:
        from rllib_spear import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser. Building it imports nothing heavy: --help and --version answer
    without loading Ray or torch (each command imports what it needs when it runs)."""
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show the full traceback of an error instead of its message alone")
    parser = argparse.ArgumentParser(prog="rllib-spear", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="show the full traceback of an error instead of its message alone")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train", parents=[debug], help="train from a YAML config on Tune")
    p.add_argument("config", help="the experiment YAML (configs/*.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. training.lr=1e-5 or stop.training_iteration=3")
    p.add_argument("--max-failures", type=int, default=None, metavar="N",
                   help="restart a failed trial from its last checkpoint up to N times (default: the YAML's "
                        "max_failures, 0 if unset; -1 = no limit)")
    p.add_argument("--resume", action="store_true",
                   help="continue the experiment of this name (storage_path/name) from its last checkpoints "
                        "(Tune's Tuner.restore); without it an existing experiment of the name is refused")
    p.set_defaults(func=_train)
    e = sub.add_parser("eval", parents=[debug],
                       help="evaluate a checkpoint on a dataset split, per benchmark (data_source)")
    e.add_argument("checkpoint", help="a checkpoint_NNNNNN folder, a Tune trial folder (its latest checkpoint) "
                                      "or an experiment folder with one trial")
    e.add_argument("--dataset", default=None,
                   help="parquet / JSONL / JSON file or folder in any layout of docs/data_formats.md (Search-R1, "
                        "AIME, QAMPARI, ...), or a default-dataset name (default: the config's eval_dataset, "
                        "else its dataset, else the environment's embedded data)")
    e.add_argument("--split", default=None, help="dataset split (default: evaluation.eval_split, 'test')")
    e.add_argument("--num-tasks", type=int, default=None, help="first N tasks of the split (default all)")
    e.add_argument("--n", "--samples", dest="n", type=int, default=None,
                   help="samples per task; n > 1 adds mean@n and pass@k (default: evaluation.eval_samples, 1)")
    e.add_argument("--temperature", type=float, default=None, help="0 = greedy (default: evaluation.eval_temperature, 0)")
    e.add_argument("--top-p", type=float, default=None, help="nucleus sampling (default: evaluation.eval_top_p, 1)")
    e.add_argument("--top-k", type=int, default=None, help="top-k sampling, -1 = off (default: evaluation.eval_top_k)")
    e.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens per turn (default: evaluation.eval_max_new_tokens, else the training value)")
    e.add_argument("--json", default=None, help="also write the settings and every metric to this JSON file")
    e.set_defaults(func=_eval)
    x = sub.add_parser("export", parents=[debug], help="write a checkpoint's policy as a Hugging Face model folder")
    x.add_argument("checkpoint", help="a checkpoint_NNNNNN folder, a Tune trial folder (its latest checkpoint) "
                                      "or an experiment folder with one trial")
    x.add_argument("out", help="the folder to write (save_pretrained layout plus rllib_spear_export.json)")
    x.add_argument("--module-id", default="default_policy")
    x.add_argument("--dtype", default=None, help="bfloat16 / float16 / float32 (default: the master dtype)")
    x.set_defaults(func=_export)
    m = sub.add_parser("plan", parents=[debug],
                       help="print the memory plan of a YAML config (exit 1: it does not fit)")
    m.add_argument("config")
    m.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. learners.num_learners=8")
    m.add_argument("--gpu-memory-gb", type=float, default=None,
                   help="memory of one learner GPU in GiB (learners.gpu_memory_gb; engines too unless "
                        "env_runners.engine_gpu_memory_gb is set)")
    m.add_argument("--host-memory-gb", type=float, default=None,
                   help="host RAM of one learner node in GiB: with cpu_offload the node's learner ranks keep "
                        "their shards, gradients and AdamW state in pinned host memory, which must fit in it "
                        f"(default {DEFAULT_HOST_MEMORY_GB:g}: the 2 TB of an 8-GPU H100/H200 node such as a "
                        "DGX H100/H200); CPU learners hold all of their state and activations there (default: "
                        "this machine's available RAM)")
    m.set_defaults(func=_plan)
    c = sub.add_parser("convert-corpus", parents=[debug],
                       help="stream a wiki-18 JSONL (.jsonl or .jsonl.gz) into a corpus parquet")
    c.add_argument("src", help="JSONL: {\"id\", \"contents\": \"\\\"Title\\\"\\ntext\"} (wiki-18) or {\"id\", \"title\", \"text\"}")
    c.add_argument("out", help="the corpus parquet to write (columns id, title, text)")
    c.add_argument("--limit", type=int, default=None, help="stop after N passages (a sample)")
    c.add_argument("--skip-bad", action="store_true", help="skip and count bad lines instead of stopping at the first")
    c.add_argument("--row-group-size", type=int, default=1024, help="rows per parquet row group (default 1024)")
    c.add_argument("--progress-s", type=float, default=10.0, help="seconds between progress lines (0: none)")
    c.set_defaults(func=_convert_corpus)
    return parser


#: Host RAM of one learner node assumed by ``plan`` (GiB): an 8x H100 / H200 node (DGX H100 /
#: H200) has 2 TB.
DEFAULT_HOST_MEMORY_GB = 2048.0


def main(argv: list[str] | None = None) -> int:
    """The rllib-spear command. Exit 0 on success, 1 when a plan does not fit or training failed,
    2 on a user error (its message printed alone; --debug raises it with the traceback)."""
    args = build_parser().parse_args(argv)
    cwd_on_sys_path()  # an env or reward given as an import path next to the YAML
    try:
        return int(args.func(args) or 0)
    except (CLIError, ConfigKeyError) as e:
        if args.debug:
            raise
        print(f"rllib-spear {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
