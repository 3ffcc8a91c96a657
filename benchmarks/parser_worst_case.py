"""Worst-case parse time per parser (issue "Part 9").

For every parser and several adversarial shapes (fences with long whitespace, unclosed tags, many
tags, huge query lists, deeply nested JSON, long unknown tool names), times one ``parse`` call at
10k / 50k / 200k characters (best of ``--repeat``) and prints a table; the ratio column is
t(200k) / t(10k) (20 for linear growth). ``--legacy`` adds the old backtracking fence regex at
small sizes for contrast (it is quadratic: do not run it at 200k).

    python benchmarks/parser_worst_case.py [--repeat 3] [--legacy]
"""
from __future__ import annotations

import argparse
import json
import re
import time

from rllib_spear.envs.parsers import (
    ActionParser, CodeParser, HermesParser, SearchR1Parser, SpaderParser, _strip_fence,
    check_think_format, extract_boxed,
)

SIZES = (10_000, 50_000, 200_000)
F = "`" * 3
CODE_TOOLS = {"code_interpreter": ("code_interpreter", "code")}


def rep(unit: str, n: int) -> str:
    return unit * max(1, n // len(unit))


def fit(prefix: str, body, suffix: str, n: int) -> str:
    """prefix + body(k) + suffix with the body sized so the whole is about n characters."""
    return prefix + body(max(1, n - len(prefix) - len(suffix))) + suffix


def qlist(k: int) -> str:
    return json.dumps([str(i) for i in range(max(1, k // 9))])


SHAPES = {
    "search_r1": (SearchR1Parser(), {
        "unclosed <search>": lambda n: fit("<search>", lambda k: "x" * k, "", n),
        "many <search>": lambda n: rep("<search>", n),
        "many pairs": lambda n: rep("<search>q</search>", n),
    }),
    "spader": (SpaderParser(), {
        "huge query list": lambda n: fit("<tool_call>", qlist, "</tool_call>", n),
        "nested JSON": lambda n: fit("<tool_call>", lambda k: "[" * (k // 2) + "]" * (k // 2), "</tool_call>", n),
        "many <tool_call>": lambda n: rep('<tool_call>["q"]</tool_call>', n),
    }),
    "hermes(search)": (HermesParser(), {
        "huge query_list": lambda n: fit('<tool_call>{"name": "search", "arguments": {"query_list": ', qlist,
                                         "}}</tool_call>", n),
        "long unknown name": lambda n: fit('<tool_call>{"name": "', lambda k: "n" * k, '"}</tool_call>', n),
        "nested JSON": lambda n: fit("<tool_call>", lambda k: '{"a":' * (k // 5) + "}" * (k // 5), "</tool_call>", n),
        "unclosed <tool_call>": lambda n: rep("<tool_call>", n),
    }),
    "hermes(code)": (HermesParser(CODE_TOOLS), {
        "fence + whitespace": lambda n: fit('<tool_call>{"name": "code_interpreter", "arguments": {"code": "' + F,
                                            lambda k: " " * k, 'x"}}</tool_call>', n),
        "many fences": lambda n: fit('<tool_call>{"name": "code_interpreter", "arguments": {"code": "',
                                     lambda k: rep(F + " \\t", k), '"}}</tool_call>', n),
    }),
    "code": (CodeParser(), {
        "fence + whitespace": lambda n: fit("<code>" + F, lambda k: " " * k, "x</code>", n),
        "fence python + ws": lambda n: fit("<code>" + F + "python", lambda k: " " * k, "x</code>", n),
        "bare fences": lambda n: rep(F + "python \t", n),
        "unclosed <code>": lambda n: fit("<code>", lambda k: " " * k, "", n),
        "many \\boxed{": lambda n: rep("\\boxed{", n),
    }),
    "action": (ActionParser(), {
        "unclosed <action>": lambda n: fit("<action>", lambda k: " " * k, "", n),
        "many <action>": lambda n: rep("<action>a</action>", n),
    }),
}
FUNCS = {
    "extract_boxed": (extract_boxed, {"\\boxed + spaces": lambda n: fit("\\boxed", lambda k: " " * k, "", n),
                                      "nested braces": lambda n: "\\boxed{" + "{" * (n // 2) + "}" * (n // 2)}),
    "check_think_format": (check_think_format, {"many <think>": lambda n: rep("<think></think>", n)}),
}
_LEGACY_FENCE = re.compile(r"```[ \t]*(?:python3|python|py)?[ \t]*\n")  # the pre-fix regex


def best(fn, text: str, repeat: int) -> float:
    out = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn(text)
        out = min(out, time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--legacy", action="store_true")
    args = ap.parse_args()
    rows = []
    for pname, (parser, shapes) in SHAPES.items():
        for sname, make in shapes.items():
            rows.append((pname, sname, [best(parser.parse, make(n), args.repeat) for n in SIZES]))
    for fname, (fn, shapes) in FUNCS.items():
        for sname, make in shapes.items():
            rows.append((fname, sname, [best(fn, make(n), args.repeat) for n in SIZES]))
    rows.append(("_strip_fence", "fence + whitespace",
                 [best(_strip_fence, F + " " * n + "x", args.repeat) for n in SIZES]))
    head = f"| parser | shape | {' | '.join(f'{n // 1000}k ms' for n in SIZES)} | 200k/10k |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for p, s, ts in rows:
        ratio = ts[-1] / ts[0] if ts[0] > 0 else float("nan")
        print(f"| {p} | {s} | {' | '.join(f'{t * 1e3:.3f}' for t in ts)} | {ratio:.1f} |")
    print(f"\nworst per call at 200k: {max(r[2][-1] for r in rows) * 1e3:.1f} ms")
    if args.legacy:
        print("\nlegacy fence regex (pre-fix), three backticks + n spaces + x, one search:")
        print("| n | ms |\n|---|---|")
        for n in (2_500, 5_000, 10_000):
            print(f"| {n} | {best(lambda s: _LEGACY_FENCE.search(s), F + ' ' * n + 'x', 1) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
