"""Search environments: ``search_qa`` (Search-R1 style single answer) and ``multi_answer_search``
(SPADER / QAMPARI style answer sets).

Both run the same search tool (BM25 over the embedded fictional corpus by default, or any parquet
corpus, or an HTTP ``/retrieve`` server), with ``top_k`` passages per query and the combined
output of one call cut to ``max_chars`` round-robin by rank (docs/algorithms.md 3.4).

search_qa (default parser ``search_r1``): reward on the answer step = EM of the ``<answer>``
against ``golden_answers`` after standard normalisation (``reward="em"``, Search-R1), or token F1
(``reward="f1"``); no format reward. A turn with neither a search nor an answer gets an error
observation and the episode goes on. Stats add ``em``, ``f1``.

multi_answer_search (default parser ``spader``; ``hermes`` and ``search_r1``, one query per turn,
also work): reward on the answer step =
``final_weight * F1`` (alias-aware set F1 of the JSON list in the last ``<answer>``), or
``format_error_reward`` (0 as released; -1 as in the paper figure) when any turn has bad
``<think>`` nesting or the answer is missing / not a JSON list of strings. The per-step diversity
reward and the tool cost are computed by SPADER from the stats: ``found_entities_per_step``
(indices into ``dedupe_gold_entities(answers)`` of every gold entity whose normalised alias is a
substring (``entity_match="substring"``, docs/algorithms.md 3.2) or whole-word match
(``entity_match="word"``) of that step's normalised tool output; the answer step gets ``[]``),
``queries_per_step`` and ``num_gold_entities``. Stats add ``precision``, ``recall``, ``f1``.

A step at ``max_turns`` that is not an answer ends the episode without running its tool (no
observation; reward as for a missing answer).

``prompt_source`` (both envs): ``"env"`` (default) opens an episode with the env's system prompt and
``Question: <question>``; ``"dataset"`` opens it with the task's own ``prompt`` chat messages
unchanged (Search-R1's parquet carries its instruction there; docs/data_formats.md), no system
prompt added; a task without a well-formed ``prompt`` is a ``ValueError`` naming the column.
"""
from __future__ import annotations

import re
from typing import Any

from rllib_spear.core.answers import (
    dedupe_gold_entities,
    exact_match,
    normalize_answer,
    set_precision_recall_f1,
    token_f1,
)
from rllib_spear.core.episode import EpisodeStats
from rllib_spear.envs.base import StepResult, ToolEnv
from rllib_spear.envs.formats import dataset_prompt
from rllib_spear.envs.parsers import (
    MAX_CALLS_PER_TURN,
    MAX_QUERIES_PER_CALL,
    begin_turn,
    clip,
    get_parser,
    ParsedTurn,
    parse_json_list_of_strings,
)
from rllib_spear.envs.retrieval import format_search_results, get_retriever

_TAG = re.compile(r"</?[A-Za-z_]+>")  # one quantifier, runs start after "<": linear
# Queries are echoed in result headers / the JSON skeleton cut to this prefix.
ECHO_QUERY_CHARS = 100
# Room outside ``max_chars`` for the wrapping tags, the truncation note and parser notes: an
# observation is never longer than ``max_chars + OBS_SLACK_CHARS`` (``obs_budget``).
OBS_SLACK_CHARS = 1024
# Room past a call's ``max_chars`` for the retrieval truncation note.
_NOTE_ROOM = 100

__all__ = ["SearchQAEnv", "MultiAnswerSearchEnv", "SEARCH_PROMPTS", "MULTI_PROMPTS", "PROMPT_SOURCES"]

# Where an episode's opening messages come from (env_config ``prompt_source``).
PROMPT_SOURCES = ("env", "dataset")

SEARCH_PROMPTS = {
    "search_r1": (
        "Answer the question. Think inside <think>...</think>. To search, write <search>query</search>; "
        "results come back in <information>...</information>. Search as often as needed, then give "
        "the final answer in a few words as <answer>answer</answer>."
    ),
    "hermes": (
        "Answer the question. Think inside <think>...</think>. To search, write "
        '<tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>; results come back in '
        "<tool_response>...</tool_response>. Then give the final answer in a few words as <answer>answer</answer>."
    ),
    "spader": (
        "Answer the question. Think inside <think>...</think>. To search, write "
        '<tool_call>["query1", "query2"]</tool_call>; results come back in <tool_response>...</tool_response>. '
        "Then give the final answer as <answer>answer</answer>."
    ),
}

MULTI_PROMPTS = {
    # Search-R1's call format with a list answer: one query per turn. The embedded default policy
    # learnt to search in exactly this format on search_qa, so a cold start for this task can
    # build on it (the JSON-list call formats are new to it).
    "search_r1": (
        "Answer the question. Think inside <think>...</think>. To search, write <search>query</search>; "
        "results come back in <information>...</information>. Search as often as needed, then give "
        'every answer as a JSON list of strings: <answer>["Entity A", "Entity B"]</answer>.'
    ),
    "spader": (
        "Answer the question. Every turn: first reason inside <think>...</think>, then either search with "
        '<tool_call>["query1", "query2"]</tool_call> (top-{top_k} passages per query come back in '
        '<tool_response>...</tool_response>) or answer with <answer>["Entity A", "Entity B"]</answer>. '
        "Both must be a JSON list of strings."
    ),
    "hermes": (
        "Answer the question. Every turn: first reason inside <think>...</think>, then either search with "
        '<tool_call>{{"name": "search", "arguments": {{"query_list": ["q1", "q2"]}}}}</tool_call> (results '
        'come back in <tool_response>...</tool_response>) or answer with <answer>["Entity A", "Entity B"]</answer>.'
    ),
}


class _SearchEnvBase(ToolEnv):
    default_parser = "search_r1"

    def __init__(self, *, parser: str | None = None, top_k: int = 3, max_chars: int | None = 10_000,
                 result_format: str = "text", corpus_path: str | None = None, retriever_url: str | None = None,
                 retriever_kwargs: dict | None = None, retriever=None, max_turns: int = 4,
                 system_prompt: str | None = None, max_queries_per_call: int = MAX_QUERIES_PER_CALL,
                 max_calls_per_turn: int = MAX_CALLS_PER_TURN, prompt_source: str = "env"):
        # "env": the env's system prompt + "Question: ..."; "dataset": the task's own chat messages
        # (its "prompt" column: Search-R1's instruction lives in that user message), nothing added.
        if prompt_source not in PROMPT_SOURCES:
            raise ValueError(f"prompt_source must be one of {PROMPT_SOURCES}, got {prompt_source!r}")
        self.prompt_source = prompt_source
        self.parser_name = parser or self.default_parser
        # any registered parser whose calls are searches (rllib_spear.envs.parsers.register_parser)
        self.parser = get_parser(self.parser_name, supported_calls=("search",), env_options={
            "tools": {"search": ("search", "query")}, "max_calls": max_calls_per_turn,
            "max_queries": max_queries_per_call})
        self.tag = self.parser.tag
        self.top_k = int(top_k)
        self.max_chars = max_chars
        self.result_format = result_format
        if result_format not in ("text", "json"):
            raise ValueError(f"result_format must be 'text' or 'json', got {result_format!r}")
        self.max_turns = int(max_turns)
        self._retriever = retriever
        self._retriever_args = (corpus_path, retriever_url, dict(retriever_kwargs or {}))
        self._system_prompt = system_prompt
        if not system_prompt:
            try:
                self._default_prompt()
            except KeyError:
                raise ValueError(f"parser {self.parser_name!r} has no built-in {type(self).__name__} prompt; "
                                 "pass system_prompt in env_config") from None
        self.done = True
        self._new_episode()

    @property
    def retriever(self):
        if self._retriever is None:
            path, url, kw = self._retriever_args
            self._retriever = get_retriever(path, url=url, **kw)
        return self._retriever

    @property
    def system_prompt(self) -> str:
        return self._system_prompt or self._default_prompt()

    def _default_prompt(self) -> str:
        return SEARCH_PROMPTS[self.parser_name]

    def _new_episode(self):
        self.turns = 0
        self.tool_calls = 0
        self.queries_per_step: list[int] = []
        self.observations: list[str | None] = []
        self.format_errors: list[str] = []
        self.has_answer = False
        self.answer: str | None = None
        self.outcome = 0.0
        self.truncated = False

    def reset(self, task: dict[str, Any]) -> list[dict[str, str]]:
        self._new_episode()
        self.task = task
        self.done = False
        if self.prompt_source == "dataset":
            return dataset_prompt(task)
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": f"Question: {task['question']}"}]

    # -- tool ----------------------------------------------------------------------------------
    def _wrap(self, text: str) -> str:
        return f"<{self.tag}>{text}</{self.tag}>"

    @property
    def obs_budget(self) -> int | None:
        """Most characters of one observation (all calls, tags, notes and echoes included)."""
        return None if not self.max_chars or self.max_chars <= 0 else self.max_chars + OBS_SLACK_CHARS

    def _run_search(self, queries: list[str], max_chars: int | None = None) -> str:
        max_chars = self.max_chars if max_chars is None else max_chars
        try:
            results = self.retriever.batch_search(queries, self.top_k)
        except Exception as e:  # noqa: BLE001 - a failing retriever is an error observation
            return f"Error: search failed: {type(e).__name__}: {str(e)[:200]}"
        shown = [q[:ECHO_QUERY_CHARS] for q in queries]  # headers / JSON skeleton echo a prefix
        out = format_search_results(shown, results, max_chars, self.result_format)
        return out if not max_chars or max_chars <= 0 else clip(out, max_chars + _NOTE_ROOM)

    def _execute(self, parsed: ParsedTurn) -> str:
        parts = []
        calls = parsed.calls[: max(1, getattr(self.parser, "max_calls", 1))]
        # parallel calls share the budget, so the whole observation stays within it
        per_call = None if self.obs_budget is None else max(1, self.max_chars // len(calls))
        for call in calls:
            if call.error:
                parts.append(self._wrap(clip(f"Error: {call.error}", per_call)))
            else:
                parts.append(self._wrap(self._run_search(call.arguments["queries"], per_call)))
        obs = "\n".join(parts)
        if parsed.notes:
            note = clip("\nNote: " + "; ".join(parsed.notes), OBS_SLACK_CHARS // 4)
            obs = obs[: -len(f"</{self.tag}>")] + note + f"</{self.tag}>"
        return self._bound(obs)

    def _bound(self, obs: str) -> str:
        """Safety net: an observation over ``obs_budget`` is cut, keeping its closing tag."""
        budget = self.obs_budget
        if budget is None or len(obs) <= budget:
            return obs
        close = f"</{self.tag}>"
        return clip(obs[: -len(close)], budget - len(close)) + close

    # -- episode -------------------------------------------------------------------------------
    def step(self, assistant_text: str) -> StepResult:
        turn = begin_turn(self, assistant_text)
        if turn is None:
            return StepResult(None, 0.0, True, {"error": "episode is over; call reset()"})
        assistant_text, parsed = turn
        info: dict[str, Any] = {"action": parsed.kind}
        if parsed.kind == "answer":
            self.queries_per_step.append(0)
            self.observations.append(None)
            self.done = True
            reward = self._final(parsed.answer, info)
            self.outcome = reward
            return StepResult(None, reward, True, info)
        self.queries_per_step.append(parsed.num_queries)
        if self.turns >= self.max_turns:
            self.observations.append(None)
            self.done = self.truncated = True
            info["truncated"] = True
            reward = self._final(None, info)
            self.outcome = reward
            return StepResult(None, reward, True, info)
        if parsed.kind == "tool":
            self.tool_calls += 1
            obs = self._execute(parsed)
        else:
            self.format_errors.append(f"turn {self.turns}: {parsed.error}")
            obs = self._bound(self._wrap(f"Error: {clip(parsed.error, self.max_chars or None)}. Let me try again."))
            info["error"] = parsed.error
        self.observations.append(obs)
        self._on_observation(obs, info)
        return StepResult(obs, 0.0, False, info)

    def _on_observation(self, obs: str, info: dict) -> None:
        pass

    def _final(self, answer: str | None, info: dict) -> float:
        raise NotImplementedError

    def _base_stats(self) -> dict[str, Any]:
        return {
            "tool_calls": self.tool_calls,
            "queries_per_step": list(self.queries_per_step),
            "format_ok": not self.format_errors and self.has_answer,
            "has_answer": self.has_answer,
            "outcome_reward": self.outcome,
            "turns": self.turns,
            "truncated": self.truncated,
            "format_errors": list(self.format_errors),
        }


class SearchQAEnv(_SearchEnvBase):
    """Search-R1 style QA (see module docstring). Task keys: ``question``, ``golden_answers``."""

    default_parser = "search_r1"

    def __init__(self, *, reward: str = "em", **kwargs):
        if reward not in ("em", "f1"):
            raise ValueError(f"reward must be 'em' or 'f1', got {reward!r}")
        self.reward_kind = reward
        super().__init__(**kwargs)

    def _new_episode(self):
        super()._new_episode()
        self.em = 0.0
        self.f1 = 0.0

    def _final(self, answer, info):
        golds = list(self.task.get("golden_answers") or [])
        if answer is None:
            info["error"] = info.get("error") or "no <answer>"
            return 0.0
        self.has_answer = True
        self.answer = answer
        self.em = exact_match(answer, golds)
        self.f1 = token_f1(answer, golds)
        info.update(em=self.em, f1=self.f1)
        return self.em if self.reward_kind == "em" else self.f1

    def episode_stats(self) -> EpisodeStats:
        s = self._base_stats()
        s.update(success=self.em == 1.0, em=self.em, f1=self.f1, answer=self.answer)
        return EpisodeStats.coerce(s, type(self).__name__)


class MultiAnswerSearchEnv(_SearchEnvBase):
    """SPADER multi-answer search (see module docstring). Task keys: ``question``, ``answers``
    (list of alias lists)."""

    default_parser = "spader"

    def __init__(self, *, top_k: int = 5, max_turns: int = 6, final_weight: float = 1.0,
                 format_error_reward: float = 0.0, entity_match: str = "substring", **kwargs):
        if entity_match not in ("substring", "word"):
            raise ValueError(f"entity_match must be 'substring' or 'word', got {entity_match!r}")
        self.final_weight = final_weight
        self.format_error_reward = format_error_reward
        self.entity_match = entity_match
        super().__init__(top_k=top_k, max_turns=max_turns, **kwargs)

    def _default_prompt(self) -> str:
        return MULTI_PROMPTS[self.parser_name].format(top_k=self.top_k)

    def _new_episode(self):
        super()._new_episode()
        self.gold: list[frozenset[str]] = []
        self.found_per_step: list[list[int]] = []
        self.precision = self.recall = self.f1 = 0.0
        self.predictions: list[str] | None = None

    def reset(self, task):
        msgs = super().reset(task)
        self.gold = dedupe_gold_entities(task.get("answers") or [])
        return msgs

    def _found(self, text: str) -> list[int]:
        norm = normalize_answer(_TAG.sub(" ", text))  # tags become spaces: no word glued to a tag
        if self.entity_match == "word":
            norm = f" {norm} "
            return [i for i, e in enumerate(self.gold) if any(f" {a} " in norm for a in e)]
        return [i for i, e in enumerate(self.gold) if any(a in norm for a in e)]

    def _on_observation(self, obs, info):
        found = self._found(obs) if info.get("action") == "tool" else []
        self.found_per_step.append(found)
        info["found_entities"] = found

    def _final(self, answer, info):
        self.found_per_step.append([])
        err = None
        preds = None
        if answer is None:
            err = "missing <answer>...</answer>"
        else:
            self.has_answer = True
            preds, perr = parse_json_list_of_strings(answer)
            if preds is None:
                err = f"answer is {perr}"
        if err:
            self.format_errors.append(f"turn {self.turns}: {err}")
            info["error"] = err
        self.predictions = preds
        if preds is not None:
            self.precision, self.recall, self.f1 = set_precision_recall_f1(preds, self.task.get("answers") or [])
        info.update(precision=self.precision, recall=self.recall, f1=self.f1)
        if self.format_errors:
            return float(self.format_error_reward)
        return self.final_weight * self.f1

    def episode_stats(self) -> EpisodeStats:
        s = self._base_stats()
        s["format_ok"] = not self.format_errors and self.predictions is not None
        s.update(success=self.f1 == 1.0, precision=self.precision, recall=self.recall, f1=self.f1,
                 found_entities_per_step=[list(x) for x in self.found_per_step],
                 num_gold_entities=len(self.gold), predictions=self.predictions)
        return EpisodeStats.coerce(s, type(self).__name__)
