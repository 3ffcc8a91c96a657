"""Synthetic tool-calling episodes: random tools, a request, a Hermes call, its result, the answer.

What the SmolLM2 tool-use cold start (``coldstart.smollm2_tools``) trains on, so that an instruct
model calls the tools of an environment it has never seen from their schemas alone. Each episode
is *played* on a :class:`~rllib_spear.envs.function_tools.FunctionToolEnv` built from generated
Python functions (a name, a Google-style docstring, typed parameters, a body), so the system
prompt, the tool schemas, the ``<tool_response>`` observations and the reward are exactly the ones
a user's ``FunctionToolEnv`` gives during RL; an episode is kept only if its scripted answer
scores 1.0. A conversation is::

    system     the environment's tools prompt (1-4 tool schemas, the target among distractors)
    user       the request
    assistant  <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>
    user       <tool_response>\\n...\\n</tool_response>      (the rollout's observation turn)
    [assistant, user: a second call and its result, in chained episodes]
    assistant  <answer>...</answer>

Families of tools: record lookups (a table of fictional entities, the answer one field), two-number
arithmetic, unit conversion, text operations and yes/no checks, plus chained lookups (one record
names the key of the next). Every catalogue (entity kinds, tool-name patterns, parameter names,
descriptions, request templates) is split in two by position (:func:`_part`): ``split="train"``
builds from one part, ``split="heldout"`` from the other, so held-out episodes have tool names,
descriptions, parameters and requests the cold start never saw.

    episodes = synthetic_tool_episodes(128, seed=0)            # [SyntheticEpisode]
    convs = [e.conversation for e in episodes]
    env = episodes[0].make_env()                               # the FunctionToolEnv it was played on
"""
from __future__ import annotations

import inspect
import json
import random
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["TOOL_EPISODES_VERSION", "SPLITS", "SyntheticTool", "SyntheticEpisode", "synthetic_tool_episodes",
           "synthetic_tool"]

#: Bump when the generator's output changes (it is part of the cold start's key).
TOOL_EPISODES_VERSION = 1
SPLITS = ("train", "heldout")
_JSON_HINTS = {"string": str, "integer": int, "number": float, "boolean": bool}


def _part(items: list, split: str) -> list:
    """The items of ``split``: every fourth item (positions 3, 7, ...) is held out."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return [x for i, x in enumerate(items) if (i % 4 == 3) == (split == "heldout")]


@dataclass
class SyntheticTool:
    """One generated tool: its name, description, parameters ``[(name, type, description,
    enum or None, required)]`` (types are JSON-schema names), its body ``fn(**arguments)`` and
    its topic (two tools of one topic in a prompt would make the request ambiguous)."""

    name: str
    description: str
    params: list[tuple[str, str, str, tuple | None, bool]]
    fn: Callable[..., Any]
    topic: str = ""  # what it is about (a kind, a unit dimension, an operation): one tool per topic in a prompt

    def function(self) -> Callable[..., Any]:
        """A plain Python function with this name, docstring, signature and type hints: what a
        user gives ``FunctionToolEnv`` (its schema comes from ``function_schema``)."""
        body = self.fn

        def tool(**kwargs: Any) -> Any:
            return body(**kwargs)

        params, hints = [], {}
        for name, typ, _, enum, required in self.params:
            hint = typing.Literal[enum] if enum else _JSON_HINTS[typ]
            hints[name] = hint
            default = inspect.Parameter.empty if required else None
            params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                            annotation=hint))
        args = "\n".join(f"    {n}: {d}" for n, _, d, _, _ in self.params)
        tool.__name__ = tool.__qualname__ = self.name
        tool.__doc__ = f"{self.description}\n\nArgs:\n{args}\n" if args else self.description
        tool.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        tool.__annotations__ = hints
        return tool


@dataclass
class SyntheticEpisode:
    """A played episode: its tools (target(s) first, then distractors, in prompt order in
    ``order``), the task, the scripted assistant turns and the resulting conversation."""

    family: str
    tools: list[SyntheticTool]
    task: dict[str, Any]
    calls: list[dict[str, Any]]
    system_prompt: str | None = None
    conversation: list[dict[str, str]] = field(default_factory=list)

    def make_env(self, max_turns: int | None = None) -> Any:
        """The ``FunctionToolEnv`` this episode is played on (``max_turns``: calls + 1 by default)."""
        from rllib_spear.envs.function_tools import FunctionToolEnv

        return FunctionToolEnv(tools=[t.function() for t in self.tools], system_prompt=self.system_prompt,
                               max_turns=max_turns or len(self.calls) + 1)


# ---------------------------------------------------------------------------------------- words
_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "l", "m", "n", "p", "r", "s", "st", "t", "tr",
           "v", "w", "z", "th", "sh"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ia", "ou", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "th", "x", "m"]


def _word(rng: random.Random, syllables: tuple[int, int] = (2, 3)) -> str:
    n = rng.randint(*syllables)
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(n)) + rng.choice(_CODAS)


def _name(rng: random.Random) -> str:
    return _word(rng).capitalize()


# -------------------------------------------------------------------------------- record lookups
#: Entity kinds: (kind, its fields as (field, value maker: "name" | "word" | "int:<lo>:<hi>")).
_KINDS: list[tuple[str, list[tuple[str, str]]]] = [
    ("city", [("country", "name"), ("river", "name"), ("mayor", "name"), ("population", "int:1000:90000")]),
    ("planet", [("star", "name"), ("moons", "int:0:30"), ("discoverer", "name"), ("climate", "word")]),
    ("ship", [("captain", "name"), ("home_port", "name"), ("crew", "int:5:400"), ("launched", "int:1850:2020")]),
    ("book", [("author", "name"), ("publisher", "name"), ("pages", "int:80:900"), ("genre", "word")]),
    ("company", [("founder", "name"), ("headquarters", "name"), ("employees", "int:10:50000"), ("ceo", "name")]),
    ("mountain", [("range", "name"), ("height", "int:800:8800"), ("first_climber", "name"), ("country", "name")]),
    ("employee", [("department", "word"), ("manager", "name"), ("office", "name"), ("salary", "int:30000:200000")]),
    ("species", [("habitat", "word"), ("diet", "word"), ("lifespan", "int:1:120"), ("family", "name")]),
    ("team", [("coach", "name"), ("stadium", "name"), ("titles", "int:0:40"), ("city", "name")]),
    ("song", [("artist", "name"), ("album", "name"), ("year", "int:1950:2024"), ("duration", "int:90:600")]),
    ("island", [("ocean", "name"), ("area", "int:2:9000"), ("capital", "name"), ("ruler", "name")]),
    ("product", [("maker", "name"), ("price", "int:2:2000"), ("color", "word"), ("warehouse", "name")]),
    ("station", [("line", "name"), ("platforms", "int:1:24"), ("opened", "int:1860:2023"), ("district", "name")]),
    ("recipe", [("cuisine", "word"), ("chef", "name"), ("minutes", "int:5:240"), ("main_ingredient", "word")]),
    ("language", [("script", "name"), ("speakers", "int:500:900000"), ("region", "name"), ("family", "name")]),
    ("galaxy", [("cluster", "name"), ("star_count", "int:1:900"), ("observer", "name"), ("shape", "word")]),
]
#: Tool-name patterns of a lookup (``{k}``: the kind).
_LOOKUP_NAMES = ["lookup_{k}", "get_{k}_info", "{k}_facts", "fetch_{k}", "find_{k}", "describe_{k}",
                 "get_{k}", "{k}_details", "query_{k}", "{k}_lookup", "read_{k}_record", "{k}_info"]
_LOOKUP_DOCS = ["Facts about a {k}.", "Look up a {k} by its name.", "Return the record of a {k}.",
                "Get everything known about a {k}.", "Fetch the details of a {k} from the database.",
                "Information about one {k}.", "Find a {k} and return its attributes.",
                "Retrieve the stored facts of a {k}."]
#: Parameter names of a lookup's key, and their descriptions.
_KEY_PARAMS = [("name", "the {k}'s name"), ("{k}", "the {k}'s name"), ("{k}_name", "name of the {k}"),
               ("title", "the {k} to look up"), ("key", "which {k}"), ("query", "the {k} to find"),
               ("id", "the {k}'s identifier"), ("entity", "the name of the {k}")]
_FIELD_QUESTIONS = ["What is the {f} of {x}?", "What {f} does {x} have?", "Tell me the {f} of the {k} {x}.",
                    "{x}: what is its {f}?", "I need the {f} for the {k} called {x}.",
                    "Which {f} is listed for {x}?", "Look up {x} and give me its {f}.",
                    "Do you know the {f} of {x}?", "What's the {f} of the {k} {x}?",
                    "Find the {f} of {x}.", "Can you tell me {x}'s {f}?", "Give the {f} of {x}."]


def _value(rng: random.Random, maker: str) -> Any:
    if maker == "name":
        return _name(rng)
    if maker == "word":
        return _word(rng, (1, 2))
    _, lo, hi = maker.split(":")
    return rng.randint(int(lo), int(hi))


def _lookup_tool(rng: random.Random, split: str, kind: tuple[str, list] | None = None,
                 rows: int | None = None) -> tuple[SyntheticTool, dict[str, dict], str]:
    """A lookup tool over a table of ``rows`` fictional entities of one kind: (tool, table, kind)."""
    k, fields = kind or rng.choice(_part(_KINDS, split))
    table: dict[str, dict] = {}
    chosen = rng.sample(fields, rng.randint(2, len(fields)))
    for _ in range(rows or rng.randint(2, 5)):
        table[_name(rng)] = {f: _value(rng, m) for f, m in chosen}
    pname, pdoc = rng.choice(_part(_KEY_PARAMS, split))
    pname = pname.format(k=k)

    def body(**kw: Any) -> Any:
        return table[kw[pname]]  # an unknown key raises: an error observation, as a user's tool would

    name = rng.choice(_part(_LOOKUP_NAMES, split)).format(k=k)
    doc = rng.choice(_part(_LOOKUP_DOCS, split)).format(k=k)
    return SyntheticTool(name, doc, [(pname, "string", pdoc.format(k=k), None, True)], body, k), table, k


def _record_episode(rng: random.Random, split: str) -> tuple[list[SyntheticTool], dict, list[dict]]:
    tool, table, k = _lookup_tool(rng, split)
    x = rng.choice(sorted(table))
    f = rng.choice(sorted(table[x]))
    q = rng.choice(_part(_FIELD_QUESTIONS, split)).format(f=f.replace("_", " "), x=x, k=k)
    return [tool], {"question": q, "answer": str(table[x][f])}, [{"name": tool.name, "arguments": {tool.params[0][0]: x}}]


def _chained_episode(rng: random.Random, split: str) -> tuple[list[SyntheticTool], dict, list[dict]]:
    """Two lookups: a field of the first record is the key of the second."""
    kinds = rng.sample(_part(_KINDS, split), 2)
    second, table2, k2 = _lookup_tool(rng, split, kinds[1])
    first, table1, k1 = _lookup_tool(rng, split, kinds[0])
    link = f"{k2}"
    keys2 = sorted(table2)
    for row in table1.values():  # every first-kind record names a second-kind one
        row[link] = rng.choice(keys2)
    x = rng.choice(sorted(table1))
    y = table1[x][link]
    f = rng.choice(sorted(table2[y]))
    q = rng.choice(_part(_CHAIN_QUESTIONS, split)).format(f=f.replace("_", " "), x=x, k1=k1, k2=k2)
    calls = [{"name": first.name, "arguments": {first.params[0][0]: x}},
             {"name": second.name, "arguments": {second.params[0][0]: y}}]
    return [first, second], {"question": q, "answer": str(table2[y][f])}, calls


_CHAIN_QUESTIONS = ["What is the {f} of the {k2} of {x}?", "{x} has a {k2}. What is that {k2}'s {f}?",
                    "Find the {k2} of the {k1} {x}, then tell me its {f}.",
                    "Which {f} does the {k2} linked to {x} have?", "Look up {x}'s {k2} and give its {f}.",
                    "I need the {f} of the {k2} that belongs to {x}.", "For the {k1} {x}: what {f} has its {k2}?",
                    "Give me the {f} of {x}'s {k2}."]

# ------------------------------------------------------------------------------------ arithmetic
#: Operations: (tool names, descriptions, request phrasings with {a} {b}, fn, operand ranges).
_OPS: list[tuple[list[str], list[str], list[str], Callable[[int, int], int], tuple[int, int]]] = [
    (["add", "add_numbers", "sum_two", "plus", "calc_sum", "addition", "sum_values", "add_ints"],
     ["Add two numbers.", "Return the sum of a and b.", "Sum of two numbers.", "Add the second number to the first."],
     ["What is {a} plus {b}?", "Add {a} and {b}.", "What is {a} + {b}?", "Compute the sum of {a} and {b}.",
      "What do {a} and {b} add up to?", "Sum {a} and {b}.", "How much is {a} plus {b}?", "{a} + {b} = ?"],
     lambda a, b: a + b, (2, 999)),
    (["multiply", "times", "product_of", "mul", "multiply_numbers", "calc_product", "product", "mult"],
     ["Multiply two numbers.", "Return the product of a and b.", "Product of two numbers.",
      "Multiply the first number by the second."],
     ["What is {a} times {b}?", "Multiply {a} by {b}.", "What is {a} * {b}?", "Compute the product of {a} and {b}.",
      "What do you get when you multiply {a} and {b}?", "How much is {a} times {b}?", "{a} x {b} = ?",
      "What is {a} multiplied by {b}?"],
     lambda a, b: a * b, (2, 99)),
    (["subtract", "minus", "difference", "sub", "subtract_numbers", "calc_difference", "take_away", "diff"],
     ["Subtract b from a.", "Return a minus b.", "Difference of two numbers.", "Take the second number from the first."],
     ["What is {a} minus {b}?", "Subtract {b} from {a}.", "What is {a} - {b}?", "Compute {a} minus {b}.",
      "How much is {a} take away {b}?", "What is the difference {a} - {b}?", "{a} - {b} = ?",
      "What remains when {b} is subtracted from {a}?"],
     lambda a, b: a - b, (2, 999)),
    (["power", "pow", "raise_to_power", "exponent", "calc_power", "to_the_power", "exp_int", "ipow"],
     ["Raise a to the power b.", "Return a to the power of b.", "Exponentiation of two integers.",
      "Compute base a raised to exponent b."],
     ["What is {a} to the power of {b}?", "Raise {a} to the power {b}.", "What is {a}^{b}?", "Compute {a} ** {b}.",
      "What is {a} raised to {b}?", "How much is {a} to the {b}?", "{a}^{b} = ?", "Calculate {a} to the power {b}."],
     lambda a, b: a ** b, (2, 9)),
    (["modulo", "mod", "remainder", "calc_mod", "remainder_of", "modulus", "rem", "mod_int"],
     ["Remainder of a divided by b.", "Return a modulo b.", "The remainder after integer division.",
      "Compute a mod b."],
     ["What is {a} modulo {b}?", "What is the remainder of {a} divided by {b}?", "What is {a} mod {b}?",
      "Compute {a} % {b}.", "What is left over when {a} is divided by {b}?", "{a} mod {b} = ?",
      "Find the remainder of {a} / {b}.", "How much is {a} modulo {b}?"],
     lambda a, b: a % b, (2, 999)),
    (["maximum", "max_of", "larger", "bigger_number", "max_two", "greater_of", "pick_max", "max_value"],
     ["The larger of two numbers.", "Return the maximum of a and b.", "Pick the bigger number.",
      "Maximum of two integers."],
     ["Which is larger, {a} or {b}?", "What is the maximum of {a} and {b}?", "What is max({a}, {b})?",
      "Give the bigger of {a} and {b}.", "Which number is greater: {a} or {b}?", "max of {a} and {b}?",
      "Return the larger of {a} and {b}.", "Which is the maximum, {a} or {b}?"],
     lambda a, b: max(a, b), (2, 9999)),
]
_PAIR_PARAMS = [("a", "b"), ("x", "y"), ("first", "second"), ("left", "right"), ("num1", "num2"),
                ("value", "other"), ("m", "n"), ("lhs", "rhs")]
_PAIR_DOCS = [("the first number", "the second number"), ("first operand", "second operand"),
              ("a number", "another number"), ("left-hand value", "right-hand value")]


def _arithmetic_episode(rng: random.Random, split: str) -> tuple[list[SyntheticTool], dict, list[dict]]:
    names, docs, asks, op, (lo, hi) = rng.choice(_OPS)
    pa, pb = rng.choice(_part(_PAIR_PARAMS, split))
    da, db = rng.choice(_PAIR_DOCS)
    typ = rng.choice(["integer", "number"])
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)

    def body(**kw: Any) -> Any:
        return op(kw[pa], kw[pb])

    tool = SyntheticTool(rng.choice(_part(names, split)), rng.choice(docs),
                         [(pa, typ, da, None, True), (pb, typ, db, None, True)], body, names[0])
    q = rng.choice(_part(asks, split)).format(a=a, b=b)
    return [tool], {"question": q, "answer": str(op(a, b))}, [{"name": tool.name, "arguments": {pa: a, pb: b}}]


# ------------------------------------------------------------------------------ unit conversion
_UNITS: list[tuple[str, dict[str, float]]] = [
    ("length", {"meters": 1.0, "kilometers": 1000.0, "centimeters": 0.01, "feet": 0.3048}),
    ("mass", {"grams": 1.0, "kilograms": 1000.0, "pounds": 453.6, "ounces": 28.35}),
    ("time", {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}),
    ("volume", {"liters": 1.0, "milliliters": 0.001, "gallons": 3.785, "cups": 0.24}),
]
_CONVERT_NAMES = ["convert_{d}", "{d}_converter", "convert_units", "to_{d}_unit", "change_{d}_unit",
                  "{d}_convert", "unit_convert_{d}", "express_{d}"]
_CONVERT_ASKS = ["How many {to} are {v} {frm}?", "Convert {v} {frm} to {to}.", "What is {v} {frm} in {to}?",
                 "Express {v} {frm} in {to}.", "{v} {frm} is how many {to}?", "Turn {v} {frm} into {to}.",
                 "I have {v} {frm}; how much is that in {to}?", "What do {v} {frm} come to in {to}?"]


def _convert_episode(rng: random.Random, split: str) -> tuple[list[SyntheticTool], dict, list[dict]]:
    dim, units = rng.choice(_UNITS)
    frm, to = rng.sample(sorted(units), 2)
    v = rng.randint(1, 500)
    pv, pf, pt = rng.choice(_part([("value", "from_unit", "to_unit"), ("amount", "source", "target"),
                                   ("quantity", "unit_in", "unit_out"), ("number", "src_unit", "dst_unit"),
                                   ("x", "start_unit", "end_unit"), ("size", "current_unit", "wanted_unit"),
                                   ("val", "unit", "into"), ("measure", "have", "want")], split))
    enum = tuple(sorted(units))

    def body(**kw: Any) -> Any:
        return round(kw[pv] * units[kw[pf]] / units[kw[pt]], 2)

    tool = SyntheticTool(rng.choice(_part(_CONVERT_NAMES, split)).format(d=dim),
                         f"Convert a {dim} from one unit to another.",
                         [(pv, "number", f"the {dim} to convert", None, True),
                          (pf, "string", "the unit it is in", enum, True),
                          (pt, "string", "the unit to convert to", enum, True)], body, dim)
    q = rng.choice(_part(_CONVERT_ASKS, split)).format(v=v, frm=frm, to=to)
    return ([tool], {"question": q, "answer": str(body(**{pv: v, pf: frm, pt: to}))},
            [{"name": tool.name, "arguments": {pv: v, pf: frm, pt: to}}])


# ---------------------------------------------------------------------------- text and yes/no
#: Text operations: (tool names, description, requests with {w}, fn).
_TEXT_OPS: list[tuple[list[str], str, list[str], Callable[[str], Any]]] = [
    (["reverse_text", "reverse", "reverse_string", "flip_word", "backwards", "mirror_text", "rev", "invert_text"],
     "Reverse a piece of text.",
     ["Reverse the word {w}.", "What is {w} spelled backwards?", "Write {w} in reverse.", "Reverse '{w}'.",
      "Flip the letters of {w}.", "What does {w} look like reversed?", "Spell {w} backwards.", "{w} reversed?"],
     lambda w: w[::-1]),
    (["count_letters", "length", "string_length", "char_count", "len_text", "count_chars", "measure_text", "size_of"],
     "Count the characters of a text.",
     ["How many letters are in {w}?", "How long is the word {w}?", "Count the characters of '{w}'.",
      "What is the length of {w}?", "How many characters does {w} have?", "Length of {w}?",
      "Tell me how many letters {w} has.", "Count the letters in {w}."],
     lambda w: len(w)),
    (["uppercase", "to_upper", "shout", "capitalize_all", "upper", "make_uppercase", "caps", "all_caps"],
     "Convert a text to upper case.",
     ["Write {w} in capital letters.", "Uppercase the word {w}.", "What is {w} in upper case?",
      "Convert '{w}' to uppercase.", "Make {w} all caps.", "Shout {w}.", "{w} in caps?", "Capitalize every letter of {w}."],
     lambda w: w.upper()),
    (["count_vowels", "vowels_in", "vowel_count", "num_vowels", "how_many_vowels", "vowels", "tally_vowels", "vcount"],
     "Count the vowels (a, e, i, o, u) in a text.",
     ["How many vowels are in {w}?", "Count the vowels of '{w}'.", "Number of vowels in {w}?",
      "How many of the letters of {w} are vowels?", "Tell me the vowel count of {w}.", "Vowels in {w}?",
      "Count a, e, i, o and u in {w}.", "How many vowels does {w} contain?"],
     lambda w: sum(c in "aeiou" for c in w.lower())),
]
_TEXT_PARAMS = ["text", "word", "s", "string", "input", "value", "phrase", "term"]
_CHECKS: list[tuple[list[str], str, list[str], Callable[[int], bool]]] = [
    (["is_prime", "check_prime", "prime_test", "primality", "prime_check", "test_prime", "isprime", "prime"],
     "Whether a number is prime.",
     ["Is {n} a prime number?", "Is {n} prime?", "Check whether {n} is prime.", "Tell me if {n} is a prime.",
      "Is the number {n} prime?", "{n}: prime or not?", "Can {n} be prime?", "Is {n} a prime?"],
     lambda n: n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))),
    (["is_even", "check_even", "even_test", "parity_even", "even_check", "test_even", "iseven", "even"],
     "Whether a number is even.",
     ["Is {n} even?", "Is {n} an even number?", "Check whether {n} is even.", "Tell me if {n} is even.",
      "Is the number {n} even?", "{n}: even or not?", "Can {n} be divided by 2?", "Is {n} divisible by two?"],
     lambda n: n % 2 == 0),
]


def _text_episode(rng: random.Random, split: str) -> tuple[list[SyntheticTool], dict, list[dict]]:
    names, doc, asks, op = rng.choice(_TEXT_OPS)
    p = rng.choice(_part(_TEXT_PARAMS, split))
    w = _word(rng, (1, 3))

    def body(**kw: Any) -> Any:
        return op(kw[p])

    tool = SyntheticTool(rng.choice(_part(names, split)), doc, [(p, "string", "the text", None, True)], body,
                         names[0])
    q = rng.choice(_part(asks, split)).format(w=w)
    return [tool], {"question": q, "answer": str(op(w))}, [{"name": tool.name, "arguments": {p: w}}]


def _check_episode(rng: random.Random, split: str) -> tuple[list[SyntheticTool], dict, list[dict]]:
    names, doc, asks, op = rng.choice(_CHECKS)
    p = rng.choice(_part(["n", "number", "value", "x", "num", "integer", "k", "candidate"], split))
    n = rng.randint(2, 500)

    def body(**kw: Any) -> Any:
        return op(kw[p])

    tool = SyntheticTool(rng.choice(_part(names, split)), doc, [(p, "integer", "the number to check", None, True)],
                         body, names[0])
    q = rng.choice(_part(asks, split)).format(n=n)
    return [tool], {"question": q, "answer": "yes" if op(n) else "no"}, [{"name": tool.name, "arguments": {p: n}}]


#: Families and their weights in a draw.
_FAMILIES: dict[str, tuple[Callable[[random.Random, str], tuple], float]] = {
    "record": (_record_episode, 0.35),
    "arithmetic": (_arithmetic_episode, 0.2),
    "convert": (_convert_episode, 0.1),
    "text": (_text_episode, 0.1),
    "check": (_check_episode, 0.1),
    "chained": (_chained_episode, 0.15),
}
_DISTRACTORS = (_lookup_tool, _arithmetic_episode, _convert_episode, _text_episode, _check_episode)
_CUSTOM_PROMPTS = ["You are a careful assistant for a {d} service.", "You answer questions with the tools below.",
                   "You are an agent that solves the user's task step by step.", "Be brief and precise.",
                   "You help users of the {d} system.", "Answer with the tools; never guess."]


def synthetic_tool(rng: random.Random, split: str = "train") -> SyntheticTool:
    """One random tool of any family (a distractor in a prompt, or a tool to test a parser on)."""
    make = rng.choice(_DISTRACTORS)
    out = make(rng, split)
    return out[0] if isinstance(out[0], SyntheticTool) else out[0][0]


def _play(ep: SyntheticEpisode) -> list[dict[str, str]] | None:
    """The episode's conversation, played on its environment; None if the script does not
    score 1.0 (it then is not a demonstration)."""
    env = ep.make_env()
    messages = [dict(m) for m in env.reset(ep.task)]
    for call in ep.calls:
        text = "<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>"
        res = env.step(text)
        if res.done or res.observation is None or "Error:" in res.observation:
            return None
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": res.observation}]
    text = f"<answer>{ep.task['answer']}</answer>"
    res = env.step(text)
    if not res.done or res.reward != 1.0:
        return None
    return messages + [{"role": "assistant", "content": text}]


def synthetic_tool_episodes(n: int, seed: int = 0, split: str = "train", *, max_tools: int = 4,
                            families: dict[str, float] | None = None,
                            custom_prompt_rate: float = 0.25) -> list[SyntheticEpisode]:
    """``n`` played episodes (module docstring), deterministic for ``(seed, split)``.

    ``max_tools``: tools in a prompt (the episode's own plus random distractors of other
    families, shuffled); ``families``: weight per family (default: all, ``_FAMILIES``' weights);
    ``custom_prompt_rate``: the share of episodes whose environment has its own system prompt
    (``FunctionToolEnv(system_prompt=...)``: the prompt, then the tools block)."""
    if int(n) < 0 or int(max_tools) < 1:
        raise ValueError(f"synthetic_tool_episodes: n must be >= 0 and max_tools >= 1, got {n}, {max_tools}")
    weights = {k: w for k, (_, w) in _FAMILIES.items()} if families is None else dict(families)
    unknown = sorted(set(weights) - set(_FAMILIES))
    if unknown:
        raise ValueError(f"synthetic_tool_episodes: unknown families {unknown}; known: {sorted(_FAMILIES)}")
    _part([], split)  # checks the split name
    rng = random.Random(f"{seed}-{split}")
    names, probs = list(weights), [weights[k] for k in weights]
    out: list[SyntheticEpisode] = []
    while len(out) < n:
        family = rng.choices(names, probs)[0]
        tools, task, calls = _FAMILIES[family][0](rng, split)
        names_used, topics = {t.name for t in tools}, {t.topic for t in tools}
        for _ in range(rng.randint(0, max(0, max_tools - len(tools)))):
            extra = synthetic_tool(rng, split)
            if extra.name not in names_used and extra.topic not in topics:
                names_used.add(extra.name)
                topics.add(extra.topic)
                tools.append(extra)
        rng.shuffle(tools)
        prompt = None
        if rng.random() < custom_prompt_rate:
            prompt = rng.choice(_CUSTOM_PROMPTS).format(d=_word(rng, (1, 2)))
        ep = SyntheticEpisode(family, tools, task, calls, prompt)
        conv = _play(ep)
        if conv is not None:
            ep.conversation = conv
            out.append(ep)
    return out
