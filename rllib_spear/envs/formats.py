"""Data formats: the released data files of the papers, read as our task schema.

A format maps one row of an upstream file (a Search-R1 parquet, DAPO-Math-17k, AIME, QAMPARI
JSONL, ...) to a task dict of one task ``kind`` (:mod:`rllib_spear.envs.loaders` lists the kinds
and their keys). The loader picks the format from the file's columns (``detect``), or takes the
one named by ``dataset_format=`` / ``kind=``, converts every row (``convert``), then runs the
kind's own validation. Extra columns are kept as they are.

Built-ins (docs/data_formats.md has the table with the upstream sources):

============ ============== ==========================================================================
name         kind           detected by
============ ============== ==========================================================================
search_r1    search_qa      ``reward_model.ground_truth`` is a dict with ``target`` (Search-R1
                            ``scripts/data_process/nq_search.py`` / ``qa_search_test_merge.py``)
dapo_math    code_math      ``prompt`` and ``reward_model`` columns with a scalar ``ground_truth``
                            (BytedTsinghua-SIA/DAPO-Math-17k)
aime24       code_math      ``Problem`` and ``Answer`` columns (Maxwell-Jia/AIME_2024)
aime25       code_math      ``problem`` and ``answer`` columns, no ``prompt`` (yentinglin/aime_2025)
qampari      multi_answer   ``question_text`` and ``answer_list`` columns (samsam3232/qampari JSONL)
             _search
============ ============== ==========================================================================

Add one with ``register_format(name, detect, convert, kind=...)``: ``detect(columns, first_row)
-> bool`` sees the column names and the first row; ``convert(row) -> dict`` gets a copy of one
row and returns the task (raise :class:`RowError` ``(column, message)`` for a bad value: the
loader adds the file and the row number).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from rllib_spear.registry import Registry

__all__ = ["DataFormat", "RowError", "register_format", "get_format", "format_names", "detect_formats",
           "chat_messages", "dataset_prompt", "dapo_problem", "DAPO_INSTRUCTION", "DAPO_REMINDER"]

CHAT_ROLES = ("system", "user", "assistant")

# The DAPO-Math-17k user message is DAPO_INSTRUCTION + problem + DAPO_REMINDER (the released
# parquet; the same text is the "open-r1" template of several eval harnesses).
DAPO_INSTRUCTION = ("Solve the following math problem step by step. The last line of your response should be "
                    "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
DAPO_REMINDER = '\n\nRemember to put your answer on its own line after "Answer:".'


class RowError(ValueError):
    """A bad value in one row: ``column`` and what is wrong (the loader names file and row)."""

    def __init__(self, column: str, message: str):
        super().__init__(message)
        self.column = column
        self.message = message


@dataclass(frozen=True)
class DataFormat:
    """One data format: rows of ``kind`` tasks, recognised by ``detect``, mapped by ``convert``."""

    name: str
    kind: str
    detect: Callable[[Sequence[str], Mapping[str, Any]], bool]
    convert: Callable[[dict], dict]


FORMATS: Registry[DataFormat] = Registry("data format", register_hint="rllib_spear.envs.formats.register_format")


def register_format(name: str, detect: Callable[[Sequence[str], Mapping[str, Any]], bool],
                    convert: Callable[[dict], dict], *, kind: str, override: bool = False) -> DataFormat:
    """Register a data format (see module docstring) and return it."""
    from rllib_spear.envs.loaders import CHECKS

    if kind not in CHECKS:
        raise ValueError(f"register_format({name!r}): unknown task kind {kind!r}; choose from {sorted(CHECKS)}")
    fmt = DataFormat(name, kind, detect, convert)
    FORMATS.register(name, fmt, override=override)
    return fmt


def get_format(name: str) -> DataFormat:
    """The format registered under ``name`` (``ValueError`` naming the choices otherwise)."""
    return FORMATS.get(name)


def format_names() -> list[str]:
    """Registered format names, sorted."""
    return FORMATS.names()


def detect_formats(columns: Sequence[str], first_row: Mapping[str, Any]) -> list[DataFormat]:
    """Every registered format whose ``detect`` accepts the table, in registration order."""
    found = []
    for fmt in FORMATS.view().values():
        try:
            ok = bool(fmt.detect(list(columns), first_row))
        except Exception:  # noqa: BLE001 - a detector that trips on an odd row simply does not match
            ok = False
        if ok:
            found.append(fmt)
    return found


# ----------------------------------------------------------------------------- shared helpers
def _text(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def chat_messages(value: Any, column: str = "prompt") -> list[dict[str, str]]:
    """``value`` as chat messages: a list of ``{"role", "content"}`` dicts (roles system / user /
    assistant, non-empty string contents; other keys dropped), or a non-empty string (one user
    message). Fresh dicts, so callers may change them. ``RowError(column, ...)`` otherwise."""
    if _text(value):
        return [{"role": "user", "content": value}]
    how = (f"expected a chat list [{{'role': 'user', 'content': '...'}}] (roles {list(CHAT_ROLES)}) or a "
           f"non-empty string")
    if not isinstance(value, (list, tuple)) or not value:
        raise RowError(column, f"{how}, got {value!r:.200}")
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, Mapping) or m.get("role") not in CHAT_ROLES or not _text(m.get("content")):
            raise RowError(column, f"message {j}: {how}, got {m!r:.200}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def dataset_prompt(task: Mapping[str, Any]) -> list[dict[str, str]]:
    """The episode's opening messages taken from the task's ``prompt`` column (search envs with
    ``prompt_source="dataset"``); ``ValueError`` naming the column when it is missing or
    ill-formed."""
    who = f"task {task.get('uid', '?')!s}"
    fix = ("give each task a 'prompt' chat list (as in Search-R1's parquet files), or set "
           "env_config prompt_source='env' to let the env write the prompt")
    if task.get("prompt") is None:
        raise ValueError(f"{who}: prompt_source='dataset' reads the task's 'prompt' column, and it has none: {fix}")
    try:
        return chat_messages(task["prompt"])
    except RowError as e:
        raise ValueError(f"{who}: prompt_source='dataset', column 'prompt': {e.message}; {fix}") from None


def _last_user(messages: list[dict[str, str]], column: str) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    if not users:
        raise RowError(column, "the chat list has no user message")
    return users[-1]


def dapo_problem(text: str) -> str:
    """The bare problem of a DAPO-Math-17k user message: ``text`` without the DAPO instruction in
    front and the "Remember to put your answer ..." reminder at the end; ``text`` (stripped) when
    it is not in that template."""
    body = text.strip()
    head, tail = DAPO_INSTRUCTION.strip(), DAPO_REMINDER.strip()
    if body.startswith(head):
        body = body[len(head):]
    if body.endswith(tail):
        body = body[: -len(tail)]
    return body.strip() or text.strip()


def _ground_truth(row: Mapping[str, Any]) -> Any:
    rm = row.get("reward_model")
    return rm.get("ground_truth") if isinstance(rm, Mapping) else None


def _ext_index(row: Mapping[str, Any]) -> Any:
    info = row.get("extra_info")
    return info.get("index") if isinstance(info, Mapping) else None


# ----------------------------------------------------------------------------- search_r1
_QUESTION_MARK = "Question: "


def _detect_search_r1(cols: Sequence[str], first: Mapping[str, Any]) -> bool:
    gt = _ground_truth(first)
    return isinstance(gt, Mapping) and "target" in gt


def _convert_search_r1(row: dict) -> dict:
    """Search-R1 rows: ``question`` (or, without it, the text after the last "Question: " of the
    prompt's user message, as ``make_prefix`` writes it), ``golden_answers`` (or
    ``reward_model.ground_truth.target``), ``data_source``; ``prompt`` checked and kept as chat
    messages for ``prompt_source="dataset"``."""
    if row.get("prompt") is not None:
        row["prompt"] = chat_messages(row["prompt"])
    if not _text(row.get("question")) and row.get("prompt") is not None:
        user = _last_user(row["prompt"], "prompt")
        if _QUESTION_MARK in user:
            row["question"] = user.rsplit(_QUESTION_MARK, 1)[1].strip()
    if row.get("golden_answers") is None:
        target = _ground_truth(row).get("target")
        row["golden_answers"] = list(target) if isinstance(target, (list, tuple)) else target
    return row


# ----------------------------------------------------------------------------- dapo_math
def _detect_dapo(cols: Sequence[str], first: Mapping[str, Any]) -> bool:
    gt = _ground_truth(first)
    return "prompt" in cols and (isinstance(gt, (str, int, float)) and not isinstance(gt, bool))


def _convert_dapo(row: dict) -> dict:
    """DAPO-Math-17k rows: ``prompt`` (the user message, DAPO instruction included, as released),
    ``problem`` (the bare problem, :func:`dapo_problem`), ``answer`` (``reward_model.ground_truth``),
    uid from ``extra_info.index``."""
    messages = chat_messages(row.get("prompt"))
    row["problem"] = dapo_problem(_last_user(messages, "prompt"))
    if row.get("answer") is None:
        row["answer"] = _ground_truth(row)
    index = _ext_index(row)
    if row.get("uid") is None and row.get("id") is None and index is not None:
        row["uid"] = str(index)
    return row


# ----------------------------------------------------------------------------- aime24 / aime25
def _math_task(row: dict, problem_col: str, answer_col: str, id_col: str, default_source: str) -> dict:
    problem, answer = row.get(problem_col), row.get(answer_col)
    if not _text(problem):
        raise RowError(problem_col, f"expected the problem text (a non-empty string), got {problem!r:.200}")
    if isinstance(answer, bool) or not (isinstance(answer, (int, float)) or _text(answer)):
        raise RowError(answer_col, f"expected the answer (a number or a non-empty string), got {answer!r:.200}")
    row["problem"] = problem.strip()
    row["prompt"] = row["problem"]
    row["answer"] = str(answer).strip()
    if row.get("uid") is None and row.get(id_col) is not None:
        row["uid"] = str(row[id_col])
    row.setdefault("data_source", default_source)
    return row


def _detect_aime24(cols: Sequence[str], first: Mapping[str, Any]) -> bool:
    return "Problem" in cols and "Answer" in cols


def _convert_aime24(row: dict) -> dict:
    """Maxwell-Jia/AIME_2024 rows (``ID``, ``Problem``, ``Solution``, ``Answer`` int)."""
    return _math_task(row, "Problem", "Answer", "ID", "aime_2024")


def _detect_aime25(cols: Sequence[str], first: Mapping[str, Any]) -> bool:
    return "problem" in cols and "answer" in cols and "prompt" not in cols and "reward_model" not in cols


def _convert_aime25(row: dict) -> dict:
    """yentinglin/aime_2025-style rows (``id``, ``problem``, ``answer``, maybe ``solution``,
    ``url``, ``year``); ``data_source`` ``aime_<year>`` from a 4-digit ``year`` column, else
    ``aime_2025``."""
    year = str(row.get("year") or "").strip()
    return _math_task(row, "problem", "answer", "id", f"aime_{year}" if len(year) == 4 and year.isdigit()
                      else "aime_2025")


# ----------------------------------------------------------------------------- qampari
def _detect_qampari(cols: Sequence[str], first: Mapping[str, Any]) -> bool:
    return "question_text" in cols and "answer_list" in cols


def _convert_qampari(row: dict) -> dict:
    """QAMPARI rows: ``question`` from ``question_text``, ``answers`` = one alias list
    ``[answer_text, *aliases]`` per ``answer_list`` entry (repeats and blanks dropped, order
    kept), uid from ``qid``."""
    if not _text(row.get("question_text")):
        raise RowError("question_text", f"expected a non-empty string, got {row.get('question_text')!r:.200}")
    row["question"] = row["question_text"].strip()
    entries = row.get("answer_list")
    if not isinstance(entries, (list, tuple)) or not entries:
        raise RowError("answer_list", f"expected a non-empty list of answers, got {entries!r:.200}")
    answers = []
    for j, e in enumerate(entries):
        if not isinstance(e, Mapping) or not _text(e.get("answer_text")):
            raise RowError("answer_list", f"answer {j}: expected a dict with a non-empty 'answer_text', got {e!r:.200}")
        aliases = e.get("aliases") or []
        if not isinstance(aliases, (list, tuple)) or not all(isinstance(a, str) for a in aliases):
            raise RowError("answer_list", f"answer {j}: 'aliases' must be a list of strings, got {aliases!r:.200}")
        names = [n.strip() for n in (e["answer_text"], *aliases) if n.strip()]
        answers.append(list(dict.fromkeys(names)))
    row["answers"] = answers
    if row.get("uid") is None and row.get("qid") is not None:
        row["uid"] = str(row["qid"])
    row.setdefault("data_source", "qampari")
    return row


# Registration order is detection order; the detectors are disjoint, so it only orders messages.
for _name, _kind, _detect, _convert in (
    ("search_r1", "search_qa", _detect_search_r1, _convert_search_r1),
    ("dapo_math", "code_math", _detect_dapo, _convert_dapo),
    ("aime24", "code_math", _detect_aime24, _convert_aime24),
    ("aime25", "code_math", _detect_aime25, _convert_aime25),
    ("qampari", "multi_answer_search", _detect_qampari, _convert_qampari),
):
    FORMATS.register(_name, DataFormat(_name, _kind, _detect, _convert))
