"""Task loaders: parquet (pyarrow), lists of dicts or callables -> list of task dicts, validated
row by row.

``load_tasks(source, split="train", kind=None, *, env=None)``, ``source`` being:

- a default dataset name (``search_qa``, ``multi_answer_search``, ``code_math``, ``text_game``;
  ``textworld`` has no default file, see :func:`rllib_spear.envs.textworld_env.make_textworld_tasks`)
  loads the embedded generated table of that split;
- a parquet path (or a directory holding ``<split>.parquet``) is loaded and its schema is taken
  from ``kind`` or inferred from the columns;
- a list (or tuple) of task dicts, used for every split;
- a callable returning such a list: ``source(split)`` if it takes an argument, else ``source()``.

``env`` is the env spec the tasks are for (``config.env``). For an env other than the built-ins
(a class, an import path, a registered name) the rows are kept as they are (kind ``generic``:
each row a dict; only the uid is added) unless ``kind`` is given, and a ``source`` that is the env
itself (no dataset given) is an error that says how to give one.

Schemas (extra columns are kept as they are):

=================== =====================================================================
search_qa           ``question`` str, ``golden_answers`` list[str] (or Search-R1's
                    ``reward_model.ground_truth.target``), ``data_source`` (optional)
multi_answer_search ``question`` (or ``question_text``) str, ``answers`` (or ``ground_truth``)
                    list of entities, each a str or a list of alias strs
code_math           ``prompt`` str or chat list (last user message), ``answer`` (or
                    ``reward_model.ground_truth``) str/number
text_game           ``seed`` int, optional ``n_rooms``, ``n_objects``, ``goal``
textworld           ``game_file`` path of a compiled TextWorld game
generic             any dict (your own environment reads the keys it needs)
=================== =====================================================================

Every task gets a stable unique ``uid`` string: the ``uid`` (or ``id``) column when present
(duplicates are an error), else a hash of the row's content (plus the row index on collisions).
The first bad row raises ``ValueError("<file>: row <i>, column '<col>': <what is wrong>")``.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["load_tasks", "validate_tasks", "DEFAULT_DATASETS"]

DEFAULT_DATASETS = {
    "search_qa": "search_qa",
    "multi_answer_search": "multi_answer",
    "multi_answer": "multi_answer",
    "code_math": "code_math",
    "text_game": "text_game",
}


def _err(src: str, i: int, col: str, msg: str) -> ValueError:
    return ValueError(f"{src}: row {i}, column {col!r}: {msg}")


def _nonempty_str(v) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _get(row: dict, *names):
    for n in names:
        if n in row and row[n] is not None:
            return n, row[n]
    return names[0], None


def _check_search_qa(row: dict, src: str, i: int) -> dict:
    if not _nonempty_str(row.get("question")):
        raise _err(src, i, "question", f"expected a non-empty string, got {row.get('question')!r}")
    ga = row.get("golden_answers")
    if ga is None and isinstance(row.get("reward_model"), dict):
        gt = row["reward_model"].get("ground_truth")
        ga = gt.get("target") if isinstance(gt, dict) else gt
    if isinstance(ga, str):
        ga = [ga]
    if not isinstance(ga, (list, tuple)) or not ga or not all(_nonempty_str(a) for a in ga):
        raise _err(src, i, "golden_answers", f"expected a non-empty list of non-empty strings, got {ga!r}")
    row["golden_answers"] = [str(a) for a in ga]
    row.setdefault("data_source", "unknown")
    return row


def _check_multi(row: dict, src: str, i: int) -> dict:
    qc, q = _get(row, "question", "question_text")
    if not _nonempty_str(q):
        raise _err(src, i, qc, f"expected a non-empty string, got {q!r}")
    row["question"] = q
    ac, ans = _get(row, "answers", "ground_truth")
    if not isinstance(ans, (list, tuple)) or not ans:
        raise _err(src, i, ac, f"expected a non-empty list of entities, got {ans!r}")
    out = []
    for j, e in enumerate(ans):
        aliases = [e] if isinstance(e, str) else e
        if not isinstance(aliases, (list, tuple)) or not aliases or not all(_nonempty_str(a) for a in aliases):
            raise _err(src, i, ac, f"entity {j} must be a non-empty string or list of strings, got {e!r}")
        out.append([str(a) for a in aliases])
    row["answers"] = out
    row.setdefault("data_source", "unknown")
    return row


def _check_math(row: dict, src: str, i: int) -> dict:
    p = row.get("prompt")
    if isinstance(p, (list, tuple)):
        users = [m.get("content") for m in p if isinstance(m, dict) and m.get("role") == "user"]
        p = users[-1] if users else None
    if not _nonempty_str(p):
        raise _err(src, i, "prompt", f"expected a non-empty string or chat list, got {row.get('prompt')!r}")
    row["prompt"] = p
    a = row.get("answer")
    if a is None and isinstance(row.get("reward_model"), dict):
        a = row["reward_model"].get("ground_truth")
    if isinstance(a, bool) or not (isinstance(a, (int, float)) or _nonempty_str(a)):
        raise _err(src, i, "answer", f"expected a non-empty string or number, got {a!r}")
    row["answer"] = str(a)
    row.setdefault("data_source", "unknown")
    return row


def _check_game(row: dict, src: str, i: int) -> dict:
    s = row.get("seed")
    if isinstance(s, bool) or not isinstance(s, int) or s < 0:
        raise _err(src, i, "seed", f"expected a non-negative integer, got {s!r}")
    for c, lo, hi in (("n_rooms", 2, 8), ("n_objects", 1, 12)):
        if row.get(c) is not None and (isinstance(row[c], bool) or not isinstance(row[c], int)
                                       or not lo <= row[c] <= hi):
            raise _err(src, i, c, f"expected an integer in [{lo}, {hi}], got {row[c]!r}")
    if row.get("goal") is not None and not isinstance(row["goal"], str):
        raise _err(src, i, "goal", f"expected a string, got {row['goal']!r}")
    row.setdefault("data_source", "textgame")
    return row


def _check_textworld(row: dict, src: str, i: int) -> dict:
    g = row.get("game_file")
    if not _nonempty_str(g) or not os.path.exists(g):
        raise _err(src, i, "game_file", f"expected the path of an existing game file, got {g!r}")
    return row


def _check_generic(row: dict, src: str, i: int) -> dict:
    return row


CHECKS = {
    "generic": _check_generic,
    "search_qa": _check_search_qa,
    "multi_answer_search": _check_multi,
    "code_math": _check_math,
    "text_game": _check_game,
    "textworld": _check_textworld,
}


def _infer_kind(cols: list[str], src: str) -> str:
    if "game_file" in cols:
        return "textworld"
    if "seed" in cols:
        return "text_game"
    if "golden_answers" in cols:
        return "search_qa"
    if "answers" in cols or "ground_truth" in cols:
        return "multi_answer_search"
    if "prompt" in cols:
        return "code_math"
    if "reward_model" in cols and "question" in cols:
        return "search_qa"
    raise ValueError(f"{src}: cannot tell the task kind from columns {cols}; pass kind=...")


def _row_uid(row: dict) -> str:
    payload = json.dumps(row, sort_keys=True, default=str)
    return hashlib.sha1(payload.encode()).hexdigest()[:12]


def validate_tasks(rows: list[dict[str, Any]], kind: str, src: str = "<tasks>") -> list[dict[str, Any]]:
    """Validate/normalise task dicts of ``kind`` (see module docstring) and give each a uid."""
    if kind == "multi_answer":
        kind = "multi_answer_search"
    if kind not in CHECKS:
        raise ValueError(f"unknown task kind {kind!r}; choose from {sorted(CHECKS)}")
    check = CHECKS[kind]
    out, seen = [], set()
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{src}: row {i}: expected a dict, got {type(row).__name__}")
        row = check(dict(row), src, i)
        uc, uid = _get(row, "uid", "id")
        if uid is not None:
            if isinstance(uid, bool) or not isinstance(uid, (str, int)) or not str(uid).strip():
                raise _err(src, i, uc, f"expected a non-empty string, got {uid!r}")
            uid = str(uid)
            if uid in seen:
                raise _err(src, i, uc, f"duplicate uid {uid!r}")
        else:
            uid = _row_uid(row)
            if uid in seen:
                uid = f"{uid}-{i}"
        seen.add(uid)
        row["uid"] = uid
        out.append(row)
    return out


def _no_dataset(env: Any) -> ValueError:
    from rllib_spear.envs.registry import env_label

    return ValueError(
        f"environment {env_label(env)!r} has no default dataset: give its tasks with "
        ".environment(env, dataset=...), a parquet path (or a directory of <split>.parquet), a list of task "
        "dicts or a callable returning one")


def _env_kind(env: Any) -> str | None:
    """The task kind of a built-in env spec, "generic" for any other env, None without one."""
    if env is None:
        return None
    from rllib_spear.envs.registry import builtin_env_name

    name = builtin_env_name(env)
    if name is None:
        return "generic"
    return "multi_answer_search" if name.startswith("multi_answer") else name


def _call_source(fn, split: str):
    import inspect

    try:
        takes_arg = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
                        for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        takes_arg = False
    return fn(split) if takes_arg else fn()


def load_tasks(source: Any, split: str = "train", kind: str | None = None, *, env: Any = None) -> list[dict]:
    """Load and validate tasks (see module docstring)."""
    env_kind = _env_kind(env)
    if source is env and env is not None and env_kind == "generic":
        raise _no_dataset(env)
    if callable(source) and not isinstance(source, (str, os.PathLike)):
        if isinstance(source, type):
            raise _no_dataset(source)
        name = getattr(source, "__qualname__", None) or type(source).__name__
        rows = _call_source(source, split)
        if not isinstance(rows, (list, tuple)):
            raise ValueError(f"task source {name}() must return a list of task dicts, got {type(rows).__name__}")
        return validate_tasks(list(rows), kind or env_kind or "generic", f"{name}()")
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("the task list is empty")
        return validate_tasks(list(source), kind or env_kind or "generic", "<task list>")
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(f"tasks must be a dataset name, a parquet path, a list of task dicts or a callable "
                         f"returning one, got {type(source).__name__}")
    name = str(source)
    if name in DEFAULT_DATASETS and not os.path.exists(name):
        from rllib_spear.data import default_paths

        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test' for default datasets, got {split!r}")
        path = default_paths()[f"{DEFAULT_DATASETS[name]}_{split}"]
        kind = kind or ("multi_answer_search" if name.startswith("multi_answer") else name)
    else:
        path = Path(name)
        if path.is_dir():
            path = path / f"{split}.parquet"
        if not path.exists():
            if env is not None and source is env:
                raise _no_dataset(env)
            raise ValueError(f"{path}: no such file (and {name!r} is not one of {sorted(DEFAULT_DATASETS)})")
    import pyarrow.parquet as pq

    src = str(path)
    try:
        table = pq.read_table(src)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{src}: cannot read parquet: {e}") from e
    kind = kind or (env_kind if env_kind == "generic" else None) or _infer_kind(table.column_names, src)
    return validate_tasks(table.to_pylist(), kind, src)
