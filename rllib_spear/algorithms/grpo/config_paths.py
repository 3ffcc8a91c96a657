"""The files a config names (datasets, corpora, model folders): made absolute against the
driver's working directory when the config is built, and checked to exist in ``validate()``.

Why: Tune runs the algorithm in a trial actor whose working directory is the trial folder, and env
runners may run on other nodes, so ``dataset="data/train.parquet"`` given from the folder holding
it is not found there (an ``ActorDiedError`` after the Ray start). Resolved in the builder calls
(``environment()``, ``rl_module()``), a relative path means what it meant where the user typed it;
checked in ``validate()``, a missing file stops the run before any actor starts. A path of another
node's filesystem must be absolute.

Not paths: the default dataset names (``search_qa``, ...), the model names ``"embedded"``,
``"embedded:<task>"`` and the named cold starts, hub ids (``owner/name``: ``validate()`` says how
to download one), URLs, lists, callables.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Callable

__all__ = ["ENV_CONFIG_PATH_KEYS", "absolute_dataset", "absolute_env_config", "absolute_model_config",
           "missing_files", "known_model_names", "model_name_hint"]

#: ``env_config`` keys of the built-in environments that name files or folders.
ENV_CONFIG_PATH_KEYS = ("corpus_path", "index_dir", "game_file")


def _is_relative_path(value: Any) -> bool:
    if not isinstance(value, (str, os.PathLike)):
        return False
    text = os.fspath(value)
    return bool(text) and "://" not in text and not os.path.isabs(os.path.expanduser(text))


def _absolute(value: Any) -> Any:
    return os.path.abspath(os.path.expanduser(os.fspath(value))) if _is_relative_path(value) else value


def _is_dataset_name(value: Any) -> bool:
    from ...envs.loaders import DEFAULT_DATASETS

    return isinstance(value, str) and value in DEFAULT_DATASETS and not os.path.exists(value)


def absolute_dataset(dataset: Any) -> Any:
    """``dataset`` / ``eval_dataset`` with a relative file path made absolute (also inside a
    ``{"path": ..., "dataset_format": ...}`` dict); names, lists and callables unchanged."""
    if isinstance(dataset, dict) and "path" in dataset:
        return {**dataset, "path": absolute_dataset(dataset["path"])}
    if _is_dataset_name(dataset):
        return dataset
    return _absolute(dataset)


def absolute_env_config(env_config: dict[str, Any]) -> dict[str, Any]:
    """``env_config`` with its :data:`ENV_CONFIG_PATH_KEYS` made absolute."""
    return {k: (_absolute(v) if k in ENV_CONFIG_PATH_KEYS else v) for k, v in env_config.items()}


def _is_model_name(path: str) -> bool:
    from ...coldstart.lookup import NAMED_COLD_STARTS, is_embedded_name
    from ...models.folders import looks_like_hub_id

    return is_embedded_name(path) or path in NAMED_COLD_STARTS or looks_like_hub_id(path)


def absolute_model_config(model_config: dict[str, Any]) -> dict[str, Any]:
    """``model_config`` with a relative ``model_path`` folder made absolute."""
    path = model_config.get("model_path")
    if not isinstance(path, (str, os.PathLike)) or _is_model_name(os.fspath(path)):
        return model_config
    return {**model_config, "model_path": _absolute(path)}


def known_model_names() -> list[str]:
    """The ``model_path`` values that name a model rather than a folder: "embedded", "embedded:<task>"
    for each embedded task (its demonstrations train the cold start), the named cold starts."""
    from ...coldstart.lookup import NAMED_COLD_STARTS
    from ...envs.loaders import DEFAULT_DATASETS

    return ["embedded", *(f"embedded:{t}" for t in DEFAULT_DATASETS), *NAMED_COLD_STARTS]


def model_name_hint(path: str) -> str:
    """``"; did you mean 'smollm2-search'?"`` for a near-miss of a known model name (a typo of a name
    would otherwise read as a missing folder), then the list of names."""
    names = known_model_names()
    close = difflib.get_close_matches(str(path), names, n=3, cutoff=0.6)
    if not close:
        return ""
    return f"; did you mean {' or '.join(repr(c) for c in close)}? (model names: {', '.join(names)})"


def _unknown_embedded_task(path: str) -> bool:
    """"embedded:<task>" naming no embedded task: its cold start would fail to find demonstrations
    deep in the build (resolve_model_path treats "embedded:" and "embedded:default" as the default)."""
    from ...coldstart.lookup import is_embedded_name
    from ...envs.loaders import DEFAULT_DATASETS

    task = path.split(":", 1)[1] if ":" in path else ""
    return is_embedded_name(path) and task not in ("", "default", *DEFAULT_DATASETS)


def missing_files(cfg: Any, err: Callable[[str], None]) -> None:
    """``err`` for the first file ``cfg`` names that does not exist: the dataset, the eval
    dataset, the env_config paths, the model folder. (Resolved paths are absolute; a relative
    one, set by assignment rather than a builder call, is read against the working directory.)"""
    where = f"(working directory {os.getcwd()})"
    for field, value in (("dataset", cfg.dataset), ("eval_dataset", cfg.eval_dataset)):
        path = value.get("path") if isinstance(value, dict) else value
        if isinstance(path, (str, os.PathLike)) and not _is_dataset_name(path) and not Path(path).exists():
            err(f"`{field}` {os.fspath(path)!r} does not exist {where}: give an existing parquet / .jsonl / .json "
                f"file or folder (a path on the driver's machine; relative paths are read from the folder the "
                f"config is built in), or a default dataset name")
    for key in ENV_CONFIG_PATH_KEYS:
        value = (cfg.env_config or {}).get(key)
        if isinstance(value, (str, os.PathLike)) and "://" not in os.fspath(value) and not Path(value).exists():
            err(f"`env_config['{key}']` {os.fspath(value)!r} does not exist {where}: set "
                f".environment(env_config={{'{key}': <an existing path>}})")
    path = (cfg.model_config or {}).get("model_path")
    if isinstance(path, str) and _unknown_embedded_task(path):
        hint = model_name_hint(path) or f" (model names: {', '.join(known_model_names())})"
        err(f"`model_config['model_path']` {path!r} names no embedded cold start{hint}")
    if isinstance(path, (str, os.PathLike)) and not _is_model_name(os.fspath(path)) and not Path(path).is_dir():
        name = os.path.basename(os.fspath(path))  # made absolute by rl_module(): the name as typed
        err(f"`model_config['model_path']` {os.fspath(path)!r} is not a folder {where}{model_name_hint(name)}: "
            "point .rl_module(model_config={'model_path': ...}) at a local Hugging Face model folder (or a "
            "model name such as 'embedded')")
