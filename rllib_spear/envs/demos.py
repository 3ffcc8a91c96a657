"""Scripted demonstrations for the cold-start SFT.

:func:`scripted_demonstrations` plays the real environments with a scripted policy and returns full
chat conversations (the env's system/user messages, the assistant turns, and each tool observation
as a user message exactly as ``env.step`` returned it). Per task, with probability
``tool_use_rate`` the demo uses the tool correctly and answers from what it retrieved/computed;
otherwise it answers directly with a guess drawn from the pool of answers of the same type (right
only by chance). Text games: with probability ``tool_use_rate`` the demo follows the solver's plan
to success (or, ``game_player="explorer"``, explores what it sees until it wins or runs out of
turns); otherwise it takes up to 3 random admissible actions (the conversation then ends
unfinished). Assistant turns are short and use the exact formats of the env's parser.
"""
from __future__ import annotations

import hashlib
import json
import random
import re
from typing import Any

__all__ = ["scripted_demonstrations", "DEMOS_VERSION", "GAME_PLAYERS"]

#: The scripted players of a text-game demonstration (``scripted_demonstrations(game_player=)``).
GAME_PLAYERS = ("solver", "explorer")

#: Part of the name of every cold-start build (``rllib_spear.coldstart.recipes.recipe_key``): bump it
#: whenever a change here (or in the envs' observations) changes the conversations for the same
#: inputs, and re-ship the builds (``python -m rllib_spear.coldstart``). The freshness tests in
#: tests/models/test_default_policy.py fail until both are done.
DEMOS_VERSION = 1


def _rng(seed: int, uid: str) -> random.Random:
    return random.Random(int(hashlib.sha1(f"{seed}|{uid}".encode()).hexdigest()[:12], 16))


def _search_call(parser: str, queries: list[str]) -> str:
    if parser == "search_r1":
        return f"<search>{queries[0]}</search>"
    if parser == "hermes":
        if len(queries) == 1:
            return '<tool_call>{"name": "search", "arguments": {"query": %s}}</tool_call>' % json.dumps(queries[0])
        return '<tool_call>{"name": "search", "arguments": {"query_list": %s}}</tool_call>' % json.dumps(queries)
    return f"<tool_call>{json.dumps(queries)}</tool_call>"


def _play(env, task, turns_fn) -> list[dict[str, str]]:
    """Run ``turns_fn(env, observations)``'s assistant turns through ``env``; the generator sees
    each tool observation (appended to ``observations``) before it yields the next turn."""
    msgs = list(env.reset(task))
    observations: list[str] = []
    for text in turns_fn(env, observations):
        msgs.append({"role": "assistant", "content": text})
        res = env.step(text)
        if res.observation is not None:
            msgs.append({"role": "user", "content": res.observation})
            observations.append(res.observation)
        if res.done:
            break
    return msgs


_DOC_LINE = re.compile(r"Doc \d+\(Title: [^)]*\) (.*)")


def evidence_sentence(observation: str, needle: str, entity: str = "") -> str | None:
    """The first sentence of a retrieved passage (in rank order) that contains ``needle``,
    preferring one that also names ``entity``, cut right after ``needle`` (so that what the next
    step needs is the last thing quoted); None if no sentence contains it."""
    sentences = [x.strip() for m in _DOC_LINE.finditer(observation) for x in m.group(1).split(". ") if x.strip()]
    hits = [x for x in sentences if needle in x]
    best = [x for x in hits if entity and entity in x]
    chosen = (best or hits or [None])[0]
    if chosen is None:
        return None
    return chosen[: chosen.index(needle) + len(needle)] + "."


def _demo_search_qa(env, task, rng, use_tool, pools, think="plain"):
    gold = task["golden_answers"][0]
    parser = env.parser_name

    def turns(env, observations):
        if use_tool:
            queries = (task.get("queries") or [task["question"]])[: env.max_turns - 1]
            for k, q in enumerate(queries):
                # "evidence": quote the sentence that leads to the next step (the next query, then
                # the answer), so the answer is copied from text the model has just written.
                ev = evidence_sentence(observations[-1], q, queries[k - 1]) if think == "evidence" and k else None
                yield f"<think>{ev or f'I will search for {q}.'}</think>\n{_search_call(parser, [q])}"
            ev = evidence_sentence(observations[-1], gold, queries[-1]) if think == "evidence" and observations else None
            yield f"<think>{ev or 'The results give the answer.'}</think>\n<answer>{gold}</answer>"
        else:
            pool = pools.get(task.get("answer_type")) or [gold]
            yield f"<think>I will answer directly.</think>\n<answer>{rng.choice(pool)}</answer>"

    return _play(env, task, turns)


def _demo_multi(env, task, rng, use_tool, pools, think="plain"):
    parser = env.parser_name

    def first_alias(i):
        ent = task["answers"][i]
        return ent if isinstance(ent, str) else ent[0]

    def turns(env, observations):
        if use_tool:
            queries = list(task.get("queries") or [task["question"]])
            if parser == "search_r1":  # one query per turn
                batches = [[q] for q in queries]
            else:
                batches = [queries[:1]] + [queries[i : i + 2] for i in range(1, len(queries), 2)]
            found: set[int] = set()
            gold = env.gold
            for b in batches[: max(1, min(3, env.max_turns - 1))]:
                think = f"I will search for {b[0]}." if parser == "search_r1" else "I will search."
                yield f"<think>{think}</think>\n{_search_call(parser, b)}"
                for step in env.episode_stats().found_entities_per_step:
                    found.update(step)
                if len(found) >= len(gold):
                    break
            # answer every gold entity the searches surfaced, in the order they first appear in the
            # results and spelt as there: the answer is then a copy in reading order (a list in gold
            # order asks a small model to sort while it copies, and it learnt neither)
            text = "\n".join(observations).lower()
            hits = []
            for i, ent in enumerate(task["answers"]):
                norm = _norm_set(ent)
                k = next((j for j, g in enumerate(gold) if g == norm), None)
                if k is None or k not in found:
                    continue
                aliases = [ent] if isinstance(ent, str) else list(ent)
                spots = [(text.find(a.lower()), a) for a in aliases if a and text.find(a.lower()) >= 0]
                hits.append(spots[0] if spots else (len(text), first_alias(i)))
            names = [a for _, a in sorted(hits, key=lambda h: h[0])]
            yield f"<think>I found {len(names)} answers.</think>\n<answer>{json.dumps(names)}</answer>"
        else:
            pool = pools.get(task.get("answer_type")) or [first_alias(0)]
            guess = rng.sample(pool, min(3, len(pool)))
            yield f"<think>I will answer directly.</think>\n<answer>{json.dumps(guess)}</answer>"

    return _play(env, task, turns)


def _norm_set(ent) -> frozenset:
    from rllib_spear.core.answers import normalize_answer

    aliases = [ent] if isinstance(ent, str) else ent
    return frozenset(a for a in (normalize_answer(x) for x in aliases) if a)


def _demo_math(env, task, rng, use_tool, pools, think="plain"):
    gold = str(task["answer"])
    expr = task.get("expression")
    if not expr:
        m = re.search(r"What is (.+?)\?", task["prompt"])
        expr = m.group(1) if m else None

    def turns(env, observations):
        if use_tool and expr:
            code = f"print({expr})"
            if env.parser_name == "code":
                call = f"<code>\n```python\n{code}\n```\n</code>"
            else:
                call = '<tool_call>{"name": "code_interpreter", "arguments": {"code": %s}}</tool_call>' % json.dumps(code)
            yield f"<think>I will compute it with Python.</think>\n{call}"
            yield f"<think>The output is the result.</think>\nThe answer is \\boxed{{{gold}}}."
        else:
            guess = gold
            if gold.lstrip("-").isdigit() and rng.random() > 0.05:
                g = int(gold)
                span = max(1, 10 ** max(0, len(gold.lstrip("-")) - 3))
                guess = str(g + rng.choice([-1, 1]) * rng.randint(1, span))
            yield f"<think>I will estimate it.</think>\nThe answer is \\boxed{{{guess}}}."

    return _play(env, task, turns)


def _explore_game(env, task, rng):
    """The exploring player's (thought, action) turns: a reactive rule over what the observations
    show, so a policy that reads them can imitate it. Not holding the goal object: take it when a
    ``take`` action for it is admissible, else open a closed receptacle here, else go to a room not
    yet visited (any exit when all were). Holding it: put it in the goal receptacle when
    admissible, else open that receptacle, else go to its room (a receptacle always stands in the
    same room of the game's world, ``ROOMS``) when it is an exit, else move on as above. The
    thought names the phase and the goal's words ("I look for the sock.", "I carry the sock to
    the desk."), which the action then copies."""
    from rllib_spear.data.text_game_worlds import ROOMS

    goal = re.search(r"put the (\S+) in the (\S+?)\.", env.last_info.get("goal", "") + ".")
    if goal is None:
        raise ValueError(f"text game task {task.get('uid')!r}: no goal in the game's info")
    obj, rec = goal.groups()
    goal_room = next((room for room, recs in ROOMS.items() if rec in recs), None)
    visited: set[str] = set()
    holding = False
    while True:
        admissible = list(env.admissible)
        visited.add(env.last_info.get("room", ""))  # the room every description names
        exits = [a for a in admissible if a.startswith("go to ")]
        unvisited = [a for a in exits if a[len("go to "):] not in visited]
        move = (unvisited[0] if unvisited else rng.choice(exits)) if exits else "look"
        if holding:
            thought = f"I carry the {obj} to the {rec}."
            options = [f"put {obj} in {rec}", f"open {rec}", f"go to {goal_room}"]
        else:
            thought = f"I look for the {obj}."
            options = [a for a in admissible if a.startswith(f"take {obj} from ")]
            options += [a for a in admissible if a.startswith("open ")]
        action = next((a for a in options if a in admissible), move)
        if action.startswith("take "):
            holding, thought = True, f"The {obj} is here."
        elif action.startswith("put "):
            thought = f"I put the {obj} in the {rec}."
        yield thought, action


def _demo_game(env, task, rng, use_tool, pools, think="plain", player="solver"):
    from rllib_spear.data.text_game_worlds import generate_game
    from rllib_spear.envs.text_game import solve_game

    def turns(env, observations):
        if use_tool and player == "explorer":
            for thought, a in _explore_game(env, task, rng):
                yield f"<think>{thought}</think>\n<action>{a}</action>"
        elif use_tool:
            if "seed" in task:
                plan = solve_game(generate_game(int(task["seed"]), int(task.get("n_rooms", 3)),
                                                int(task.get("n_objects", 3))))
            else:
                plan = list(env.last_info.get("policy_commands") or [])
            for a in plan:
                yield f"<think>Next I {a}.</think>\n<action>{a}</action>"
        else:
            for _ in range(3):
                a = rng.choice(env.admissible) if env.admissible else "look"
                yield f"<think>I will try {a}.</think>\n<action>{a}</action>"

    return _play(env, task, turns)


_DEMOS = {
    "search_qa": _demo_search_qa,
    "multi_answer_search": _demo_multi,
    "code_math": _demo_math,
    "text_game": _demo_game,
    "textworld": _demo_game,
}


def _answer_pools(env_name: str, tasks: list[dict]) -> dict[str, list[str]]:
    pools: dict[str, set[str]] = {}
    for t in tasks:
        at = t.get("answer_type")
        if env_name == "search_qa":
            pools.setdefault(at, set()).update(t.get("golden_answers") or [])
        elif env_name == "multi_answer_search":
            for e in t.get("answers") or []:
                pools.setdefault(at, set()).add(e if isinstance(e, str) else e[0])
    return {k: sorted(v) for k, v in pools.items()}


def scripted_demonstrations(env_name: str, tasks: list[dict], *, tool_use_rate: float = 0.2, seed: int = 0,
                            env_config: dict[str, Any] | None = None, think: str = "plain",
                            game_player: str = "solver") -> list[list[dict[str, str]]]:
    """One conversation per task (see module docstring); deterministic in ``seed``.

    ``think="evidence"`` (search_qa): after a search, the ``<think>`` quotes the retrieved sentence
    that holds the next query or the answer instead of a fixed phrase. ``game_player`` (text
    games, with probability ``tool_use_rate``): "solver" follows the solver's plan, which walks
    straight to the hidden object; "explorer" (text_game) plays a rule that uses only what the
    observations show (opens receptacles, visits rooms until it sees the object), so a policy
    can learn it from the conversation."""
    if think not in ("plain", "evidence"):
        raise ValueError(f"think must be 'plain' or 'evidence', got {think!r}")
    if game_player not in GAME_PLAYERS:
        raise ValueError(f"game_player must be one of {GAME_PLAYERS}, got {game_player!r}")
    if game_player == "explorer" and env_name != "text_game":
        raise ValueError(f"game_player='explorer' plays the embedded text_game only, not {env_name!r}; "
                         "use game_player='solver' (the env's own walkthrough)")
    from rllib_spear.envs import make_env

    if env_name not in _DEMOS:
        raise ValueError(f"no scripted policy for {env_name!r}; choose from {sorted(_DEMOS)}")
    env = make_env(env_name, **(env_config or {}))
    pools = _answer_pools(env_name, tasks)
    out = []
    for i, task in enumerate(tasks):
        rng = _rng(seed, str(task.get("uid", i)))
        use_tool = rng.random() < tool_use_rate
        extra = {"player": game_player} if env_name in ("text_game", "textworld") else {}
        out.append(_DEMOS[env_name](env, task, rng, use_tool, pools, think=think, **extra))
    return out
