"""Task loaders: parquet (pyarrow), JSONL / JSON, lists of dicts or callables -> list of task
dicts, validated row by row.

``load_tasks(source, split="train", kind=None, *, env=None, dataset_format=None)``, ``source``
being:

- a default dataset name (``search_qa``, ``multi_answer_search``, ``code_math``, ``text_game``;
  ``textworld`` has no default file, see :func:`rllib_spear.envs.textworld_env.make_textworld_tasks`)
  loads the embedded generated table of that split;
- a file path: parquet, ``.jsonl`` (one JSON object per line) or ``.json`` (a list of objects),
  or a directory holding ``<split>.parquet``, ``<split>.jsonl``, ``<split>.json`` or
  ``<split>_data.jsonl`` (QAMPARI's release names), the first found;
- a dict ``{"path": ..., "dataset_format": ...}``: that path read in that data format (what
  ``.environment(dataset=...)`` takes to force a format);
- a list (or tuple) of task dicts, used for every split;
- a callable returning such a list: ``source(split)`` if it takes an argument, else ``source()``.

Rows in a released upstream layout (Search-R1, DAPO-Math-17k, AIME 2024 / 2025, QAMPARI) are first
mapped to our schema by their **data format** (:mod:`rllib_spear.envs.formats`, table in
docs/data_formats.md): detected from the columns, or forced with ``dataset_format=`` (a format
name given as ``kind=`` works too). A file whose format is of another task kind than the built-in
``env`` it is loaded for is an error. Without a format, the kind is ``kind``, else inferred from
the columns (files) or taken from ``env`` (lists, callables).

``env`` is the env spec the tasks are for (``config.env``). For an env other than the built-ins
(a class, an import path, a registered name) the rows are kept as they are (kind ``generic``:
each row a dict; only the uid is added) unless ``kind`` or ``dataset_format`` is given, and a
``source`` that is the env itself (no dataset given) is an error that says how to give one.

Schemas (extra columns are kept as they are):

=================== =====================================================================
search_qa           ``question`` str, ``golden_answers`` list[str] (or Search-R1's
                    ``reward_model.ground_truth.target``), ``data_source`` (optional);
                    format ``search_r1`` also keeps ``prompt`` as chat messages (read by
                    the search envs with ``prompt_source="dataset"``)
multi_answer_search ``question`` (or ``question_text``) str, ``answers`` (or ``ground_truth``)
                    list of entities, each a str or a list of alias strs (format ``qampari``:
                    from ``answer_list``)
code_math           ``prompt`` str or chat list (last user message), ``answer`` (or
                    ``reward_model.ground_truth``) str/number; formats ``dapo_math``,
                    ``aime24``, ``aime25`` add ``problem`` (the bare problem text)
text_game           ``seed`` int, optional ``n_rooms``, ``n_objects``, ``goal``
textworld           ``game_file`` path of a compiled TextWorld game
generic             any dict (your own environment reads the keys it needs)
=================== =====================================================================

Every task gets a stable unique ``uid`` string: the ``uid`` (or ``id``) column when present, else
a hash of the row's content (plus the row index on collisions). Rows with an id that repeat an
earlier row exactly are dropped with a warning (DAPO-Math-17k repeats each prompt 100 times); an id
repeated within one ``data_source`` with other content is an error; ids repeated only across sources (Search-R1's merged test file has
"test_0" in nq and in hotpotqa) make every id-based uid ``<data_source>/<id>``.
The first bad row raises ``ValueError("<file>: row <i>, column '<col>': <what is wrong>")``.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

from rllib_spear.envs.formats import FORMATS, DataFormat, RowError, detect_formats, format_names, get_format

__all__ = ["load_tasks", "validate_tasks", "DEFAULT_DATASETS", "SPLIT_FILES"]

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




def _convert(fmt: DataFormat, row: dict, src: str, i: int) -> dict:
    """One row through ``fmt``'s converter; its errors name the file, row and column."""
    try:
        out = fmt.convert(row)
    except RowError as e:
        raise _err(src, i, e.column, f"{e.message} (read as the {fmt.name!r} data format)") from None
    except Exception as e:  # noqa: BLE001 - a user converter's bug: say which format and row
        raise ValueError(f"{src}: row {i}: the {fmt.name!r} data format cannot read this row: "
                         f"{type(e).__name__}: {e}") from e
    if not isinstance(out, dict):
        raise ValueError(f"{src}: row {i}: the {fmt.name!r} data format returned a {type(out).__name__}, not a dict")
    return out


def _explicit_uid(row: dict, src: str, i: int) -> tuple[str, str | None]:
    """(column, uid) of the row's ``uid`` / ``id`` column, uid None without one."""
    uc, uid = _get(row, "uid", "id")
    if uid is None:
        return uc, None
    if isinstance(uid, bool) or not isinstance(uid, (str, int)) or not str(uid).strip():
        raise _err(src, i, uc, f"expected a non-empty string, got {uid!r}")
    return uc, str(uid)


def _assign_uids(rows: list[dict], src: str) -> None:
    """Give every row its ``uid`` (module docstring): an id repeated within one data source is an
    error; ids repeated only across sources are qualified as ``<data_source>/<id>``."""
    explicit = [_explicit_uid(row, src, i) for i, row in enumerate(rows)]
    first_at: dict[tuple[str, Any], int] = {}
    sources_of: dict[str, set] = {}
    for i, ((uc, uid), row) in enumerate(zip(explicit, rows)):
        if uid is None:
            continue
        key = (uid, row.get("data_source"))
        if key in first_at:
            raise _err(src, i, uc, f"duplicate uid {uid!r} (row {first_at[key]} has it too, with the same "
                                   f"data_source {key[1]!r}); ids must be unique within a data source")
        first_at[key] = i
        sources_of.setdefault(uid, set()).add(key[1])
    qualify = any(len(s) > 1 for s in sources_of.values())
    seen: set[str] = set()
    for i, ((_, uid), row) in enumerate(zip(explicit, rows)):
        if uid is None:
            uid = _row_uid(row)
            if uid in seen:
                uid = f"{uid}-{i}"
        elif qualify:
            uid = f"{row.get('data_source')}/{uid}"
        seen.add(uid)
        row["uid"] = uid


def _drop_repeated_rows(rows: list[dict], src: str) -> list[dict]:
    """Keep the first of rows with an id that are exactly equal (every column). Released files
    repeat rows on purpose: DAPO-Math-17k holds each of its ~17k prompts 100 times (1.79M rows) and
    DAPO's AIME-2024 parquet its 30 problems 32 times (for mean@32). Sampling uniformly over the
    distinct tasks is sampling uniformly over those rows, and ``eval_samples`` gives the repeats at
    evaluation; without this their shared ids would be refused as duplicates. A warning says how
    many rows were dropped."""
    seen: set[str] = set()
    kept = []
    for row in rows:
        if _get(row, "uid", "id")[1] is None:  # rows without ids stay (their uids get the row index)
            kept.append(row)
            continue
        key = _row_uid(row)
        if key not in seen:
            seen.add(key)
            kept.append(row)
    if len(kept) < len(rows):
        warnings.warn(f"{src}: {len(rows) - len(kept)} of {len(rows)} rows repeat an earlier row exactly and "
                      f"were dropped ({len(kept)} distinct tasks); use eval_samples / group_size for repeats",
                      stacklevel=3)
    return kept


def validate_tasks(rows: list[dict[str, Any]], kind: str, src: str = "<tasks>", *,
                   dataset_format: str | DataFormat | None = None) -> list[dict[str, Any]]:
    """Validate/normalise task dicts of ``kind`` (see module docstring) and give each a uid;
    with ``dataset_format`` (a name or a :class:`~rllib_spear.envs.formats.DataFormat`), each row
    is first mapped to our schema by that format."""
    if kind == "multi_answer":
        kind = "multi_answer_search"
    if kind not in CHECKS:
        raise ValueError(f"unknown task kind {kind!r}; choose from {sorted(CHECKS)}")
    fmt = get_format(dataset_format) if isinstance(dataset_format, str) else dataset_format
    check = CHECKS[kind]
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{src}: row {i}: expected a dict, got {type(row).__name__}")
        row = dict(row)
        if fmt is not None:
            row = _convert(fmt, row, src, i)
        out.append(check(row, src, i))
    out = _drop_repeated_rows(out, src)
    _assign_uids(out, src)
    return out


def _columns(rows: list[dict]) -> list[str]:
    """The keys of the rows, in first-seen order."""
    return list(dict.fromkeys(k for r in rows if isinstance(r, dict) for k in r))


def _choose(rows: list[dict], columns: list[str], src: str, kind: str | None, dataset_format: str | None,
            env_kind: str | None, *, from_file: bool) -> tuple[str, DataFormat | None]:
    """(task kind, data format or None) of a table (module docstring). Lists and callables
    without a kind or a built-in env stay ``generic``; files without a format infer the kind
    from their columns."""
    if kind in FORMATS and kind not in CHECKS:  # a format name given as kind
        if dataset_format not in (None, kind):
            raise ValueError(f"{src}: kind={kind!r} and dataset_format={dataset_format!r} disagree; give one")
        kind, dataset_format = None, kind
    if kind == "multi_answer":
        kind = "multi_answer_search"
    if dataset_format is not None:
        fmt = get_format(dataset_format)
        if kind is not None and kind != fmt.kind:
            raise ValueError(f"{src}: dataset_format={fmt.name!r} holds {fmt.kind} tasks, not kind={kind!r}")
        return fmt.kind, fmt
    if kind == "generic" or (kind is None and (env_kind == "generic" or (env_kind is None and not from_file))):
        return "generic", None
    found = detect_formats(columns, rows[0] if rows and isinstance(rows[0], dict) else {})
    want = kind or env_kind
    if want is not None and found:
        same = [f for f in found if f.kind == want]
        if not same and kind is None:
            names = ", ".join(f"{f.name!r} ({f.kind} tasks)" for f in found)
            raise ValueError(f"{src}: the columns {columns} are in the data format {names}, but the environment "
                             f"takes {want} tasks: give a {want} dataset, or force a format with "
                             f"dataset_format=... (one of {format_names()})")
        found = same
    if len(found) > 1:
        raise ValueError(f"{src}: the columns {columns} fit several data formats "
                         f"{[f.name for f in found]}; pick one with dataset_format=...")
    if found:
        return found[0].kind, found[0]
    if kind is not None:
        return kind, None
    return (_infer_kind(columns, src) if from_file else env_kind), None


def _read_rows(path: Path) -> tuple[list[dict], list[str]]:
    """(rows, column names) of a parquet, ``.jsonl`` or ``.json`` file."""
    src = str(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"{src}: cannot read: {e}") from e
        if suffix == ".json":
            try:
                rows = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{src}: invalid JSON ({e}); a .json task file holds one list of task "
                                 "objects (use .jsonl for one object per line)") from e
            if not isinstance(rows, list):
                raise ValueError(f"{src}: a .json task file must hold a list of task objects, got a "
                                 f"{type(rows).__name__} (use .jsonl for one object per line)")
        else:
            rows = []
            for n, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{src}: line {n}: invalid JSON ({e}); a .jsonl file holds one "
                                     "JSON object per line") from e
        return rows, _columns(rows)
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(src)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"{src}: cannot read parquet: {e}") from e
    return table.to_pylist(), list(table.column_names)


# Files a dataset directory may hold for a split, tried in this order.
SPLIT_FILES = ("{split}.parquet", "{split}.jsonl", "{split}.json", "{split}_data.jsonl")


def _split_file(directory: Path, split: str) -> Path:
    names = [n.format(split=split) for n in SPLIT_FILES]
    for n in names:
        if (directory / n).exists():
            return directory / n
    raise ValueError(f"{directory}: no file for split {split!r}: expected one of {names}")


def _no_dataset(env: Any) -> ValueError:
    from rllib_spear.envs.registry import env_label

    return ValueError(
        f"environment {env_label(env)!r} has no default dataset: give its tasks with "
        ".environment(env, dataset=...), a file path (parquet, .jsonl, .json) or a directory of <split>.parquet / "
        "<split>.jsonl, a list of task dicts or a callable returning one")


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


def _spec(source: dict, kind: str | None, dataset_format: str | None) -> tuple[Any, str | None, str | None]:
    """(path, kind, dataset_format) of a ``{"path": ..., "dataset_format": ..., "kind": ...}`` source."""
    extra = set(source) - {"path", "dataset_format", "kind"}
    if "path" not in source or extra:
        raise ValueError(f"a dataset given as a dict takes the keys 'path' (required), 'dataset_format' and "
                         f"'kind', got {sorted(source)}; e.g. {{'path': 'aime_2024.parquet', "
                         f"'dataset_format': 'aime24'}}")
    return source["path"], source.get("kind", kind), source.get("dataset_format", dataset_format)


def load_tasks(source: Any, split: str = "train", kind: str | None = None, *, env: Any = None,
               dataset_format: str | None = None) -> list[dict]:
    """Load and validate tasks (see module docstring). ``dataset_format``: a name of
    :func:`rllib_spear.envs.formats.format_names` to read the rows in that format (default:
    detected from the columns)."""
    if isinstance(source, dict):
        source, kind, dataset_format = _spec(source, kind, dataset_format)
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
        return _validate_table(list(rows), f"{name}()", kind, dataset_format, env_kind)
    if isinstance(source, (list, tuple)):
        if not source:
            raise ValueError("the task list is empty")
        return _validate_table(list(source), "<task list>", kind, dataset_format, env_kind)
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(f"tasks must be a dataset name, a file path (parquet, .jsonl, .json), a dict "
                         f"{{'path': ..., 'dataset_format': ...}}, a list of task dicts or a callable returning "
                         f"one, got {type(source).__name__}")
    name = str(source)
    if name in DEFAULT_DATASETS and not os.path.exists(name):
        from rllib_spear.data import default_paths

        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test' for default datasets, got {split!r}")
        path = Path(default_paths()[f"{DEFAULT_DATASETS[name]}_{split}"])
        kind = kind or ("multi_answer_search" if name.startswith("multi_answer") else name)
    else:
        path = Path(name)
        if path.is_dir():
            path = _split_file(path, split)
        if not path.exists():
            if env is not None and source is env:
                raise _no_dataset(env)
            raise ValueError(f"{path}: no such file (and {name!r} is not one of {sorted(DEFAULT_DATASETS)})")
    rows, columns = _read_rows(path)
    return _validate_table(rows, str(path), kind, dataset_format, env_kind, columns)


def _validate_table(rows: list, src: str, kind: str | None, dataset_format: str | None, env_kind: str | None,
                    columns: list[str] | None = None) -> list[dict]:
    """Pick the kind and data format of ``rows`` (:func:`_choose`) and validate them; ``columns``
    given = a file's table."""
    from_file = columns is not None
    columns = _columns(rows) if columns is None else columns
    kind, fmt = _choose(rows, columns, src, kind, dataset_format, env_kind, from_file=from_file)
    return validate_tasks(rows, kind, src, dataset_format=fmt)
